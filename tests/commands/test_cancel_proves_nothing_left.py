"""`reproduce cancel` says "nothing was left" only when the record proves it: every state a run
can be stopped in x what its run.json holds (no cluster, a cluster but no node). A run that
never started acquiring is cancelled; one that reached acquiring without a cluster record is
refused (exit 2, the record named, its state left as it was), since what it acquired cannot be
found from it; one with a cluster but no node is released by its backend, which ends what the
acquire made (on the loopback Slurm: the job whose id sbatch never answered, found by the run's
own job name, and only it).
"""

from __future__ import annotations

import getpass
import uuid
from pathlib import Path

import pytest
from support.cli import completed_here

from launcher.records.rundir import RunDir

LIVE_STATES = ("created", "acquiring", "staging", "running", "collecting", "detached")
UNPROVEN = ("acquiring", "staging", "running", "collecting", "detached", None)  # None: no status


def _run_dir(tmp_path: Path, state: str | None, cluster: dict | None) -> RunDir:
    rd = RunDir.create(tmp_path / "runs", "test/cancel", f"c-{uuid.uuid4().hex[:8]}")
    if cluster is not None:
        rd.update_record(run_id=rd.run_id, cluster=cluster)
    if state is None:
        (rd.path / "status.json").unlink()
    else:
        rd.set_status(state)
    return rd


def _sbatch(slurm, name: str, tmp_path: Path) -> None:
    slurm.run(
        "sbatch", f"--job-name={name}", f"--output={tmp_path}/%j.out", "--wrap", "sleep 300",
        check=True,
    )  # fmt: skip


def _lost_id(rd: RunDir, name: str) -> None:
    """The run's record as a launch stopped between sbatch and its answer leaves it."""
    rd.update_record(
        run_id=rd.run_id,
        cluster={
            "kind": "slurm", "login": None, "job_id": None, "user": getpass.getuser(),
            "nodes": 1, "job_nodes": [], "started_at": None, "job_name": name,
        },
    )  # fmt: skip


def _state(rd: RunDir) -> str:
    return str(rd.status().get("state"))


@pytest.mark.parametrize("state", UNPROVEN)
def test_a_run_past_created_without_a_cluster_record_is_refused(tmp_path, state):
    rd = _run_dir(tmp_path, state, None)
    before = _state(rd)
    got = completed_here("cancel", str(rd.path))
    assert got.returncode == 2, got.stdout + got.stderr
    assert str(rd.path / "run.json") in got.stderr and "nothing was ended" in got.stderr
    assert "Traceback" not in got.stderr
    assert _state(rd) == before  # not "cancelled": nothing proves it ended


def test_a_run_that_never_started_acquiring_is_cancelled(tmp_path):
    rd = _run_dir(tmp_path, "created", None)
    got = completed_here("cancel", str(rd.path))
    assert got.returncode == 0, got.stdout + got.stderr
    assert _state(rd) == "cancelled"


@pytest.mark.parametrize("state", LIVE_STATES)
def test_a_run_with_a_cluster_but_no_node_is_released(tmp_path, state):
    rd = _run_dir(tmp_path, state, {"kind": "local"})
    got = completed_here("cancel", str(rd.path))
    assert got.returncode == 0, got.stdout + got.stderr
    assert "released what run" in got.stdout + got.stderr
    assert _state(rd) == "cancelled"


@pytest.mark.parametrize("field", ["job_name", "user", "nodes"])
def test_a_slurm_record_without_what_finds_its_job_ends_nothing_and_says_so(tmp_path, field):
    record = {
        "kind": "slurm", "login": None, "job_id": None, "user": getpass.getuser(), "nodes": 1,
        "job_nodes": [], "started_at": None, "job_name": "reproduce-x",
    }  # fmt: skip
    del record[field]
    rd = _run_dir(tmp_path, "acquiring", record)
    got = completed_here("cancel", str(rd.path))
    assert got.returncode == 2 and f"cluster.{field}" in got.stderr, got.stdout + got.stderr
    assert _state(rd) == "acquiring"


@pytest.mark.slurm
def test_a_job_whose_id_sbatch_never_answered_is_ended_by_its_name(slurm, tmp_path):
    rd = _run_dir(tmp_path, "acquiring", None)
    name = f"reproduce-{rd.run_id}"
    other = f"reproduce-other-{uuid.uuid4().hex[:6]}"
    for job in (name, other):
        _sbatch(slurm, job, tmp_path)
    assert name in slurm.squeue() and other in slurm.squeue()
    _lost_id(rd, name)
    try:
        got = completed_here("cancel", str(rd.path))
        assert got.returncode == 0, got.stdout + got.stderr
        slurm.wait(lambda: name not in slurm.squeue(), "the run's job to end", 60)
        assert other in slurm.squeue()  # another job, its name one word longer, untouched
        assert _state(rd) == "cancelled"
    finally:
        slurm.run("scancel", f"--name={other}")
        slurm.run("scancel", f"--name={name}")


@pytest.mark.slurm
def test_two_jobs_of_the_runs_name_are_not_taken_for_none(slurm, tmp_path):
    rd = _run_dir(tmp_path, "acquiring", None)
    name = f"reproduce-{rd.run_id}"
    for _ in range(2):
        _sbatch(slurm, name, tmp_path)
    _lost_id(rd, name)
    try:
        got = completed_here("cancel", str(rd.path))
        assert got.returncode == 3, got.stdout + got.stderr
        assert "2 jobs are named" in got.stderr
        assert slurm.squeue().count(name) == 2  # none ended by a guess
        assert _state(rd) == "acquiring"
    finally:
        slurm.run("scancel", f"--name={name}")
