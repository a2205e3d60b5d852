"""scripts/hf_hub.py against a loopback Hub: listings, verified and resumed downloads, the token.

The Hub's real behaviours it relies on are served by tests/support/assets.py's FakeHub: the
listing with LFS sha256s and git blob ids, 302 redirects of LFS files to another host, Range
requests, and the X-Error-Code of each refusal.
"""

from __future__ import annotations

import hashlib

import pytest
from support.assets import CKPT_REV, DATA_REV, OTHER_REV, Repo
from support.node_scripts import load_script

hf = load_script("hf_hub")


def test_listing_gives_the_commit_sizes_and_hashes(hub):
    info = hf.repo_info("test-org/tiny-model", "main", "model")
    assert info.commit == CKPT_REV
    by_path = {f.path: f for f in info.files}
    shard = by_path["model-00001-of-00002.safetensors"]
    assert shard.sha256 and shard.size == 300_000
    assert by_path["config.json"].sha256 is None and len(by_path["config.json"].blob_id) == 40
    data = hf.repo_info("test-org/tiny-sft", DATA_REV, "dataset")
    assert [f.path for f in data.select(["*.parquet"])] == [
        "data/train-00000-of-00002.parquet",
        "data/train-00001-of-00002.parquet",
    ]


@pytest.mark.parametrize(
    "repo, revision, kind",
    [
        ("test-org/tiny-model", "f" * 40, "revision-not-found"),
        ("test-org/no-such-model", CKPT_REV, "repo-not-found"),
    ],
)
def test_refusals_are_named(hub, repo, revision, kind):
    with pytest.raises(hf.HubError) as err:
        hf.repo_info(repo, revision, "model")
    assert err.value.kind == kind


def test_an_unreachable_endpoint_is_a_network_error(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(hf.HubError) as err:
        hf.repo_info("a/b", CKPT_REV)
    assert err.value.kind == "network" and "unreachable" in str(err.value)


def test_downloads_are_verified_and_the_token_stays_off_the_cdn(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_SECRET")
    info = hf.repo_info("test-org/tiny-model", CKPT_REV, "model", "hf_SECRET")
    for remote in info.files:
        hf.download(info, remote, tmp_path / remote.path, "hf_SECRET")
        assert hf.verify_remote(tmp_path / remote.path, remote) is None
    cdn = [r for r in hub.requests if r.server == "cdn"]
    assert len(cdn) == 2 and all(r.auth is None for r in cdn)  # redirected LFS shards, no token
    assert all(r.auth == "Bearer hf_SECRET" for r in hub.requests if r.server == "hub")


def test_a_cut_connection_resumes_with_a_range_request(hub, tmp_path):
    hub.cut_once["model-00001-of-00002.safetensors"] = 100_000
    info = hf.repo_info("test-org/tiny-model", CKPT_REV, "model")
    remote = next(f for f in info.files if f.path == "model-00001-of-00002.safetensors")
    hf.download(info, remote, tmp_path / remote.path)
    assert hashlib.sha256((tmp_path / remote.path).read_bytes()).hexdigest() == remote.sha256
    ranges = [r.range for r in hub.requests if r.server == "cdn"]
    assert ranges == [None, "bytes=100000-"]
    assert not (tmp_path / (remote.path + ".partial")).exists()


def test_bytes_that_differ_from_the_listing_are_refused(hub, tmp_path):
    info = hf.repo_info("test-org/tiny-model", CKPT_REV, "model")
    remote = next(f for f in info.files if f.path == "config.json")
    remote.blob_id = "0" * 40  # what a corrupted transfer looks like to the check
    with pytest.raises(hf.HubError) as err:
        hf.download(info, remote, tmp_path / "config.json")
    assert err.value.kind == "mismatch" and not (tmp_path / "config.json").exists()


def test_gated_repo_needs_a_granted_token(hub, monkeypatch):
    hub.add(Repo("model", "test-org/gated", {OTHER_REV: {"config.json": b"{}"}}, gated="manual"))
    hub.tokens.add("hf_GOOD")
    info = hf.repo_info("test-org/gated", OTHER_REV, "model")
    assert info.gated == "manual"  # the listing is public; the files are not
    with pytest.raises(hf.HubError, match="set HF_TOKEN") as err:
        hf.check_access(info, "config.json", None)
    assert err.value.kind == "gated"
    with pytest.raises(hf.HubError, match="not been granted access") as err:
        hf.check_access(info, "config.json", "hf_BAD")
    assert "hf_BAD" not in str(err.value)
    hf.check_access(info, "config.json", "hf_GOOD")


def test_a_passing_server_error_is_retried(hub, tmp_path, monkeypatch):
    info = hf.repo_info("test-org/tiny-model", CKPT_REV, "model")
    remote = next(f for f in info.files if f.path == "config.json")
    calls = []
    real = hf._fetch_into

    def flaky(*args, **kw):
        calls.append(1)
        if len(calls) == 1:
            import urllib.error

            raise urllib.error.HTTPError("u", 503, "busy", {}, None)
        return real(*args, **kw)

    monkeypatch.setattr(hf, "_fetch_into", flaky)
    hf.download(info, remote, tmp_path / "config.json")
    assert len(calls) == 2 and (tmp_path / "config.json").read_bytes() == b'{"model_type": "tiny"}'
