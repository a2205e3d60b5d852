"""`reproduce RECIPE --cluster <slurm profile>` for real, through the CLI, against the loopback Slurm
cluster (tests/support/slurm_cluster.py: slurmctld, two slurmd with 8 gres GPUs each, munge, no
accounting): the job's script runs node.sh on every node with srun, in the test image pulled by
digest from the local registry, with Ray and the stand-in miles, to a verdict. And what must end a
run without one: more GPUs per node than the partition has (refused before sbatch), Ctrl-C and
`reproduce cancel` (nothing left in squeue, no container), a requeue (two attempts), a node lost
mid-run (NODE_FAIL, naming the node)."""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

import pytest
import yaml
from support.cli import FOUR_NODES
from support.docker import docker
from support.helpers import assert_log_collected, cli, start_cli, wait_for
from support.multinode import Netns
from support.plan_env import write_profile, write_recipe
from support.slurm_cluster import SMALL_PARTITION

from launcher.inputs.recipe import load_recipe

pytestmark = [pytest.mark.slurm, pytest.mark.docker, pytest.mark.timeout(600)]


def _profile(tmp_path: Path, run_args: list[str], **fields: object) -> Path:
    base = {"kind": "slurm", "partition": "gpu", "gpu_option": "gres"}
    return write_profile(tmp_path, base, run_args, **fields)


def _run_dir(runs: Path, run_id: str) -> Path:
    found = list(runs.glob(f"**/*{run_id}/run.json"))
    assert found, f"no run dir for {run_id} under {runs}"
    return found[0].parent


def _nothing_left(slurm, run_id: str) -> None:
    assert f"reproduce-{run_id}" not in slurm.squeue(), slurm.squeue()
    left = docker("ps", "-aq", "--filter", f"name=reproduce-{run_id}").stdout.split()
    assert not left, docker("ps", "-a").stdout


def _args(recipe: Path, profile: Path, runs: Path, run_id: str) -> list[str]:
    return [
        str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), "--run-id", run_id,
        "--on-interrupt", "cancel", "--yes",
    ]  # fmt: skip


def test_one_node_recipe_runs_as_a_slurm_job_to_a_verdict(
    slurm, test_image, container_run_args, tmp_path
):
    recipe = write_recipe(tmp_path, test_image)
    profile = _profile(tmp_path, container_run_args)
    run_id = f"sl1-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    result = cli(*_args(recipe, profile, runs, run_id), timeout=500)
    rd = _run_dir(runs, run_id)
    node_log = (rd / "logs" / "node.log").read_text() if (rd / "logs" / "node.log").exists() else ""
    assert result.returncode == 0, result.stderr[-3000:] + node_log[-3000:]
    assert "verdict: reproduced" in result.stderr
    assert_log_collected(rd)
    record = json.loads((rd / "run.json").read_text())
    job = record["cluster"]["job_id"]
    assert record["cluster"]["kind"] == "slurm" and job.isdigit()
    assert (
        record["slurm"]["version"].endswith("22.05.8") and record["slurm"]["gpu_option"] == "gres"
    )
    # the script submitted is the one kept in the run directory, and it asked what the plan says
    submitted = (rd / "job.sbatch").read_text()
    assert "#SBATCH --gres=gpu:8\n#SBATCH --exclusive\n#SBATCH --no-requeue\n" in submitted
    shown = slurm.run("scontrol", "show", "job", job).stdout
    assert "JobState=COMPLETED" in shown and "Requeue=0" in shown, shown
    # the job's own output is in node 0's run directory on the shared work dir
    node_dir = Path(record["node_run_dir"])
    assert f"reproduce: job {job} on n" in (node_dir / f"slurm-{job}.out").read_text()
    assert json.loads((rd / "verdict.json").read_text())["status"] == "reproduced"
    _nothing_left(slurm, run_id)


def test_more_gpus_per_node_than_the_partition_has_is_refused_before_sbatch(
    slurm, test_image, container_run_args, tmp_path
):
    recipe = write_recipe(tmp_path, test_image)
    profile = _profile(tmp_path, container_run_args, partition=SMALL_PARTITION)
    run_id = f"slg-{uuid.uuid4().hex[:8]}"
    before = slurm.run("squeue", "-h", "-a", "-o", "%i").stdout
    result = cli(*_args(recipe, profile, tmp_path / "runs", run_id), timeout=120)
    assert result.returncode == 2, result.stderr
    assert "8 GPUs each" in result.stderr and f"partition {SMALL_PARTITION}" in result.stderr
    assert "at most 4 GPUs per node" in result.stderr and "nothing was submitted" in result.stderr
    assert "Traceback" not in result.stderr
    assert slurm.run("squeue", "-h", "-a", "-o", "%i").stdout == before
    assert "reproduce-" + run_id not in slurm.run("scontrol", "show", "jobs").stdout


def _slow_run(tmp_path: Path, test_image, run_args: list[str], slurm, prefix: str):
    """A 1-node run whose training takes minutes, started at the CLI, followed to step 2."""
    recipe = write_recipe(tmp_path, test_image)
    profile = _profile(tmp_path, run_args, env={"STANDIN_SLEEP_S": "2", "STANDIN_STARTUP_S": "0"})
    run_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    proc = start_cli(*_args(recipe, profile, runs, run_id))
    wait_for(lambda: bool(list(runs.glob(f"**/*{run_id}/run.json"))), 300, "the run dir")
    train_log = _run_dir(runs, run_id) / "logs" / "train.log"
    wait_for(lambda: "step 1:" in train_log.read_text(), 300, "training")
    assert f"reproduce-{run_id}" in slurm.squeue()
    return proc, runs, run_id


