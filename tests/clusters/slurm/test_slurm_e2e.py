"""`reproduce RECIPE --cluster <slurm profile>` for real, through the CLI, against the loopback Slurm
cluster (tests/support/slurm_cluster.py: slurmctld, two slurmd with 8 gres GPUs each, munge, no
accounting): the job's script runs node.sh on every node with srun, in the test image pulled by
digest from the local registry, with Ray and the stand-in miles, to a verdict. And what must end a
run without one: more GPUs per node than the partition has (refused before sbatch), Ctrl-C and
`reproduce cancel` (nothing left in squeue, no container), a requeue (two attempts):
test_slurm_stop.py; a node lost mid-run (NODE_FAIL, naming the node, no verdict): here."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
from support.docker import docker
from support.helpers import assert_log_collected, cli, start_cli, wait_for
from support.plan_env import write_recipe
from support.slurm_cluster import SMALL_PARTITION
from support.slurm_runs import find_run, job_of, nothing_left, run_argv, slurm_profile, two_nodes

pytestmark = [pytest.mark.slurm, pytest.mark.docker, pytest.mark.ssh, pytest.mark.timeout(600)]


def test_one_node_recipe_runs_as_a_slurm_job_over_ssh_to_the_login_node(
    slurm, login, test_image, container_run_args, tmp_path, monkeypatch
):
    recipe = write_recipe(tmp_path, test_image)
    reach = login.profile()
    profile = slurm_profile(
        tmp_path, container_run_args, login_host="127.0.0.1", port=reach["port"],
        user=reach["user"], identity_file=reach["identity_file"],
        host_key_fingerprint=login.host_fingerprint,
    )  # fmt: skip
    run_id = f"sl1-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    # this host cannot reach the cluster itself: every Slurm command must go through the login node
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    result = cli(*run_argv(recipe, profile, runs, run_id), timeout=500)
    monkeypatch.undo()
    rd = find_run(runs, run_id)
    node_log = (rd / "logs" / "node.log").read_text() if (rd / "logs" / "node.log").exists() else ""
    assert result.returncode == 0, result.stderr[-3000:] + node_log[-3000:]
    assert "verdict: reproduced" in result.stderr
    assert_log_collected(rd)
    record = json.loads((rd / "run.json").read_text())
    job = record["cluster"]["job_id"]
    assert record["cluster"]["kind"] == "slurm" and job.isdigit()
    assert record["cluster"]["login"]["host"] == "127.0.0.1"
    assert record["cluster"]["login"]["host_key_fingerprint"] == login.host_fingerprint
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
    # GPU-hours count from the job's own start (scontrol's RunTime), not from the submission
    timeline = json.loads((rd / "timeline.json").read_text())
    started = record["cluster"]["started_at"]
    assert started is not None and abs(timeline["acquired_at"] - started) < 2
    # ... and end at the job's own end, not at the launcher's release after it
    epoch = subprocess.run(
        ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, check=True,
        env={**os.environ, **slurm.env, "SLURM_TIME_FORMAT": "%s"},
    ).stdout  # fmt: skip
    times = dict(w.split("=", 1) for w in epoch.split() if w.startswith(("StartTime", "EndTime")))
    held_s = int(times["EndTime"]) - int(times["StartTime"])
    assert abs(timeline["released_at"] - timeline["acquired_at"] - held_s) < 1e-6, (times, timeline)
    assert timeline["release_started_at"] <= timeline["released_at"]
    nothing_left(slurm, run_id)


def test_more_gpus_per_node_than_the_partition_has_is_refused_before_sbatch(
    slurm, test_image, container_run_args, tmp_path
):
    recipe = write_recipe(tmp_path, test_image)
    profile = slurm_profile(tmp_path, container_run_args, partition=SMALL_PARTITION)
    run_id = f"slg-{uuid.uuid4().hex[:8]}"
    before = slurm.run("squeue", "-h", "-a", "-o", "%i").stdout
    result = cli(*run_argv(recipe, profile, tmp_path / "runs", run_id), timeout=120)
    assert result.returncode == 2, result.stderr
    assert "8 GPUs each" in result.stderr and f"partition {SMALL_PARTITION}" in result.stderr
    assert "at most 4 GPUs per node" in result.stderr and "nothing was submitted" in result.stderr
    assert "Traceback" not in result.stderr
    assert slurm.run("squeue", "-h", "-a", "-o", "%i").stdout == before
    assert "reproduce-" + run_id not in slurm.run("scontrol", "show", "jobs").stdout


def test_two_node_recipe_runs_as_one_job_to_a_verdict(
    slurm, netns, test_image, container_run_args, tmp_path
):
    recipe, profile = two_nodes(tmp_path, test_image, container_run_args, netns)
    run_id = f"sl2-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    result = cli(*run_argv(recipe, profile, runs, run_id), timeout=500)
    rd = find_run(runs, run_id)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "verdict: reproduced" in result.stderr
    assert_log_collected(rd)
    ray_log = (rd / "logs" / "ray.log").read_text()
    assert "all 2 nodes joined: 127.0.0.2 127.0.0.3" in ray_log, ray_log[-2000:]
    train_log = (rd / "logs" / "train.log").read_text()
    assert "placed 16 GPUs (2 actors) on 2 nodes: 127.0.0.2 x8, 127.0.0.3 x8" in train_log
    worker = rd / "logs" / "node-1"
    assert "##reproduce stage=ray event=end status=ok" in (worker / "node.log").read_text()
    job = job_of(rd)
    shown = slurm.run("scontrol", "show", "job", job).stdout
    assert "JobState=COMPLETED" in shown and "NodeList=n[1-2]" in shown, shown
    assert json.loads((rd / "verdict.json").read_text())["status"] == "reproduced"
    nothing_left(slurm, run_id)


def test_a_node_lost_mid_run_is_an_infrastructure_failure_naming_it_with_no_verdict(
    slurm, netns, test_image, container_run_args, tmp_path
):
    recipe, profile = two_nodes(
        tmp_path, test_image, container_run_args, netns, STANDIN_SLEEP_S="2"
    )
    run_id = f"slk-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    proc = start_cli(*run_argv(recipe, profile, runs, run_id))
    try:
        wait_for(lambda: bool(list(runs.glob(f"**/*{run_id}/run.json"))), 300, "the run dir")
        train_log = find_run(runs, run_id) / "logs" / "train.log"
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
    rd = find_run(runs, run_id)
    assert proc.returncode == 3, err[-4000:]
    assert "NODE_FAIL" in err and "job-node-1 = n2" in err and "No verdict" in err, err[-3000:]
    assert not (rd / "verdict.json").exists()
    status = json.loads((rd / "status.json").read_text())
    assert status["state"] == "failed" and "n2" in status["detail"]
    nothing_left(slurm, run_id)
