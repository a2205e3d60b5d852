"""The slurm backend's job, against the loopback cluster where Slurm can show it and against
scontrol's own words where it cannot within a test's time (a TIMEOUT takes a minute, preemption a
policy): which ending of a job is the scheduler's (no verdict) and which the run's; a job whose id
never came back is still found and ended, by its name and user only; a job of someone else's
name is never touched."""

from __future__ import annotations

import getpass

import pytest
from support.slurm_cluster import SlurmLoop

from launcher import clusters
from launcher.clusters.base import CommandResult
from launcher.clusters.slurm.cluster import ALIVE, INFRA, SlurmCluster, run_seconds

pytestmark = [pytest.mark.slurm]

ENDED_BY_THE_RUN = ("COMPLETED", "FAILED", "CANCELLED", "CANCELLED by 0")


class Words:
    """A login node whose squeue knows nothing and whose scontrol says `line` (what a job that
    the test cannot make Slurm produce in time looks like)."""

    def __init__(self, line: str) -> None:
        self.line = line

    def __call__(self, command: str, timeout_s: float = 60) -> CommandResult:
        if command.startswith("squeue"):
            return CommandResult(0, "", "")
        if command.startswith("scontrol show job"):
            return CommandResult(0, self.line, "")
        if command.startswith("scontrol show hostnames"):
            return CommandResult(0, "n1\nn2\n", "")
        if command.startswith("sinfo"):
            return CommandResult(0, "n1|idle|none\nn2|down*|Not responding\n", "")
        return CommandResult(1, "", "not here")


def _said(line: str) -> str | None:
    cluster = SlurmCluster(None, job_id="7", nodes=2)
    cluster._run = Words(line)  # type: ignore[method-assign]  # noqa: SLF001 - the seam under test
    cluster.settle_s = 0.6  # a COMPLETING job that stays so: asked again, then read as it is
    return cluster.job_failure(now=True)


@pytest.mark.parametrize("state", sorted(INFRA | ALIVE - {"COMPLETING"} | set(ENDED_BY_THE_RUN)))
def test_only_the_schedulers_own_endings_void_the_run(state: str) -> None:
    said = _said(f"JobId=7 JobState={state} Reason=None Restarts=0 NodeList=n[1-2]")
    word = state.split()[0]
    if word in INFRA:
        assert said is not None and f"ended {word}" in said and "infrastructure" in said
        assert "job-node-1 = n2 is down*" in said  # the failed node, by rank and name
    else:
        assert said is None, (state, said)


def test_a_job_completing_because_a_node_went_down_is_a_node_failure() -> None:
    said = _said("JobId=7 JobState=COMPLETING Reason=NodeDown Restarts=0 NodeList=n1")
    assert said is not None and "NODE_FAIL" in said and "n2" in said
    assert _said("JobId=7 JobState=COMPLETING Reason=None Restarts=0 NodeList=n1") is None


def test_any_restart_is_two_attempts() -> None:
    for state in ("PENDING", "RUNNING", "COMPLETED"):
        said = _said(f"JobId=7 JobState={state} Reason=BeginTime Restarts=1 NodeList=n1")
        assert said is not None and "requeued" in said and "two attempts" in said


def test_run_seconds() -> None:
    assert run_seconds("00:00:26") == 26
    assert run_seconds("1-02:03:04") == 86400 + 7384
    assert run_seconds("05:06") == 306
    assert run_seconds("INVALID") is None and run_seconds("x-01:00:00") is None


def test_a_job_whose_id_never_came_back_is_found_by_its_name_and_ended(slurm: SlurmLoop) -> None:
    name = "reproduce-lost-answer-1"
    ours = slurm.run(
        "sbatch", "--parsable", f"--job-name={name}", "-o", "/dev/null", "--wrap", "sleep 300",
        check=True,
    ).stdout.strip()  # fmt: skip
    other = slurm.run(
        "sbatch", "--parsable", "--job-name=reproduce-lost-answer-10", "-o", "/dev/null",
        "--wrap", "sleep 300", check=True,
    ).stdout.strip()  # fmt: skip
    try:
        cluster = clusters.from_record(  # as a launch stopped before sbatch's answer records it
            {
                "kind": "slurm", "login": None, "job_id": None, "user": getpass.getuser(),
                "nodes": 1, "job_nodes": [], "started_at": None, "job_name": name,
            }
        )  # fmt: skip
        assert isinstance(cluster, SlurmCluster)
        assert cluster.cancel_job(60) == ""
        assert cluster.job_id == ours
        assert ours not in slurm.run("squeue", "-h", "-o", "%i").stdout.split()
        assert other in slurm.run("squeue", "-h", "-o", "%i").stdout.split()  # not its name
    finally:
        slurm.run("scancel", ours, other)
