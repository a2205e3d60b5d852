"""`reproduce nightly A B --cluster <aws profile>` end to end: two recipes, ONE launched node.

As tests/e2e/test_aws_e2e.py: the real CLI in a process, AWS a moto server on loopback, the
launched instance the sshd fixture, where each recipe's real Plan pulls the test image by digest,
starts Ray and the stand-in miles in a real container, and is measured and judged. What a user of
a nightly pays for: one RunInstances and one TerminateInstances for both recipes, two run
directories each with its verdict and timeline, the image's layers downloaded once (the second
run's pull finds them on the node), and nothing left allocated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.aws import NOTHING, aws_profile, live_with_operator_key
from support.measure import seed_raw
from support.plan_env import write_recipe

pytestmark = [pytest.mark.aws, pytest.mark.docker, pytest.mark.ssh]


def calls(run_dirs: list[Path], name: str) -> int:
    """How many times `name` was sent, by every run's call record (aws-calls.jsonl)."""
    n = 0
    for d in run_dirs:
        path = d / "aws-calls.jsonl"
        if path.is_file():
            for line in path.read_text().splitlines():
                n += json.loads(line)["operation"] == name
    return n


def test_a_nightly_of_two_recipes_launches_one_node_and_ends_it_once(
    moto_aws, sshd, test_image, container_run_args, tmp_path
):
    recipes = []
    for label in ("night-a", "night-b"):
        raw = seed_raw()
        raw["layout"]["label"] = label
        recipes.append(write_recipe(tmp_path, test_image, raw=raw, name=label))
    profile = aws_profile(moto_aws, sshd, tmp_path, container_run_args)
    runs = tmp_path / "runs"
    result = moto_aws.reproduce(
        "nightly",
        *map(str, recipes),
        "--cluster",
        str(profile),
        "--runs-dir",
        str(runs),
        "--history",
        str(tmp_path / "h.sqlite"),
        "--yes",
        timeout=600,
    )
    output = result.stdout + result.stderr
    summary = next(runs.glob("nightly-*.md"), None)
    why = (summary.read_text() if summary else "") + output[-3000:]
    assert "Traceback" not in output, why

    # what is paid for, whatever the runs' outcomes: one node, launched once, ended once
    run_dirs = sorted((p.parent for p in runs.glob("**/run.json")), key=lambda d: d.name)
    assert len(run_dirs) == 2, why
    instances = [
        i for r in moto_aws.ec2.describe_instances()["Reservations"] for i in r["Instances"]
    ]
    [instance] = instances
    assert instance["State"]["Name"] == "terminated"
    assert live_with_operator_key(moto_aws.ec2) == NOTHING
    records = [json.loads((d / "run.json").read_text()) for d in run_dirs]
    assert {r["node"]["meta"]["instance_id"] for r in records} == {instance["InstanceId"]}
    holder = next(d for d in run_dirs if (d / "aws.json").is_file())
    assert all(r["shared_node"]["holder"] == str(holder) for r in records)
    assert calls([holder], "RunInstances") == 1 and calls([holder], "TerminateInstances") == 1
    assert "node released" in output and "acquired once" in output
    for d in run_dirs:
        timeline = json.loads((d / "timeline.json").read_text())
        assert timeline["acquired_at"] < timeline["released_at"]

    # and each recipe measured and judged on it
    assert result.returncode == 0, why
    for d in run_dirs:
        assert json.loads((d / "verdict.json").read_text())["status"] == "reproduced"
        stages = json.loads((d / "timeline.json").read_text())["stages"]
        assert [s["status"] for s in stages] == ["ok"] * len(stages)
