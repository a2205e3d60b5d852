"""Ending a run on the loopback Slurm cluster (tests/support/slurm_cluster.py) through the CLI,
each mid-run with the stand-in miles training in the test image: Ctrl-C and `reproduce cancel`
(nothing left in squeue, no container, another job untouched), a detach then `status`, `logs` and
`attach` to the verdict, a requeue (refused as two attempts). A node lost mid-run is in
test_slurm_e2e.py, beside the 2-node run it shares a network namespace with."""

from __future__ import annotations

import json
import os
import shutil
import signal
import uuid
from pathlib import Path

import pytest
from support.helpers import cli, start_cli, wait_for
from support.plan_env import seed_raw, write_recipe
from support.slurm_runs import (
    find_run,
    job_of,
    nothing_left,
    over_login,
    run_argv,
    slurm_profile,
)

pytestmark = [pytest.mark.slurm, pytest.mark.docker, pytest.mark.timeout(600)]


def _slow_run(tmp_path: Path, test_image, run_args: list[str], slurm, prefix: str, **fields):
    """A 1-node run whose training takes a minute, started at the CLI, followed to its step 1."""
    recipe = write_recipe(tmp_path, test_image)
    profile = slurm_profile(
        tmp_path, run_args, env={"STANDIN_SLEEP_S": "2", "STANDIN_STARTUP_S": "0"}, **fields
    )
    run_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    proc = start_cli(*run_argv(recipe, profile, runs, run_id))
    wait_for(lambda: bool(list(runs.glob(f"**/*{run_id}/run.json"))), 300, "the run dir")
    train_log = find_run(runs, run_id) / "logs" / "train.log"
    wait_for(lambda: "step 1:" in train_log.read_text(), 300, "training")
    assert f"reproduce-{run_id}" in slurm.squeue()
    return proc, runs, run_id