def _job_of(rd: Path) -> str:
    return str(json.loads((rd / "run.json").read_text())["cluster"]["job_id"])


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
    rd = _run_dir(runs, run_id)
    assert json.loads((rd / "status.json").read_text())["state"] == "cancelled"
    assert not (rd / "verdict.json").exists()
    shown = slurm.run("scontrol", "show", "job", _job_of(rd)).stdout
    assert "JobState=CANCELLED" in shown, shown
    _nothing_left(slurm, run_id)


def test_reproduce_cancel_ends_the_job_and_only_it(slurm, test_image, container_run_args, tmp_path):
    # someone else's job on the same cluster: never touched by this run's cancel
    other = slurm.run(
        "sbatch", "--parsable", "--job-name=someone-else", "-o", "/dev/null", "--wrap", "sleep 300"
    ).stdout.strip()
    proc, runs, run_id = _slow_run(tmp_path, test_image, container_run_args, slurm, "slx")
    try:
        rd = _run_dir(runs, run_id)
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
    _nothing_left(slurm, run_id)


def test_a_requeued_job_is_refused_as_two_attempts(slurm, test_image, container_run_args, tmp_path):
    proc, runs, run_id = _slow_run(tmp_path, test_image, container_run_args, slurm, "slr")
    try:
        job = _job_of(_run_dir(runs, run_id))
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
    rd = _run_dir(runs, run_id)
    assert not (rd / "verdict.json").exists()
    assert json.loads((rd / "status.json").read_text())["state"] == "failed"
    _nothing_left(slurm, run_id)


@pytest.fixture(scope="module")
def netns(test_image, container_run_args):
    """One loopback-only network namespace for every node's containers: Ray's head on n1's
    address (127.0.0.2), its worker on n2's (127.0.0.3), as the job's NodeAddr says."""
    holder = Netns(test_image.ref, container_run_args).start()
    yield holder
    holder.stop()


def _two_nodes(tmp_path: Path, test_image, run_args: list[str], netns, **env: str):
    raw = yaml.safe_load(FOUR_NODES.read_text())
    raw["gpu"]["count"] = 16
    raw["layout"]["dp"] = 16
    raw["run"] = raw["run"].replace("--actor-num-nodes 4", "--actor-num-nodes 2")
    raw["result"]["gpu_hours"] = raw["result"]["gpu_hours"] / 2
    recipe = write_recipe(tmp_path, test_image, raw=raw, name="standin-2node")
    r = load_recipe(recipe)
    step_s = r.tokens_per_step / r.claim["tokens_per_s_per_gpu"] / r.gpu_count
    profile = _profile(
        tmp_path, run_args, docker={"network": netns.network},
        env={"STANDIN_STEP_TIME_S": f"{step_s:.4f}", "STANDIN_STARTUP_S": "0", **env},
        ray={"port": 6379, "join_timeout_s": 120},
    )  # fmt: skip
    return recipe, profile


def test_two_node_recipe_runs_as_one_job_to_a_verdict(
    slurm, netns, test_image, container_run_args, tmp_path
):
    recipe, profile = _two_nodes(tmp_path, test_image, container_run_args, netns)
    run_id = f"sl2-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    result = cli(*_args(recipe, profile, runs, run_id), timeout=500)
    rd = _run_dir(runs, run_id)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "verdict: reproduced" in result.stderr
    assert_log_collected(rd)
    ray_log = (rd / "logs" / "ray.log").read_text()
    assert "all 2 nodes joined: 127.0.0.2 127.0.0.3" in ray_log, ray_log[-2000:]
    train_log = (rd / "logs" / "train.log").read_text()
    assert "placed 16 GPUs (2 actors) on 2 nodes: 127.0.0.2 x8, 127.0.0.3 x8" in train_log
    worker = rd / "logs" / "node-1"
    assert "##reproduce stage=ray event=end status=ok" in (worker / "node.log").read_text()
    job = _job_of(rd)
    shown = slurm.run("scontrol", "show", "job", job).stdout
    assert "JobState=COMPLETED" in shown and "NodeList=n[1-2]" in shown, shown
    assert json.loads((rd / "verdict.json").read_text())["status"] == "reproduced"
    _nothing_left(slurm, run_id)


def test_a_node_lost_mid_run_is_an_infrastructure_failure_naming_it_with_no_verdict(
    slurm, netns, test_image, container_run_args, tmp_path
):
    recipe, profile = _two_nodes(
        tmp_path, test_image, container_run_args, netns, STANDIN_SLEEP_S="2"
    )
    run_id = f"slk-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    proc = start_cli(*_args(recipe, profile, runs, run_id))
    try:
        wait_for(lambda: bool(list(runs.glob(f"**/*{run_id}/run.json"))), 300, "the run dir")
        train_log = _run_dir(runs, run_id) / "logs" / "train.log"
        wait_for(lambda: "step 1:" in train_log.read_text(), 400, "training on node 0")
        # n2 stops answering, as a dead machine does: its slurmd, the job's processes on it and
        # its container frozen
        assert slurm.freeze_node("n2")
        docker("pause", f"reproduce-{run_id}-node1")
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        docker("rm", "-f", f"reproduce-{run_id}-node1", check=False)
        slurm.revive("n2")
    rd = _run_dir(runs, run_id)
    assert proc.returncode == 3, err[-4000:]
    assert "NODE_FAIL" in err and "job-node-1 = n2" in err and "No verdict" in err, err[-3000:]
    assert not (rd / "verdict.json").exists()
    status = json.loads((rd / "status.json").read_text())
    assert status["state"] == "failed" and "n2" in status["detail"]
    _nothing_left(slurm, run_id)
