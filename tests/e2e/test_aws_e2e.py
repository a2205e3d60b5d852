"""`reproduce RECIPE --cluster <aws profile>` end to end, as a user runs it: the real CLI in a process.

AWS is a moto server on loopback (AWS_ENDPOINT_URL, fake credentials in the CLI's environment only);
the launched "instance" is reached at connect_host 127.0.0.1, the sshd fixture, where the real Plan
pulls the test image by digest, starts Ray and the stand-in miles in a real container, and the run is
measured and judged. What a paying user cares about: the verdict, a complete run directory, and that
nothing the run created is still allocated (or, with --keep, exactly the instance, its price and the
command that ends it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.aws import NOTHING, OPERATOR_KEY, REPO, MotoAws, aws_profile, live_resources
from support.docker import containers_named
from support.helpers import assert_log_collected
from support.plan_env import assert_run_stages, write_recipe

pytestmark = [pytest.mark.aws, pytest.mark.docker, pytest.mark.ssh]


def the_run_dir(runs: Path, result: subprocess.CompletedProcess) -> Path:
    found = list(runs.glob("**/run.json"))
    assert len(found) == 1, result.stdout + result.stderr
    return found[0].parent


def explain(result: subprocess.CompletedProcess, rd: Path) -> str:
    log = rd / "logs" / "node.log"
    return result.stdout + result.stderr + (log.read_text()[-4000:] if log.is_file() else "")


def left_by_the_run(moto: MotoAws) -> dict[str, Any]:
    """What is still allocated, the operator's own key pair aside (it is not the run's to delete)."""
    live = live_resources(moto.ec2)
    assert OPERATOR_KEY in live["key_pairs"]  # untouched
    live["key_pairs"].remove(OPERATOR_KEY)
    return live


NOTHING_LEFT = dict(NOTHING)


def state_of(rd: Path) -> dict[str, Any]:
    """aws.json: what the run created and has not yet ended (moto cannot list placement groups, so
    the one-node run's `placement_group: null` here is the check that none is left)."""
    return json.loads((rd / "aws.json").read_text())


def assert_state_released(state: dict[str, Any]) -> None:
    """The run's own record says nothing it created is left (what `reproduce down` would act on)."""
    assert state["released"] is True and state["left"] == []
    assert state["instances"] == state["addresses"] == [] and state["key_pair"] is None
    assert state["security_group"] is None and state["placement_group"] is None


def no_container_of(rd: Path) -> bool:
    run_id = json.loads((rd / "run.json").read_text())["run_id"]
    return containers_named(f"reproduce-{run_id}") == []


def launched(moto: MotoAws) -> list[dict]:
    return [i for r in moto.ec2.describe_instances()["Reservations"] for i in r["Instances"]]


def test_reproduce_on_aws_end_to_end(moto_aws, sshd, test_image, container_run_args, tmp_path):
    recipe = write_recipe(tmp_path, test_image)
    profile = aws_profile(moto_aws, sshd, tmp_path, container_run_args)
    runs = tmp_path / "runs"
    result = moto_aws.reproduce(
        str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), "--yes"
    )
    rd = the_run_dir(runs, result)
    assert result.returncode == 0, explain(result, rd)
    assert "verdict: reproduced" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert_log_collected(rd)

    state = state_of(rd)
    [instance] = launched(moto_aws)
    assert instance["InstanceType"] == "p5en.48xlarge"  # the recipe's gpu.instance
    assert instance["State"]["Name"] == "terminated"
    assert state["terminated"] == [instance["InstanceId"]] and state["nodes"][0]["meta"]["launched"]
    assert_state_released(state)
    assert (
        "aws: everything this run created is gone" in result.stdout + result.stderr
    )  # the user is told
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    assert any(rd.name in value for value in tags.values()), (
        tags
    )  # tagged with the run (reap finds it)

    timeline = json.loads((rd / "timeline.json").read_text())
    assert timeline["acquired_at"] and timeline["released_at"]
    assert timeline["acquired_at"] <= timeline["released_at"]
    stages = timeline["stages"]
    assert_run_stages([s["name"] for s in stages])
    assert all(s["status"] == "ok" for s in stages), stages
    for name in (
        "recipe.yaml",
        "profile.yaml",
        "plan.json",
        "node.sh",
        "result.yaml",
        "verdict.json",
    ):
        assert (rd / name).is_file(), name
    assert json.loads((rd / "verdict.json").read_text())["status"] == "reproduced"
    assert (
        " - step 19: " in (rd / "logs" / "train.log").read_text()
    )  # the training really ran over SSH

    assert left_by_the_run(moto_aws) == NOTHING_LEFT
    assert no_container_of(rd)


