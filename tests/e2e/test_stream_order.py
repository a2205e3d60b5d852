"""A container's output reaches node.log in the order it was printed, however docker schedules
its two streams (issue 22: "a window step lost from a run's log").

`docker run` without a terminal carries a container's stdout and stderr as two streams, each copied
by a goroutine of its own (containerd's shim, dockerd, the attach) and written by the client to
node.log when it arrives: their order relative to each other is whatever the scheduler made of it.
Stage markers are printed on stdout (bash's printf) and miles logs on stderr, so on a busy machine
the train stage's end marker reached node.log ahead of fifteen steps of log lines (or its start
marker behind the first six), and those steps were in no stage's log: "window steps missing".

The model here is deterministic, not a timing hope: a `docker` ahead of the real one on PATH runs
every attached `docker run` for real (the real node script, the test image, the stand-in miles),
keeps the container's two streams apart, and delivers one whole before the other, the two ends of
what docker's copies may do. Every step is in logs/train.log, the verdict is the idle machine's,
and the collected node.log is the node's byte for byte, in both orders.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.helpers import assert_log_collected
from support.plan_env import plan_for, write_profile, write_recipe

from launcher.clusters.local import LocalCluster
from launcher.records.rundir import RunDir
from launcher.runner.runner import Runner

pytestmark = pytest.mark.docker

# `docker run` (attached) with the container's stdout and stderr kept apart, then written out one
# after the other: ORDER=stdout-first (stderr as late as it can be) or stderr-first. Every other
# docker command is the real one's.
SPLIT_DOCKER = """#!/bin/bash
real={real}
if [ "${{1:-}}" != run ]; then exec "$real" "$@"; fi
for word in "$@"; do
  case "$word" in -d|--detach) exec "$real" "$@";; esac
done
out="$(mktemp)"; err="$(mktemp)"
"$real" "$@" >"$out" 2>"$err" </dev/null
rc=$?
if [ "{order}" = stdout-first ]; then cat "$out"; cat "$err" >&2; else cat "$err" >&2; cat "$out"; fi
rm -f "$out" "$err"
exit "$rc"
"""


def split_docker(bin_dir: Path, order: str) -> None:
    real = shutil.which("docker")
    assert real, "docker is not installed"
    bin_dir.mkdir()
    shim = bin_dir / "docker"
    shim.write_text(SPLIT_DOCKER.format(real=real, order=order))
    shim.chmod(0o755)


@pytest.mark.parametrize("order", ["stdout-first", "stderr-first"])
def test_every_step_is_in_the_train_log_whatever_order_docker_delivers_the_streams_in(
    test_image, container_run_args, tmp_path, runs_root, monkeypatch, order
):
    split_docker(tmp_path / "bin", order)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    recipe = write_recipe(tmp_path, test_image, run_prefix="echo run-block-on-stdout")
    plan = plan_for(recipe, write_profile(tmp_path, {"kind": "local"}, container_run_args))
    rd = RunDir.create(runs_root, plan.recipe.slug, plan.run_id)
    outcome = Runner(poll_s=0.2).execute(plan, rd, LocalCluster())
    node_log = Path(plan.node_run_dir, "node.log").read_text()
    assert outcome.state == "done", node_log[-3000:]
    assert_log_collected(rd.path)
    stages = rd.timeline().stages
    assert [(s.name, s.status) for s in stages][-2:] == [("ray", "ok"), ("train", "ok")]
    train_log = (rd.logs / "train.log").read_text()
    for step in range(20):  # the doubled step line and the train actor's perf line of each
        assert train_log.count(f" - step {step}: ") == 2, (step, order, node_log[-4000:])
        assert f" - perf {step}: {{'perf/train_wait_time'" in train_log, (step, order)
    assert "run-block-on-stdout" in train_log and "training finished" in train_log
    assert "Local node IP: 127.0.0.1" in (rd.logs / "ray.log").read_text()
    _, verdict = outcome.measurement
    assert (rd.path / "steps.jsonl").read_text().count("\n") == 20
    assert verdict.status == "reproduced", verdict
