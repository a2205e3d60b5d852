"""Sessions share one botocore data loader per process (launcher/clusters/aws/session.py,
`new_session`): each keeps its own region, credentials and endpoint, and what is shared stays
the size of one session's, however many are made."""

from __future__ import annotations

import pytest
from support.aws import set_fake_env

from launcher.clusters.aws.session import make_session, new_session
from launcher.errors import BadInput


def test_many_sessions_keep_their_own_settings_and_share_one_parsed_model(monkeypatch):
    set_fake_env(monkeypatch)
    first = new_session("us-east-1")
    loader = first._session.get_component("data_loader")
    paths = list(loader.search_paths)
    model = loader.load_service_model("ec2", "service-2")
    for region in ["eu-west-1", "ap-northeast-1"] * 20:
        other = new_session(region)
        assert other.region_name == region
        assert other.client("ec2").meta.region_name == region
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")  # read per session, not shared
    assert new_session("us-west-2").client("ec2").meta.endpoint_url == "http://127.0.0.1:1"
    shared = new_session(None)._session.get_component("data_loader")
    assert shared is loader and shared.load_service_model("ec2", "service-2") is model
    assert shared.search_paths == paths  # boto3 adds its folder per session: it stays once


def test_a_made_session_still_refuses_what_it_refused(monkeypatch):
    set_fake_env(monkeypatch)
    assert make_session("eu-central-1").region_name == "eu-central-1"
    with pytest.raises(BadInput, match="unknown AWS region 'us-east-7'"):
        make_session("us-east-7")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(BadInput, match="no AWS credentials found"):
        make_session("us-east-1")
