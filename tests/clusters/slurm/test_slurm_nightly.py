"""`reproduce nightly --cluster <slurm profile>` for real, through the CLI, against the loopback
Slurm cluster (tests/support/slurm_cluster.py), with the stand-in miles: recipes of one shape
share ONE allocation (one sbatch holding the nodes), each measured as its own job step of it, with
its own run directory, record, verdict and GPU-hours from its step; the allocation is gone from
squeue after the nightly, also after a recipe that fails and after Ctrl-C mid-recipe; `reproduce
cancel` of one run ends its step and leaves the allocation to the next recipe; recipes of two
shapes get two allocations."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
from support.cli import REPO
from support.helpers import cli, start_cli, wait_for
from support.plan_env import seed_raw, write_recipe
from support.slurm_runs import nothing_left, slurm_profile

pytestmark = [pytest.mark.slurm, pytest.mark.docker, pytest.mark.timeout(600)]

QUICK = {"STANDIN_STARTUP_S": "0", "STANDIN_SLEEP_S": "0.2"}


def _recipe(tmp_path: Path, test_image, name: str, **env: str) -> Path:
    raw = seed_raw()
    raw["env"] = {**(raw.get("env") or {}), **env}
    return write_recipe(tmp_path, test_image, raw=raw, name=name)


def _four_gpus() -> dict:
    """The seed on 4 GPUs of a node (EP 4, DP 4): another node shape, so another allocation. No
    cloud instance (a node of 8 would be priced whole), so no $/1M claim."""
    raw = seed_raw()
    raw["gpu"].update(count=4, per_node=4, instance=None)
    raw["layout"].update(ep=4, dp=4, label="TP1 PP1 EP4 DP4")
    raw["layout"]["summary"] = (
        raw["layout"]["summary"].replace("EP 8", "EP 4").replace("DP 8", "DP 4")
    )
    for flag in (
        "--actor-num-gpus-per-node",
        "--num-gpus-per-node",
        "--expert-model-parallel-size",
    ):
        raw["run"] = raw["run"].replace(f"{flag} 8", f"{flag} 4")
    raw["result"].update(gpu_hours=raw["result"]["gpu_hours"] / 2, usd_per_million_tokens=None)
    raw["env"] = {**(raw.get("env") or {}), **QUICK}
    return raw


def _nightly_argv(recipes: list[Path], profile: Path, tmp_path: Path) -> list[str]:
    return [
        "nightly", *map(str, recipes), "--cluster", str(profile),
        "--runs-dir", str(tmp_path / "runs"), "--history", str(tmp_path / "history.db"), "--yes",
    ]  # fmt: skip


def _runs(tmp_path: Path, names: list[str]) -> dict[str, Path]:
    """Each run directory so far by its recipe's name, in the nightly's order (run ids begin
    with their UTC time; the recipes share a slug)."""
    found = sorted((tmp_path / "runs").glob("**/run.json"), key=lambda p: p.parent.name)
    return {name: p.parent for name, p in zip(names, found, strict=False)}


def _record(rd: Path) -> dict:
    return json.loads((rd / "run.json").read_text())


class Watch:
    """squeue, every 0.3 s while a nightly runs: every job of this test's nightly it saw (by
    the name of its first run: reproduce-group-<run id>) and every step."""

    def __init__(self, slurm) -> None:
        self.slurm = slurm
        self.jobs: set[tuple[str, str]] = set()
        self.steps: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            jobs = self.slurm.run("squeue", "-h", "-o", "%i|%j").stdout.split()
            steps = self.slurm.run("squeue", "-h", "-s", "-o", "%i|%j").stdout.split()
            self.jobs |= {tuple(j.split("|", 1)) for j in jobs if "|" in j}
            self.steps |= {tuple(s.split("|", 1)) for s in steps if "|" in s}
            self._stop.wait(0.3)

    def groups(self) -> set[str]:
        return {job for job, name in self.jobs if name.startswith("reproduce-group-")}


def _gone(slurm, job: str) -> bool:
    return job not in slurm.run("squeue", "-h", "-o", "%i").stdout.split()


def _steps_of(slurm, job: str) -> list[str]:
    """The job's steps that run a run's body (not its batch shell)."""
    listed = slurm.run("squeue", "-h", "-s", "-j", job, "-o", "%i").stdout.split()
    return [s for s in listed if s.startswith(f"{job}.") and s.split(".")[1].isdigit()]


def test_recipes_of_one_shape_are_steps_of_one_allocation_even_past_a_failed_one(
    slurm, test_image, container_run_args, tmp_path
):
    a = _recipe(tmp_path, test_image, "standin-a")
    failing = _recipe(tmp_path, test_image, "standin-fails", STANDIN_FAIL_AT="3")
    b = _recipe(tmp_path, test_image, "standin-b")
    profile = slurm_profile(tmp_path, container_run_args, env=QUICK)
    with Watch(slurm) as watch:
        night = cli(*_nightly_argv([a, failing, b], profile, tmp_path), timeout=560)
    said = night.stdout + night.stderr
    assert night.returncode == 1, said[-4000:]  # the failed recipe's verdict
    assert f'File "{REPO}/launcher' not in said  # the stand-in's own traceback is its failure
    runs = _runs(tmp_path, ["standin-a", "standin-fails", "standin-b"])
    assert len(runs) == 3, said[-3000:]
    records = {name: _record(rd) for name, rd in runs.items()}
    jobs = {r["cluster"]["job_id"] for r in records.values()}
    assert len(jobs) == 1, records  # one allocation for the three
    (job,) = jobs
    assert watch.groups() == {job}, watch.jobs  # squeue saw exactly one job of the nightly
    steps = {name: r["cluster"]["step_id"] for name, r in records.items()}
    assert len(set(steps.values())) == 3 and all(s.startswith(f"{job}.") for s in steps.values())
    for name, r in records.items():
        assert r["cluster"]["step_name"] == f"reproduce-{r['run_id']}"
        assert (steps[name], f"reproduce-{r['run_id']}") in watch.steps  # squeue -s saw it
        assert r["cluster"]["job_name"].startswith("reproduce-group-")
    # the allocation's own script, kept by the run that made it, asked what a run's job asks
    holder = Path(records["standin-a"]["shared_node"]["holder"])
    assert holder == runs["standin-a"]
    text = (holder / "allocation.sbatch").read_text()
    assert "#SBATCH --gres=gpu:8\n#SBATCH --exclusive\n#SBATCH --no-requeue\n" in text
    assert records["standin-a"]["allocation"]["job_id"] == job
    # each its own verdict
    verdicts = {
        n: json.loads((rd / "verdict.json").read_text())["status"] for n, rd in runs.items()
    }
    assert verdicts["standin-a"] == verdicts["standin-b"] == "reproduced", verdicts
    assert verdicts["standin-fails"] != "reproduced"
    # GPU-hours from each step's own start and end: one after another, none overlapping, each
    # much shorter than the allocation was held
    spans = []
    for name, rd in runs.items():
        timeline = json.loads((rd / "timeline.json").read_text())
        started = records[name]["cluster"]["started_at"]
        assert started is not None and abs(timeline["acquired_at"] - started) < 1e-6
        spans.append((timeline["acquired_at"], timeline["released_at"]))
    spans.sort()
    assert all(end <= nxt for (_s, end), (nxt, _e) in zip(spans, spans[1:], strict=False)), spans
    assert "3 recipe(s) on one node" in said
    assert _gone(slurm, job), slurm.squeue()  # released with the nightly
    for r in records.values():
        nothing_left(slurm, r["run_id"])  # no job, no container of any run


def test_cancel_ends_one_step_then_ctrl_c_mid_next_recipe_ends_the_allocation(
    slurm, test_image, container_run_args, tmp_path
):
    slow = {"STANDIN_SLEEP_S": "2"}
    names = ["standin-cancelled", "standin-interrupted", "standin-never"]
    first = _recipe(tmp_path, test_image, "standin-cancelled", **slow)
    second = _recipe(tmp_path, test_image, "standin-interrupted", **slow)
    third = _recipe(tmp_path, test_image, "standin-never", **slow)
    profile = slurm_profile(tmp_path, container_run_args, env={"STANDIN_STARTUP_S": "0"})
    proc = start_cli(*_nightly_argv([first, second, third], profile, tmp_path))
    try:

        def train(name: str) -> Path:  # absent until the run has its directory: "not yet"
            rd = _runs(tmp_path, names).get(name, tmp_path / "not-yet")
            return rd / "logs" / "train.log"

        wait_for(lambda: "step 1:" in train("standin-cancelled").read_text(), 300, "training")
        rd = _runs(tmp_path, names)["standin-cancelled"]
        job = _record(rd)["cluster"]["job_id"]
        cancelled = cli("cancel", str(rd), timeout=180)
        assert cancelled.returncode in (0, 130), cancelled.stderr[-3000:]
        # the next recipe gets the same allocation, as a step of its own
        wait_for(lambda: "step 1:" in train("standin-interrupted").read_text(), 300, "recipe 2")
        rd2 = _runs(tmp_path, names)["standin-interrupted"]
        assert _record(rd2)["cluster"]["job_id"] == job
        assert _steps_of(slurm, job) == [_record(rd2)["cluster"]["step_id"]]
        # the running step's record serves status, logs and ssh (one more step, in the allocation)
        status = cli("status", str(rd2), timeout=60)
        assert status.returncode == 0 and "slurm" in status.stdout, status.stderr[-2000:]
        logs = cli("logs", str(rd2), timeout=60)
        assert logs.returncode == 0 and "step 1:" in logs.stdout, logs.stderr[-2000:]
        shell = cli("ssh", str(rd2), "--", "echo", "in", "$SLURM_JOB_ID", timeout=60)
        assert shell.returncode == 0 and f"in {job}" in shell.stdout, shell.stderr[-2000:]
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out + err)[-4000:]
    states = {
        n: json.loads((rd / "status.json").read_text())["state"]
        for n, rd in _runs(tmp_path, names).items()
    }
    assert states == {"standin-cancelled": "cancelled", "standin-interrupted": "cancelled"}
    assert _gone(slurm, job), slurm.squeue()
    left = slurm.run("squeue", "-h", "-o", "%j").stdout
    assert "reproduce-group-" not in left, left
    for rd in _runs(tmp_path, names).values():
        nothing_left(slurm, _record(rd)["run_id"])  # no container of the cancelled steps


def test_two_shapes_get_two_allocations_and_a_lost_step_is_said_so(
    slurm, test_image, container_run_args, tmp_path
):
    """Two recipes of different GPUs per node: two allocations, one after the other. And a
    record whose step cannot be found: `cancel` says so and fails, never "nothing to do"."""
    eight = _recipe(tmp_path, test_image, "standin-eight")
    four = write_recipe(tmp_path, test_image, raw=_four_gpus(), name="standin-four")
    profile = slurm_profile(tmp_path, container_run_args, env=QUICK)
    with Watch(slurm) as watch:
        night = cli(*_nightly_argv([eight, four], profile, tmp_path), timeout=560)
    said = night.stdout + night.stderr
    runs = _runs(tmp_path, ["standin-eight", "standin-four"])
    assert len(runs) == 2, said[-3000:]
    jobs = {n: _record(rd)["cluster"]["job_id"] for n, rd in runs.items()}
    assert len(set(jobs.values())) == 2 and watch.groups() == set(jobs.values()), (said, jobs)
    assert all(_gone(slurm, j) for j in jobs.values())
    # a record whose step cannot be found: the run forged back to running, without an exit code
    rd = runs["standin-eight"]
    (rd / "status.json").write_text(json.dumps({"state": "running"}))
    (Path(_record(rd)["node_run_dir"]) / "exit_code").unlink()
    gone = cli("cancel", str(rd), timeout=120)
    assert gone.returncode != 0, gone.stdout + gone.stderr
    assert "cannot be found" in gone.stderr and "Traceback" not in gone.stderr, gone.stderr
