"""A 4-node recipe for real on one machine: four sshd "hosts" (an ssh profile with a host list),
every node's containers in one loopback-only network namespace, Ray's head on 127.0.0.1 and its
workers on 127.0.0.2-4 with 8 GPUs each declared as resources, and the stand-in miles placing one
actor per GPU across the cluster. Through the CLI to a verdict; then a worker killed mid-run stops
the run on every node, the verdict names the node, and nothing is left running."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest
import yaml
from support.cli import FOUR_NODES
from support.docker import containers_named, docker
from support.helpers import assert_log_collected, cli, processes_mentioning, start_cli, wait_for
from support.multinode import Netns, SshHosts
from support.plan_env import write_profile, write_recipe

from launcher.inputs.recipe import load_recipe

pytestmark = [pytest.mark.multinode, pytest.mark.ssh, pytest.mark.docker, pytest.mark.timeout(900)]
NODES = 4
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory):
    started = SshHosts(tmp_path_factory.mktemp("hosts"), NODES).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def netns(test_image, container_run_args):
    holder = Netns(test_image.ref, container_run_args).start()
    yield holder
    holder.stop()


def _recipe_and_profile(tmp_path: Path, hosts, netns, test_image, run_args, **env: str):
    """The 4-node fixture on the test image, and the host-list profile: every container in the
    holder's namespace, the step time of the recipe's claim, a short join deadline."""
    recipe = write_recipe(
        tmp_path, test_image, raw=yaml.safe_load(FOUR_NODES.read_text()), name="standin-4node"
    )
    r = load_recipe(recipe)
    step_s = r.tokens_per_step / r.claim.tokens_per_s_per_gpu / r.gpu_count
    profile = write_profile(
        tmp_path,
        hosts.profile(),
        run_args,
        docker={"network": netns.network},
        env={"STANDIN_STEP_TIME_S": f"{step_s:.4f}", "STANDIN_STARTUP_S": "0", **env},
        ray={"port": 6379, "join_timeout_s": 120},
    )
    return recipe, profile


def _nothing_left(run_id: str) -> None:
    leftovers = docker("ps", "-aq", "--filter", f"name=reproduce-{run_id}").stdout.split()
    assert not leftovers, docker("ps", "-a").stdout
    assert not processes_mentioning(run_id)


def _run_dir(runs: Path, run_id: str) -> Path:
    found = list(runs.glob(f"**/*{run_id}/run.json"))
    assert found, f"no run dir for {run_id} under {runs}"
    return found[0].parent


def test_a_four_node_recipe_runs_on_an_ssh_host_list_to_a_verdict(
    hosts, netns, test_image, container_run_args, tmp_path
):
    recipe, profile = _recipe_and_profile(tmp_path, hosts, netns, test_image, container_run_args)
    run_id = f"mn-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    result = cli(
        str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), "--run-id", run_id,
        "--on-interrupt", "cancel", "--yes", timeout=600,
    )  # fmt: skip
    rd = _run_dir(runs, run_id)
    assert result.returncode == 0, result.stderr[-4000:]
    assert_log_collected(rd)
    record = json.loads((rd / "run.json").read_text())
    assert [n["host"] for n in record["nodes"]] == [hosts.address(k) for k in range(NODES)]
    for k in range(NODES):  # each node ran in its own work dir
        assert (hosts.work_dir(k) / "runs" / run_id / "exit_code").read_text().strip() == "0"
    # node 0 waited for every node and GPU, then placed one actor per GPU across all four
    ray_log = (rd / "logs" / "ray.log").read_text()
    assert "all 4 nodes joined: 127.0.0.1 127.0.0.2 127.0.0.3 127.0.0.4" in ray_log
    train_log = (rd / "logs" / "train.log").read_text()
    assert (
        "placed 32 GPUs (4 actors) on 4 nodes: 127.0.0.1 x8, 127.0.0.2 x8, 127.0.0.3 x8"
        in train_log
    )
    for k in range(1, NODES):  # the workers joined node 0's Ray and ended cleanly when told
        worker = rd / "logs" / f"node-{k}"
        assert f"Local node IP: {hosts.address(k)}" in ANSI.sub(
            "", (worker / "ray.log").read_text()
        )
        assert "##reproduce stage=ray event=end status=ok" in (worker / "node.log").read_text()
    verdict = json.loads((rd / "verdict.json").read_text())
    assert verdict["status"] == "reproduced", verdict
    _nothing_left(run_id)


def test_a_worker_killed_mid_run_stops_the_run_and_the_verdict_names_it(
    hosts, netns, test_image, container_run_args, tmp_path
):
    recipe, profile = _recipe_and_profile(
        tmp_path, hosts, netns, test_image, container_run_args, STANDIN_SLEEP_S="1"
    )
    run_id = f"mk-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    proc = start_cli(
        str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), "--run-id", run_id,
        "--on-interrupt", "cancel", "--yes",
    )  # fmt: skip
    try:
        wait_for(lambda: bool(list(runs.glob(f"**/*{run_id}/run.json"))), 60, "the run dir")
        train_log = _run_dir(runs, run_id) / "logs" / "train.log"
        wait_for(lambda: "step 2:" in train_log.read_text(), 400, "training on node 0")
        victim = f"reproduce-{run_id}-node2"
        assert containers_named(victim)
        docker("kill", victim)
        killed_at = time.monotonic()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    rd = _run_dir(runs, run_id)
    assert proc.returncode == 3, err[-4000:]
    assert "node 2 (127.0.0.3)" in err and "stopped on every node" in err
    assert time.monotonic() - killed_at < 120
    status = json.loads((rd / "status.json").read_text())
    assert status["state"] == "failed" and "node 2 (127.0.0.3)" in status["detail"]
    verdict = json.loads((rd / "verdict.json").read_text())
    assert verdict["status"] == "failed"
    assert any("node-2:ray" in reason for reason in verdict["reasons"]), verdict
    timeline = json.loads((rd / "timeline.json").read_text())
    assert timeline["released_at"] is not None
    _nothing_left(run_id)
