"""Session fixtures with real parts, shared by every area's tests (tests/support/ holds the code).

- `sshd`: an OpenSSH server on 127.0.0.1:<free port> with generated host and user keys.
- `docker_available`, `registry`, `test_image`: a real dockerd, a real docker-registry on
  127.0.0.1:<free port>, and a tiny image (stand-in miles at /root/miles) pushed there by digest.
  Docker missing is a FAILURE, not a skip, unless REPRODUCE_TEST_NO_DOCKER=1 is set explicitly.
- `container_run_args`: docker run options lending the container this host's /usr and venv.
Nothing here connects to any address but loopback.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.docker import Registry, TestImage, dockerd_running, push_test_image, run_args
from support.sshd import SshServer

# Fixture modules every folder's tests may ask for (AWS on moto, the loopback Hub and S3): registered
# once here, so no test file imports a fixture by name.
pytest_plugins = ["support.aws", "support.assets"]


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory):
    server = SshServer(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def docker_available() -> bool:
    if dockerd_running():
        return True
    if os.environ.get("REPRODUCE_TEST_NO_DOCKER") == "1":
        pytest.skip("REPRODUCE_TEST_NO_DOCKER=1: docker tests skipped on request")
    pytest.fail(
        "dockerd is not running (tests/run.sh starts it); set REPRODUCE_TEST_NO_DOCKER=1 to skip docker tests"
    )


@pytest.fixture(scope="session")
def registry(docker_available: bool, tmp_path_factory: pytest.TempPathFactory):
    reg = Registry(tmp_path_factory.mktemp("registry")).start()
    yield reg
    reg.stop()


@pytest.fixture(scope="session")
def test_image(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> TestImage:
    return push_test_image(registry, tmp_path_factory.mktemp("image"))


@pytest.fixture(scope="session")
def container_run_args() -> list[str]:
    return run_args()


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    return root