def test_failed_training_on_aws_is_exit_1_and_leaves_nothing(
    moto_aws, sshd, test_image, container_run_args, tmp_path
):
    recipe = write_recipe(tmp_path, test_image)
    profile = aws_profile(
        moto_aws, sshd, tmp_path, container_run_args, env={"STANDIN_FAIL_AT": "3"}
    )
    runs = tmp_path / "runs"
    result = moto_aws.reproduce(
        str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), "--yes"
    )
    rd = the_run_dir(runs, result)
    assert result.returncode == 1, explain(result, rd)
    assert "illegal memory access" in result.stderr  # the training's own error reaches the user...
    assert f"{REPO / 'launcher'}" not in result.stderr  # ...and the launcher itself did not crash
    assert json.loads((rd / "verdict.json").read_text())["status"] == "failed"
    timeline = json.loads((rd / "timeline.json").read_text())
    assert timeline["released_at"]
    assert [s["status"] for s in timeline["stages"] if s["name"] == "train"] == ["failed"]
    [instance] = launched(moto_aws)
    assert instance["State"]["Name"] == "terminated"
    assert_state_released(state_of(rd))
    assert left_by_the_run(moto_aws) == NOTHING_LEFT
    assert no_container_of(rd)


def test_keep_leaves_only_the_instance_priced_and_down_ends_it(
    moto_aws, sshd, test_image, container_run_args, tmp_path
):
    recipe = write_recipe(tmp_path, test_image)
    profile = aws_profile(moto_aws, sshd, tmp_path, container_run_args)
    runs = tmp_path / "runs"
    result = moto_aws.reproduce(
        str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), "--keep", "--yes"
    )
    rd = the_run_dir(runs, result)
    assert result.returncode == 0, explain(result, rd)
    assert "verdict: reproduced" in result.stderr
    output = result.stdout + result.stderr
    [instance] = launched(moto_aws)
    iid = instance["InstanceId"]
    assert instance["State"]["Name"] == "running"
    assert (
        f"kept {iid}" in output and "$63.30/h" in output
    )  # the profile's price_per_hour, per hour
    assert f"reproduce down {rd}" in output
    state = state_of(rd)
    kept = left_by_the_run(moto_aws)
    # the instance and what it needs to stay reachable (its security group, its Elastic IP) stay with it
    assert kept == {
        "instances": [iid],
        "security_groups": [state["security_group"]],
        "addresses": [a["allocation_id"] for a in state["addresses"]],
        "key_pairs": [],
    }
    assert state["instances"] == [iid] and state["placement_group"] is None
    assert (
        len(state["addresses"]) == 1
    )  # p5en's 16 interfaces get no public address: the run attached one

    ended = moto_aws.reproduce("down", str(rd), "--runs-dir", str(runs), timeout=120)
    assert ended.returncode == 0, ended.stdout + ended.stderr
    assert iid in ended.stdout
    assert left_by_the_run(moto_aws) == NOTHING_LEFT
    assert launched(moto_aws)[0]["State"]["Name"] == "terminated"
    assert_state_released(state_of(rd))
