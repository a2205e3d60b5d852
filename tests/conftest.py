"""Session fixtures with real parts, shared by every area's tests (tests/support/ holds the code).

- `sshd`: an OpenSSH server on 127.0.0.1:<free port> with generated host and user keys.
- `docker_available`, `registry`, `test_image`: a real dockerd, a real docker-registry on
  127.0.0.1:<free port>, and a tiny image (stand-in miles at /root/miles) pushed there by digest.
  Docker missing is a FAILURE, not a skip, unless REPRODUCE_TEST_NO_DOCKER=1 is set explicitly.
- `container_run_args`: docker run options lending the container this host's /usr and venv.
- `reproduce_home` (autouse): every test its own $REPRODUCE_HOME (the user's run index).
Nothing here connects to any address but loopback.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.docker import Registry, TestImage, dockerd_running, push_test_image, run_args
from support.slurm_cluster import SlurmLoop, have_slurm
from support.sshd import SshServer

# Fixture modules every folder's tests may ask for (AWS on moto, the loopback Hub and S3): registered
# once here, so no test file imports a fixture by name.
pytest_plugins = ["support.aws", "support.assets"]

# The order files are handed out in (tests/run.sh keeps it: `--no-loadscope-reorder`): pytest-xdist's
# own (the files with most tests first, whole files per worker), except for two kinds of file that
# are one long serial chain on one worker and go first: the load test (one test of 120-180 s,
# which xdist's order put last: the other workers then sat idle for up to 120 s at the end), then
# a file whose tests share one Ray cluster of their own (marker `ray`: about 300 s, mostly waiting
# on Ray; handed out mid-way it was the last to end, 425-729 s into a run of 894 s). Ordering every
# slow file first was measured slower (the end-to-end files then contend at the start). The order
# is by what a file's tests need and how many there are, never by name (docs/testing.md).


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _run_under_load_only(config, items)
    count: dict[str, int] = {}
    load: set[str] = set()
    own_ray: set[str] = set()
    for item in items:
        path = item.nodeid.split("::")[0]
        count[path] = count.get(path, 0) + 1
        if item.get_closest_marker("load") is not None:
            load.add(path)
        if item.get_closest_marker("ray") is not None:
            own_ray.add(path)

    def rank(item: pytest.Item) -> tuple[bool, bool, int]:
        path = item.nodeid.split("::")[0]
        return path not in load, path not in own_ray, -count[path]

    items.sort(key=rank)  # stable: a file's tests stay together and in their order


def _run_under_load_only(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The end-to-end runs the load test runs (its module's RUNS) run there alone when it is in
    this session: each is a whole end-to-end run with its own assertions, and running it a second
    time on an idle machine proves nothing the loaded run does not (the load is the harder case;
    docs/testing.md, "The load test"). Deselected, not skipped: pytest's summary counts them, and
    a failure of any of them fails the load test, naming it. Run alone (the file, or `-m 'not
    load'`), each runs as before."""
    again: set[str] = set()
    for item in items:
        if item.get_closest_marker("load") is not None:
            again.update(getattr(getattr(item, "module", None), "RUNS", {}).values())
    if not again:
        return
    config.hook.pytest_deselected(items=[i for i in items if i.nodeid in again])
    items[:] = [i for i in items if i.nodeid not in again]


_TIMELINE = os.environ.get("REPRODUCE_TEST_TIMELINE")  # a folder: when each test ran, per worker


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """With REPRODUCE_TEST_TIMELINE=DIR, the process that runs a test (an xdist worker, or pytest
    alone) appends `start end nodeid` to DIR/<worker>.tsv: what ran beside what, and how long a
    worker sat idle at the end of a run (docs/testing.md); --durations says how long, not when."""
    began = time.time()
    yield
    if _TIMELINE:
        # an xdist worker by its name; pytest alone (the load test's own, say) by its pid
        worker = getattr(item.config, "workerinput", {}).get("workerid") or f"pid{os.getpid()}"
        folder = Path(_TIMELINE)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{worker}.tsv", "a") as fh:
            fh.write(f"{began:.2f}\t{time.time():.2f}\t{item.nodeid}\n")


@pytest.fixture(autouse=True)
def terminal_signals() -> None:
    """Every test starts with the signal dispositions a terminal gives a command (Ctrl-C raises
    KeyboardInterrupt, TERM and HUP end the process): whatever an earlier test in the same
    worker left (an ignored SIGINT stays ignored by the runner, and by every CLI a test starts,
    on purpose: launcher/runner/signals.py) never decides whether this one's Ctrl-C is heard."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def reproduce_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test gets its own $REPRODUCE_HOME (the user's run index, AWS keys and launch
    records): no test ever writes to the real ~/.local/state, and no test sees another's runs.
    Subprocesses inherit it through os.environ."""
    home = tmp_path_factory.mktemp("reproduce-home")
    monkeypatch.setenv("REPRODUCE_HOME", str(home))
    monkeypatch.delenv("REPRODUCE_STATE_DIR", raising=False)
    return home


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory):
    server = SshServer(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmLoop]:
    """The loopback Slurm cluster, started once per session; SLURM_CONF names it to every
    Slurm command the launcher (and its CLI subprocesses) run."""
    if not have_slurm():
        pytest.fail(
            "Slurm is not installed (tests/run.sh installs slurmctld slurmd slurm-client munge)"
        )
    cluster = SlurmLoop(tmp_path_factory.mktemp("slurm")).start()
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    cluster.stop()
    if before is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = before


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
