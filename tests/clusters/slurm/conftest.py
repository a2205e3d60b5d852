"""The slurm tests' shared fixture (the cluster itself is the session's: tests/conftest.py)."""

from __future__ import annotations

import pytest
from support.multinode import Netns
from support.sshd import SshServer


@pytest.fixture(scope="module")
def netns(test_image, container_run_args):
    """One loopback-only network namespace for every node's containers: Ray's head on n1's
    address (127.0.0.2), its worker on n2's (127.0.0.3), as the job's NodeAddr says."""
    holder = Netns(test_image.ref, container_run_args).start()
    yield holder
    holder.stop()


@pytest.fixture(scope="module")
def login(slurm, tmp_path_factory):
    """The login node over SSH: a real sshd on 127.0.0.1 whose sessions find the cluster."""
    server = SshServer(
        tmp_path_factory.mktemp("login"),
        env={**slurm.env, "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"},
    ).start()
    yield server
    server.stop()
