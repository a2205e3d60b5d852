"""The end-to-end runs again with the launcher's side of the machine kept busy on purpose (issue
22): same verdicts, and not a log byte lost or doubled between the node and the run directory.

A busy launcher machine (CI beside other jobs; a laptop compiling) must change nothing in the
evidence: the follower reads late, reads return short and in bursts, signals land whenever the
process next runs. One representative end-to-end test per target (this host with docker, SSH, AWS
on moto, four nodes over an SSH host list) runs here, one after the other in one pytest process of
their own (all at once, eight Ray nodes starting together on two busy cores miss Ray's fixed 30 s
start-up wait), inside a CPU cgroup that holds that process and everything it starts (the CLI,
sshd and the node scripts it runs, moto) to 30% of one core (tests/support/cpu_limit.py): the
kernel stops the tree for most of every 100 ms period, while the node's containers, in dockerd's
own cgroups, write at full speed. Spinners did this before, at the price of a core the suite's
other worker lost too (docs/testing.md, "The load test"); where no cgroup can be made, one core
spins again. Each run keeps its own assertions, as on an idle machine: its verdict, and
`assert_log_collected` (logs/node.log equals every node's node.log byte for byte); and, held by
a cgroup, the test asserts that the kernel did stop the tree. With this test in a session, the
four run here only (tests/conftest.py deselects them from the session: a second, idle run of a
whole end-to-end test adds CPU, not evidence).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from support.cpu_limit import CpuLimit, cgroup_error, cpu_limited, spinning
from support.helpers import REPO

pytestmark = [pytest.mark.load, pytest.mark.docker, pytest.mark.ssh, pytest.mark.aws]
LAUNCHER_CORES = 0.3  # the launcher's side of the machine: 30% of one core
RUNS_MAX_S = 600  # the four runs, one after the other, under load
PER_RUN_S = 300  # pytest-timeout of each: a run that hangs dumps its stack
RUNS = {  # one end-to-end run per target, in this order
    "local": "tests/e2e/test_docker_exec.py::test_pull_by_digest_then_ray_and_standin_miles_then_measure",
    "ssh": "tests/e2e/test_exec_e2e.py::test_reproduce_recipe_over_ssh_end_to_end",
    "aws on moto": "tests/e2e/test_aws_e2e.py::test_reproduce_on_aws_end_to_end",
    "4 nodes": (
        "tests/e2e/test_multinode_ssh.py::test_a_four_node_recipe_runs_on_an_ssh_host_list_to_a_verdict"
    ),
}


def _end(proc: subprocess.Popen) -> None:
    """End a process group this test started (its own session), TERM then KILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture
def busy() -> Iterator[CpuLimit | None]:
    """The cgroup the runs go into (tests/support/cpu_limit.py); where none can be made, None,
    and one core kept spinning instead (said on the test's output)."""
    why = cgroup_error()
    if why is None:
        with cpu_limited(LAUNCHER_CORES) as limit:
            yield limit
        return
    print(f"load test: {why}; one core kept spinning instead", file=sys.stderr)
    with spinning():
        yield None


@pytest.mark.multinode
@pytest.mark.timeout(RUNS_MAX_S + 60)
def test_the_end_to_end_runs_keep_their_verdicts_and_every_log_byte_under_load(busy, tmp_path):
    log = tmp_path / "runs.log"
    with log.open("wb") as out:
        runs = subprocess.Popen(
            [
                *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *RUNS.values()),
                f"--timeout={PER_RUN_S}",  # a run that hangs says where (its stack)
            ],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=busy.join if busy else None,  # before pytest starts: all it starts too
        )
        try:
            code = runs.wait(RUNS_MAX_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _end(runs)
    assert code == 0, f"under load (exit {code}):\n{log.read_text()[-12000:]}"
    if busy is not None:  # the load was real: the kernel stopped the runs' processes, often
        periods, stopped_s = busy.throttled()
        assert periods >= 100 and stopped_s >= 10, (periods, stopped_s)
