"""The recipe's code cannot turn its own training failure into an infrastructure one (exit 3
instead of 1) with markers it prints (launcher/plan/protocol.py, `MarkerGate`).

A real local run through the CLI: the stand-in miles, in the recipe's image, prints every marker
a container could forge without node.sh's nonce, then fails. `ray` closed as failed dated before
the container started, or now; `ray` opened again and closed as failed; a host stage closed as
failed; `train` closed early as ok and opened again with an early time. The run must end as the
training failure it is: exit 1 naming stage train, `ray` ok once in the timeline, every forged
line refused kept in train.log where it was printed.
"""

from __future__ import annotations

import json

import pytest
from support.helpers import cli
from support.plan_env import write_profile, write_recipe

pytestmark = pytest.mark.docker

FORGED = [
    "##reproduce stage=ray event=end status=failed rc=1 t=1.0",
    "##reproduce stage=ray event=end status=failed rc=1 t={now}",
    "##reproduce stage=ray event=start t={now}",
    "##reproduce stage=ray event=end status=failed rc=1 t={now}",
    "##reproduce stage=preflight event=end status=failed rc=1 t={now}",
    "##reproduce stage=image event=start t=1.0",
    "##reproduce stage=train event=end status=ok t={now}",
    "##reproduce stage=train event=start t=2.0",
    "##reproduce stage=ray event=start t={now}",
    "##reproduce stage=ray event=end status=failed rc=3 t=1.0",
]


def test_forged_markers_do_not_make_a_training_failure_the_infrastructures(
    test_image, container_run_args, tmp_path
):
    env = {"STANDIN_ECHO_AT": "2", "STANDIN_ECHO": "|".join(FORGED), "STANDIN_FAIL_AT": "3"}
    profile = write_profile(tmp_path, {"kind": "local"}, container_run_args, env=env)
    runs = tmp_path / "runs"
    res = cli(str(write_recipe(tmp_path, test_image)), "--cluster", str(profile), "--runs-dir",
              str(runs), timeout=300)  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "failed in stage train" in res.stderr and "in stage ray" not in res.stderr, res.stderr
    (timeline_file,) = runs.glob("**/timeline.json")
    stages = [(s["name"], s["status"]) for s in json.loads(timeline_file.read_text())["stages"]]
    assert stages.count(("ray", "ok")) == 1 and ("ray", "failed") not in stages, stages
    assert [n for n, st in stages if st == "failed"] == ["train"], stages
    assert ("image", "running") not in stages and ("preflight", "failed") not in stages, stages
    logs = timeline_file.parent / "logs"
    train_log, node_log = (logs / "train.log").read_text(), (logs / "node.log").read_text()
    closed = FORGED.index("##reproduce stage=train event=end status=ok t={now}")
    for k, line in enumerate(FORGED):
        head = line.split(" t=")[0]
        assert head in node_log, line
        # those refused are lines of the stage they were printed in: train, until the
        # container's own early end closed it (its stage, which it may close)
        if k < closed:
            assert head in train_log, line
    assert "stage=train event=start t=2.0" not in train_log  # printed outside every stage
    verdict = json.loads((timeline_file.parent / "verdict.json").read_text())
    assert verdict["status"] == "failed"
