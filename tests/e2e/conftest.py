"""Fixtures of the end-to-end tests: a node (a real sshd) whose sessions carry the environment a
DLAMI host gives (the loopback Hub, moto S3, the aws CLI), shared by the asset runs and the
hostile-container runs."""

from __future__ import annotations

import pytest
from support.assets import aws_cli
from support.sshd import SshServer

from launcher.plan.asset_stages import TEST_ENCODER_ENV


@pytest.fixture
def node_env(tmp_path, monkeypatch, hub, moto_s3_server):
    """The environment of the node's SSH sessions, and the launcher's test encoder."""
    aws = aws_cli()
    bin_dir = tmp_path / "node-bin"  # the aws CLI, and no python3 with boto3 ahead of the system's
    bin_dir.mkdir()
    (bin_dir / "aws").symlink_to(aws)
    monkeypatch.setenv(TEST_ENCODER_ENV, "builtin:whitespace-test")
    monkeypatch.setenv("HF_TOKEN", "hf_canary")  # the launcher's; it reaches host commands only
    return {
        "HF_ENDPOINT": hub.url,
        "AWS_ENDPOINT_URL": moto_s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "REPRODUCE_RETRY_BASE_S": "0",
        "REPRODUCE_S3_CLIENT": "aws-cli",  # the DLAMI host's client (its python3 has no boto3)
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
    }


@pytest.fixture
def node(tmp_path, node_env):
    """An sshd whose sessions carry node_env (what the node's host environment gives)."""
    server = SshServer(tmp_path / "sshd", env=node_env)
    server.start()
    yield server
    server.stop()
