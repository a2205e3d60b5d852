"""End to end through the real Plan: `reproduce RECIPE --cluster <ssh profile>` against the sshd
fixture, a real dockerd, the image pulled by digest from the local registry, Ray and the stand-in
miles inside the container, logs streamed back, measured and judged. And the fast failures: an
unreachable host and an unknown host key give exit 3 with the cause, and leave nothing behind."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from support.docker import containers_named
from support.helpers import assert_log_collected, cli
from support.plan_env import assert_run_stages, write_profile, write_recipe

pytestmark = [pytest.mark.docker, pytest.mark.ssh]


def test_reproduce_recipe_over_ssh_end_to_end(sshd, test_image, container_run_args, tmp_path):
    recipe = write_recipe(tmp_path, test_image)
    profile = write_profile(tmp_path, sshd.profile(), container_run_args)
    runs = tmp_path / "runs"
    result = cli(
        str(recipe),
        "--cluster",
        str(profile),
        "--runs-dir",
        str(runs),
        "--on-interrupt",
        "cancel",
        timeout=400,
    )
    run_dirs = list(runs.glob("**/run.json"))
    assert len(run_dirs) == 1, result.stderr
    rd = run_dirs[0].parent
    assert result.returncode == 0, result.stderr + (rd / "logs" / "node.log").read_text()[-4000:]
    assert "verdict: reproduced" in result.stderr
    for name in (
        "recipe.yaml",
        "profile.yaml",
        "plan.json",
        "node.sh",
        "timeline.json",
        "steps.jsonl",
        "result.yaml",
        "verdict.json",
    ):
        assert (rd / name).is_file(), name
    assert (rd / "recipe.yaml").read_bytes() == recipe.read_bytes()
    assert_log_collected(rd)
    stages = json.loads((rd / "timeline.json").read_text())["stages"]
    assert_run_stages([s["name"] for s in stages])
    assert all(s["status"] == "ok" for s in stages)
    assert " - step 19: " in (rd / "logs" / "train.log").read_text()
    # --network none: the container has only loopback, so Ray cannot bind anything else
    assert "Local node IP: 127.0.0.1" in (rd / "logs" / "ray.log").read_text()
    assert json.loads((rd / "verdict.json").read_text())["status"] == "reproduced"
    assert json.loads((rd / "status.json").read_text())["state"] == "done"
    from launcher.inputs.recipe import load_recipe
    from launcher.records.history import runs as history_runs

    (row,) = history_runs(
        load_recipe(recipe).slug, db=Path(os.environ["REPRODUCE_HOME"]) / "history.sqlite"
    )  # joined the user's history
    assert row.verdict == "reproduced" and row.run_id == rd.name
    assert (
        containers_named(f"reproduce-{json.loads((rd / 'run.json').read_text())['run_id']}") == []
    )


def test_unreachable_host_is_exit_3_within_the_connect_timeout(
    sshd, test_image, container_run_args, tmp_path
):
    recipe = write_recipe(tmp_path, test_image)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)  # accepts TCP, never speaks SSH: a black hole that must not hang the launcher
        profile = write_profile(
            tmp_path,
            sshd.profile(),
            container_run_args,
            port=s.getsockname()[1],
            connect_timeout_s=2,
        )
        t0 = time.monotonic()
        result = cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(tmp_path / "runs"))
        elapsed = time.monotonic() - t0
    assert result.returncode == 3, result.stderr
    assert "connect_timeout_s=2" in result.stderr and "Traceback" not in result.stderr
    assert elapsed < 20  # interpreter start-up included


def test_unknown_host_key_is_exit_3_and_names_the_cause(
    sshd, test_image, container_run_args, tmp_path
):
    recipe = write_recipe(tmp_path, test_image)
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    profile = write_profile(tmp_path, sshd.profile(), container_run_args, known_hosts=str(empty))
    result = cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode == 3, result.stderr
    assert "unknown host" in result.stderr and sshd.host_fingerprint in result.stderr
    assert not (tmp_path / "work").exists()  # nothing was staged on the node