def test_ctrl_c_mid_run_cancels_the_job_and_leaves_nothing(
    slurm, test_image, container_run_args, tmp_path
):
    proc, runs, run_id = _slow_run(tmp_path, test_image, container_run_args, slurm, "slc")
    try:
        os.killpg(proc.pid, signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    rd = find_run(runs, run_id)
    assert json.loads((rd / "status.json").read_text())["state"] == "cancelled"
    assert not (rd / "verdict.json").exists()
    shown = slurm.run("scontrol", "show", "job", job_of(rd)).stdout
    assert "JobState=CANCELLED" in shown, shown
    nothing_left(slurm, run_id)


def test_ssh_to_the_jobs_node_then_cancel_ends_the_job_and_only_it(
    slurm, login, test_image, container_run_args, tmp_path
):
    """Through the login node over SSH (its host key pinned): `reproduce ssh` runs a command on
    the job's node as a step of the job, never in another job; `reproduce cancel` ends the job
    and leaves someone else's alone."""
    # someone else's job on the same cluster: never touched by this run's cancel
    other = slurm.run(
        "sbatch", "--parsable", "--job-name=someone-else", "-o", "/dev/null", "--wrap", "sleep 300"
    ).stdout.strip()
    proc, runs, run_id = _slow_run(
        tmp_path, test_image, container_run_args, slurm, "slx", **over_login(login)
    )
    try:
        rd = find_run(runs, run_id)
        record = json.loads((rd / "run.json").read_text())
        job = job_of(rd)
        node = slurm.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
        shell = cli("ssh", str(rd), "--", "echo", "on", "$SLURMD_NODENAME", "job",
                    "$SLURM_JOB_ID", "in", "$PWD", timeout=60)  # fmt: skip
        assert shell.returncode == 0, shell.stderr[-2000:]
        assert f"on {node} job {job} in {record['node_run_dir']}" in shell.stdout, shell.stdout
        # the same run's record pointing at another job: no shell is opened in it
        stolen = tmp_path / "stolen" / rd.name
        shutil.copytree(rd, stolen)
        forged = json.loads((stolen / "run.json").read_text())
        forged["cluster"]["job_id"] = other
        (stolen / "run.json").write_text(json.dumps(forged))
        refused = cli("ssh", str(stolen), "--", "touch", str(tmp_path / "ran"), timeout=60)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert f"slurm job {other} is not this run's" in refused.stderr, refused.stderr
        assert not (tmp_path / "ran").exists()
        result = cli("cancel", str(rd), timeout=180)
        assert result.returncode in (0, 130), result.stderr[-3000:]
        _out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
        state = slurm.run("squeue", "-h", "-j", other, "-o", "%T").stdout.strip()
        slurm.run("scancel", other)
    assert state in ("RUNNING", "PENDING"), state  # the other job was left alone
    assert proc.returncode != 0, err[-3000:]
    assert not (rd / "verdict.json").exists()
    assert json.loads((rd / "status.json").read_text())["state"] == "cancelled"
    nothing_left(slurm, run_id)


def test_a_requeued_job_is_refused_as_two_attempts(slurm, test_image, container_run_args, tmp_path):
    proc, runs, run_id = _slow_run(tmp_path, test_image, container_run_args, slurm, "slr")
    try:
        job = job_of(find_run(runs, run_id))
        # what an operator (or a preemption policy) can still do to a --no-requeue job
        slurm.run("scontrol", "update", f"jobid={job}", "requeue=1", check=True)
        slurm.run("scontrol", "requeue", job, check=True)
        _out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, err[-3000:]
    assert f"slurm job {job} was requeued" in err and "two attempts" in err
    assert "No verdict" in err
    rd = find_run(runs, run_id)
    assert not (rd / "verdict.json").exists()
    assert json.loads((rd / "status.json").read_text())["state"] == "failed"
    nothing_left(slurm, run_id)


def test_detach_then_status_logs_and_attach_to_the_verdict(
    slurm, test_image, container_run_args, tmp_path
):
    recipe = write_recipe(tmp_path, test_image)
    prof = slurm_profile(
        tmp_path, container_run_args, env={"STANDIN_SLEEP_S": "0.5", "STANDIN_STARTUP_S": "0"}
    )
    run_id = f"sla-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    argv = run_argv(recipe, prof, runs, run_id)
    argv[argv.index("cancel")] = "detach"
    proc = start_cli(*argv)
    try:
        wait_for(lambda: bool(list(runs.glob(f"**/*{run_id}/run.json"))), 300, "the run dir")
        train_log = find_run(runs, run_id) / "logs" / "train.log"
        wait_for(lambda: "step 1:" in train_log.read_text(), 300, "training")
        os.killpg(proc.pid, signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    rd = find_run(runs, run_id)
    assert json.loads((rd / "status.json").read_text())["state"] == "detached", err[-2000:]
    assert (
        f"reproduce-{run_id}" in slurm.squeue()
        or (Path(json.loads((rd / "run.json").read_text())["node_run_dir"]) / "exit_code").exists()
    )  # the job went on without the launcher
    status = cli("status", str(rd), timeout=60)
    assert status.returncode == 0 and "slurm" in status.stdout + status.stderr, status.stderr
    logs = cli("logs", str(rd), timeout=60)
    assert logs.returncode == 0 and "step 1:" in logs.stdout, logs.stderr
    runs_list = cli("runs", "--runs-dir", str(runs), timeout=60)
    assert run_id in runs_list.stdout, runs_list.stderr
    attached = cli("attach", str(rd), timeout=300)
    assert attached.returncode == 0, attached.stderr[-3000:]
    assert "verdict: reproduced" in attached.stderr
    assert json.loads((rd / "verdict.json").read_text())["status"] == "reproduced"
    nothing_left(slurm, run_id)


def test_a_controller_restart_mid_run_is_no_news_about_the_job(
    slurm, test_image, container_run_args, tmp_path
):
    """slurmctld restarting mid-run (its clients wait for it or fail: either is no news about
    the job, never its end) leaves the run going to its verdict."""
    recipe = write_recipe(tmp_path, test_image)
    prof = slurm_profile(
        tmp_path, container_run_args, env={"STANDIN_SLEEP_S": "0.5", "STANDIN_STARTUP_S": "0"}
    )
    run_id = f"slh-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    proc = start_cli(*run_argv(recipe, prof, runs, run_id))
    try:
        wait_for(lambda: bool(list(runs.glob(f"**/*{run_id}/run.json"))), 300, "the run dir")
        train_log = find_run(runs, run_id) / "logs" / "train.log"
        wait_for(lambda: "step 1:" in train_log.read_text(), 300, "training")
        slurm.restart_controller(down_s=4)
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "verdict: reproduced" in err
    nothing_left(slurm, run_id)


def test_the_budget_scancels_the_job(slurm, test_image, container_run_args, tmp_path):
    """--max-usd at the profile's price (1 $/s for the node) is reached while training: the run
    stops (exit 1, no verdict), its job is scancelled and squeue holds nothing of it; the job's
    own --time was the budget's too. The budget (50 s) leaves room for a slow start on a busy
    machine (Ray took 22 s at load 8), and the training (20 steps of 4 s) outlasts it."""
    raw = seed_raw()
    raw["result"]["gpu_hours"] = None  # no claim to refuse the budget against before the launch
    recipe = write_recipe(tmp_path, test_image, raw=raw)
    profile = slurm_profile(
        tmp_path, container_run_args, price_per_hour=3600,
        env={"STANDIN_SLEEP_S": "4", "STANDIN_STARTUP_S": "0"},
    )  # fmt: skip
    run_id = f"slb-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    result = cli(*run_argv(recipe, profile, runs, run_id), "--max-usd", "50", timeout=400)
    rd = find_run(runs, run_id)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "budget reached" in result.stderr, result.stderr[-3000:]
    assert "step 1:" in (rd / "logs" / "train.log").read_text()  # stopped while training
    assert not (rd / "verdict.json").exists()
    assert "#SBATCH --time=0-00:01:00\n" in (rd / "job.sbatch").read_text()
    shown = slurm.run("scontrol", "show", "job", job_of(rd)).stdout
    assert "JobState=CANCELLED" in shown, shown
    nothing_left(slurm, run_id)
