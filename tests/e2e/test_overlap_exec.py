"""The node script's parallel part, run for real: the Plan's own node.sh on this host (`--cluster
local`, a real dockerd, the image pulled by digest from the local registry), with the node
programs behind a shim that can slow a stage down or make it fail (tests/support/faults.py).

What is shown: the independent stages run at once and the timeline says so, the GPU-hour split
charges their wall time once and still adds up; each stage's log is complete; a failure in any
parallel stage fails the run naming that stage and stops the others, leaving no process and no
container; a cancel (`reproduce cancel`, Ctrl-C) during the parallel part stops every child.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.docker import docker
from support.faults import fault_scripts, prerequisites, sleeping, with_probe
from support.helpers import (
    REPO,
    assert_log_collected,
    cli,
    group_alive,
    processes_mentioning,
    wait_for,
)
from support.plan_env import plan_for, write_profile, write_recipe

from launcher.clusters.local import LocalCluster
from launcher.errors import ReproduceError
from launcher.plan import stage_graph
from launcher.plan.protocol import MARKER
from launcher.records.rundir import RunDir, new_run_id
from launcher.runner.runner import Runner

pytestmark = pytest.mark.docker
LOCAL = {"kind": "local"}
SLOW_S = 120.0  # a stage that must be stopped sleeps this long: a run that waits for it fails


def _plan(tmp_path: Path, test_image, container_run_args, **kw):
    recipe = write_recipe(tmp_path, test_image)
    profile = write_profile(tmp_path, LOCAL, container_run_args, preflight={"enabled": True}, **kw)
    plan = plan_for(recipe, profile, run_id=new_run_id())
    return dataclasses.replace(plan, node_script=with_probe(plan.node_script))


def _run_containers(run_id: str) -> list[str]:
    """Every container of the run, by name (the training one and each stage's)."""
    out = docker("ps", "-a", "--format", "{{.Names}}").stdout.split()
    return [n for n in out if n == f"reproduce-{run_id}" or n.startswith(f"reproduce-{run_id}-")]


def _intervals(rd: RunDir) -> dict[str, tuple[float, float, str]]:
    return {s.name: (s.start, s.end, s.status) for s in rd.timeline().stages}


def _assert_stage_logs_whole(rd: RunDir, node_run_dir: str) -> None:
    """logs/<stage>.log of each background stage is its own log on the node, markers aside, byte
    for byte: nothing of another stage in it, nothing of its own missing."""
    for name in stage_graph.PARALLEL:
        own = Path(node_run_dir, "stages", f"{name}.log")
        if not own.exists() or not (rd.logs / f"{name}.log").exists():
            continue
        lines = own.read_bytes().splitlines(keepends=True)
        want = b"".join(ln for ln in lines if not ln.startswith(f"{MARKER} stage=".encode()))
        assert (rd.logs / f"{name}.log").read_bytes() == want, name


def test_the_independent_stages_run_at_once_and_the_split_counts_them_once(
    test_image, container_run_args, tmp_path, runs_root
):
    docker("rmi", "-f", test_image.ref, check=False)  # a real pull beside the others
    plan = _plan(tmp_path, test_image, container_run_args)
    slow = {"preflight": 4.0, "resolve": 2.0, "image": 4.0, "assets": 4.0}
    scripts = fault_scripts(tmp_path / "scripts", slow=slow)
    rd = RunDir.create(runs_root, plan.recipe.slug, plan.run_id)
    outcome = Runner(scripts_dir=scripts, poll_s=0.2).execute(plan, rd, LocalCluster())
    node_log = Path(plan.node_run_dir, "node.log")
    assert outcome.state == "done", node_log.read_text()[-3000:]
    assert_log_collected(rd.path)
    _assert_stage_logs_whole(rd, plan.node_run_dir)
    stages = _intervals(rd)
    assert set(stages) == {*stage_graph.PARALLEL, "convert", "ray", "train"}
    assert all(status == "ok" for _, _, status in stages.values())
    # the timeline lists them as they started, whatever order they reached node.log in
    starts = [s.start for s in rd.timeline().stages]
    assert starts == sorted(starts)
    # preflight, resolve, the pull and the checkpoint fetch ran at the same time ...
    pre, image, assets = stages["preflight"], stages["image"], stages["assets"]
    assert pre[0] < image[1] and image[0] < pre[1] and image[0] < assets[1] < image[1] + 30
    # ... each stage waited for what it needs, and nothing after the join began before it
    for name in stage_graph.PARALLEL:
        for before in stage_graph.AFTER[name]:
            assert stages[before][1] <= stages[name][0], (before, name)
    parallel_end = max(stages[n][1] for n in stage_graph.PARALLEL)
    assert stages["convert"][0] >= parallel_end
    wall = parallel_end - min(stages[n][0] for n in stage_graph.PARALLEL)
    work = sum(stages[n][1] - stages[n][0] for n in stage_graph.PARALLEL)
    assert wall < work - 4.0  # at least one slow stage's time was saved by running at once
    # the split: one part for what ran at once (its wall time), adding up to the GPU-hours
    result = yaml.safe_load((rd.path / "result.yaml").read_text())["provenance"]
    split = result["gpu_hours_by_stage"]
    (part,) = [k for k in split if k.startswith("parallel: ")]
    assert set(part[len("parallel: ") :].split("+")) == set(stage_graph.PARALLEL)
    assert not set(stage_graph.PARALLEL) & set(split)  # none of them charged on its own too
    gpus = plan.recipe.gpu_count
    assert split[part] == pytest.approx(gpus * wall / 3600, rel=1e-6)
    assert sum(split.values()) == pytest.approx(result["unrounded"]["gpu_hours"])
    own = result["gpu_hours_overlapped"][part]
    assert own["image"] == pytest.approx(gpus * (image[1] - image[0]) / 3600, rel=1e-6)
    report = (rd.path / "report.md").read_text()
    assert f"| {part} |" in report and "ran at once" in report


@pytest.mark.parametrize("failing", stage_graph.PARALLEL)
def test_a_failure_in_any_parallel_stage_fails_the_run_naming_it_and_stops_the_rest(
    test_image, container_run_args, tmp_path, runs_root, failing
):
    plan = _plan(tmp_path, test_image, container_run_args)
    needed = prerequisites(failing)  # these run normally, so that the failing stage starts
    slow = {s: SLOW_S for s in stage_graph.PARALLEL if s != failing and s not in needed}
    scripts = fault_scripts(tmp_path / "scripts", slow=slow, fail=failing)
    rd = RunDir.create(runs_root, plan.recipe.slug, plan.run_id)
    t0 = time.monotonic()
    with pytest.raises(ReproduceError) as err:
        Runner(scripts_dir=scripts, poll_s=0.2, measure=False).execute(plan, rd, LocalCluster())
    elapsed = time.monotonic() - t0
    assert f"in stage {failing} " in str(err.value) and "exit code 7" in str(err.value)
    assert elapsed < SLOW_S / 2, "the run waited for a stage it should have stopped"
    assert_log_collected(rd.path)
    _assert_stage_logs_whole(rd, plan.node_run_dir)
    assert f"shim: stage {failing} fails here" in (rd.logs / f"{failing}.log").read_text()
    stages = _intervals(rd)
    assert stages[failing][2] == "failed"
    for name, (_, _, status) in stages.items():
        if name in needed:
            assert status == "ok", (name, status)
        elif name != failing:  # started beside it, still sleeping when it failed
            assert status == "stopped", (name, status)
    assert not {"convert", "ray", "train"} & set(stages)
    # no process of the run and no container of it is left
    wait_for(lambda: not group_alive(rd.record()["pid"]), 10, "the wrapper to exit")
    assert processes_mentioning(plan.node_run_dir) == []
    assert sleeping(scripts) == []
    assert _run_containers(plan.run_id) == []


DRIVER = """
import dataclasses, json, sys
from pathlib import Path
from launcher.clusters.local import LocalCluster
from launcher.commands.console import ConsoleReporter
from launcher.errors import ReproduceError
from launcher.records.rundir import RunDir
from launcher.runner.runner import Runner
from support.faults import with_probe
from support.plan_env import plan_for
spec = json.loads(Path(sys.argv[1]).read_text())
plan = plan_for(Path(spec["recipe"]), Path(spec["profile"]), run_id=spec["run_id"])
plan = dataclasses.replace(plan, node_script=with_probe(plan.node_script))
rd = RunDir.create(Path(spec["runs"]), plan.recipe.slug, plan.run_id)
runner = Runner(ConsoleReporter(), on_interrupt="cancel", poll_s=0.2, measure=False,
                scripts_dir=Path(spec["scripts"]))
try:
    runner.execute(plan, rd, LocalCluster())
except ReproduceError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(err.exit_code)
"""


@pytest.mark.parametrize("how", ["cancel-command", "ctrl-c"])
def test_a_cancel_during_the_parallel_part_stops_every_child(
    test_image, container_run_args, tmp_path, runs_root, how
):
    """The GPU preflight and the stack probe sleep in their containers, the host's preflight and
    the fetches on the host: a cancel must stop all of them."""
    recipe = write_recipe(tmp_path, test_image)
    profile = write_profile(tmp_path, LOCAL, container_run_args, preflight={"enabled": True})
    slow = dict.fromkeys(("preflight", "rows", "assets"), SLOW_S)  # on the host
    in_containers = {"preflight-gpu": SLOW_S, "stack": SLOW_S}
    scripts = fault_scripts(tmp_path / "scripts", slow=slow, slow_programs=in_containers)
    run_id = new_run_id()
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "recipe": str(recipe),
                "profile": str(profile),
                "run_id": run_id,
                "runs": str(runs_root),
                "scripts": str(scripts),
            }
        )
    )
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"},
        start_new_session=True,
        text=True,
    )
    wanted = {f"reproduce-{run_id}-preflight-gpu", f"reproduce-{run_id}-stack"}
    try:
        wait_for(
            lambda: wanted <= set(_run_containers(run_id)),
            timeout_s=120,
            what="the GPU preflight's and the stack probe's containers to run",
        )
        (rd_path,) = runs_root.glob(f"*/*/*/{run_id}")
        rd = RunDir(rd_path)
        pid = rd.record()["pid"]
        assert sleeping(scripts), "the host's stages should be sleeping"
        if how == "ctrl-c":
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 130, stderr
        else:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher dies; the run goes on
            proc.wait()
            assert group_alive(pid)
            result = cli("cancel", run_id, "--runs-dir", str(runs_root))
            assert result.returncode == 0, result.stderr
    finally:  # a failed assertion must not leave a run going on this host
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if _run_containers(run_id) or processes_mentioning(str(tmp_path)):
            cli("cancel", run_id, "--runs-dir", str(runs_root))
    wait_for(lambda: not group_alive(pid), 10, "the wrapper to exit")
    assert _run_containers(run_id) == []
    assert processes_mentioning(str(tmp_path)) == [] and sleeping(scripts) == []
    assert rd.status()["state"] == "cancelled"
    if how == "ctrl-c":  # the launcher followed to the end: every stage's log came back
        assert_log_collected(rd.path)
        stages = _intervals(rd)
        for name in ("preflight", "preflight-gpu", "stack", "assets"):
            assert stages[name][2] == "cancelled", (name, stages[name])
