"""Only what this launch created is ever ended: the real AwsCluster and `down` against moto.

Every resource carries the run's tags plus a per-launch id; teardown, `down` and discovery end
only what carries both, whatever aws.json says. The cases: a reused run id, an aws.json forged
by the node (other instances listed, another run's identity copied in), a corrupt aws.json, other
credentials (another account), a crash between RunInstances and the state write, and EC2's
eventual consistency (an instance just launched that describe does not show yet).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.aws import (
    NOTHING,
    REPO,
    client_error,
    cluster,
    ec2_of,
    live_resources,
    quiet_down,
)

from launcher.clusters.aws import BACKEND
from launcher.errors import BadInput, InfraError, Interrupted

pytestmark = pytest.mark.aws


def instance_state(ec2, iid: str) -> str:
    found = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    return found["State"]["Name"]


# --- a reused run id ------------------------------------------------------------------------------


def test_a_reused_run_id_never_adopts_the_other_launchs_resources(aws, ami, tmp_path, banner):
    ec2 = ec2_of(aws)
    first = cluster(aws, ami, tmp_path, "a", run_id="same", port=banner.port, keep=True)
    [kept] = first.acquire()
    first.release()  # --keep: instance, Elastic IP, security group and key pair stay
    kept_before = live_resources(ec2)
    assert kept_before["instances"] == [kept.meta["instance_id"]]

    # a second launch with the same run id launches (its names do not collide) and then fails
    second = cluster(aws, ami, tmp_path, "b", run_id="same", port=banner.port)
    [other] = second.acquire()
    assert other.meta["instance_id"] != kept.meta["instance_id"]
    second.release()
    assert live_resources(ec2) == kept_before  # the first launch's resources are untouched
    assert instance_state(ec2, kept.meta["instance_id"]) == "running"

    ended, _ = quiet_down(tmp_path / "a", aws)
    assert f"instance {kept.meta['instance_id']}" in ended
    assert live_resources(ec2) == NOTHING


def test_a_reused_run_id_that_fails_to_launch_leaves_the_kept_one(aws, ami, tmp_path, banner):
    ec2 = ec2_of(aws)
    first = cluster(aws, ami, tmp_path, "a", run_id="same", port=banner.port, keep=True)
    first.acquire()
    first.release()
    kept_before = live_resources(ec2)
    aws.faults["run_instances"] = client_error("InsufficientInstanceCapacity", "none", "Run")
    second = cluster(aws, ami, tmp_path, "b", run_id="same", port=banner.port)
    with pytest.raises(InfraError, match="InsufficientInstanceCapacity"):
        second.acquire()
    second.release()
    assert live_resources(ec2) == kept_before
    aws.faults.clear()
    quiet_down(tmp_path / "a", aws)
    assert live_resources(ec2) == NOTHING


# --- aws.json forged by the node ------------------------------------------------------------------


def test_a_forged_aws_json_ends_no_unrelated_instance_and_not_the_kept_one_spared(
    aws, ami, tmp_path, banner
):
    ec2 = ec2_of(aws)
    c = cluster(aws, ami, tmp_path, port=banner.port, keep=True)
    [node] = c.acquire()
    mine = node.meta["instance_id"]
    unrelated = ec2.run_instances(ImageId=ami, InstanceType="t3.micro", MinCount=1, MaxCount=1)[
        "Instances"
    ][0]["InstanceId"]
    # collection brought back an aws.json written on the node: it lists someone else's instance
    path = tmp_path / "run" / "aws.json"
    forged = json.loads(path.read_text())
    forged["instances"] = [unrelated]
    path.write_text(json.dumps(forged))
    c.release()  # --keep: the launcher writes back what it really launched
    assert json.loads(path.read_text())["instances"] == [mine]

    path.write_text(json.dumps(forged))  # forged again, after the launcher's last word
    _, lines = quiet_down(tmp_path / "run", aws)
    assert instance_state(ec2, unrelated) == "running"  # not this launch's: never ended
    assert instance_state(ec2, mine) == "terminated"  # found by its tags all the same
    assert any(unrelated in line and "not this launch" in line for line in lines), lines
    ec2.terminate_instances(InstanceIds=[unrelated])


def test_an_aws_json_copied_from_another_run_ends_only_this_runs_resources(
    aws, ami, tmp_path, banner
):
    """The node copies another run's identity (run id, launch id, ids) into this run's aws.json."""
    ec2 = ec2_of(aws)
    victim = cluster(aws, ami, tmp_path, "victim", run_id="victim", port=banner.port, keep=True)
    [victim_node] = victim.acquire()
    victim.release()
    this = cluster(aws, ami, tmp_path, "this", run_id="this", port=banner.port, keep=True)
    [this_node] = this.acquire()
    this.release()
    victim_state = (tmp_path / "victim" / "aws.json").read_text()
    (tmp_path / "this" / "aws.json").write_text(victim_state)

    _, lines = quiet_down(tmp_path / "this", aws)
    assert instance_state(ec2, victim_node.meta["instance_id"]) == "running"
    assert instance_state(ec2, this_node.meta["instance_id"]) == "terminated"
    assert any("launcher's own record" in line for line in lines), lines
    quiet_down(tmp_path / "victim", aws)
    assert live_resources(ec2) == NOTHING


def test_down_refuses_an_instance_of_another_launch_listed_in_aws_json(aws, ami, tmp_path, banner):
    """Without the launcher's own record (another machine): the tags alone decide."""
    ec2 = ec2_of(aws)
    other = cluster(aws, ami, tmp_path, "other", run_id="o1", port=banner.port, keep=True)
    [other_node] = other.acquire()
    other.release()
    this = cluster(aws, ami, tmp_path, "this", run_id="o1", port=banner.port, keep=True)
    [this_node] = this.acquire()
    this.release()
    for ledger in (tmp_path / "state").rglob("launch-*.json"):
        ledger.unlink()  # as if the run had been launched from another machine
    path = tmp_path / "this" / "aws.json"
    state = json.loads(path.read_text())
    state["instances"].append(other_node.meta["instance_id"])
    path.write_text(json.dumps(state))
    _, lines = quiet_down(tmp_path / "this", aws)
    assert instance_state(ec2, other_node.meta["instance_id"]) == "running"
    assert instance_state(ec2, this_node.meta["instance_id"]) == "terminated"
    assert any("not this launch" in line for line in lines), lines
    quiet_down(tmp_path / "other", aws)
    assert live_resources(ec2) == NOTHING


# --- other credentials -----------------------------------------------------------------------------


def test_down_with_another_accounts_credentials_does_not_report_success(
    aws, ami, tmp_path, banner, monkeypatch
):
    ec2 = ec2_of(aws)
    c = cluster(aws, ami, tmp_path, port=banner.port, keep=True)
    [node] = c.acquire()
    c.release()
    monkeypatch.setenv("MOTO_ACCOUNT_ID", "222222222222")  # other credentials: another account
    with pytest.raises(BadInput) as err:
        quiet_down(tmp_path / "run", aws)
    text = str(err.value)
    assert "222222222222" in text and "123456789012" in text and "nothing was ended" in text
    monkeypatch.delenv("MOTO_ACCOUNT_ID")
    assert instance_state(ec2, node.meta["instance_id"]) == "running"
    assert json.loads((tmp_path / "run" / "aws.json").read_text())["instances"] == [
        node.meta["instance_id"]
    ]
    quiet_down(tmp_path / "run", aws)
    assert live_resources(ec2) == NOTHING


# --- corrupt state files -----------------------------------------------------------------------------


def test_down_with_a_corrupt_aws_json_finds_the_runs_resources_by_tag(aws, ami, tmp_path, banner):
    ec2 = ec2_of(aws)
    c = cluster(aws, ami, tmp_path, port=banner.port, keep=True)
    [node] = c.acquire()
    c.release()
    (tmp_path / "run" / "run.json").write_text(
        json.dumps({"run_id": "o1", "cluster": c.to_record()})
    )
    (tmp_path / "run" / "aws.json").write_text('{"instances": ["i-0123"')  # cut short
    ended, lines = quiet_down(tmp_path / "run", aws)
    assert any("aws.json" in line and "not valid JSON" in line for line in lines), lines
    assert f"instance {node.meta['instance_id']}" in ended
    assert live_resources(ec2) == NOTHING


def test_down_with_corrupt_aws_json_and_run_json_uses_the_given_region(aws, ami, tmp_path, banner):
    ec2 = ec2_of(aws)
    c = cluster(aws, ami, tmp_path, port=banner.port, keep=True)
    c.acquire()
    c.release()
    for ledger in (tmp_path / "state").rglob("launch-*.json"):
        ledger.unlink()  # launched from another machine: no record of it here
    (tmp_path / "run" / "run.json").write_text("not json")
    (tmp_path / "run" / "aws.json").write_bytes(b"\x00\xff garbage")
    with pytest.raises(BadInput) as err:  # no region anywhere: say which file and what to give
        quiet_down(tmp_path / "run", aws)
    assert "aws.json" in str(err.value) and "--region" in str(err.value)
    assert err.value.exit_code == 2
    quiet_down(tmp_path / "run", aws, region="us-east-1", run_id="o1")
    assert live_resources(ec2) == NOTHING


def test_a_corrupt_aws_json_does_not_stop_a_recorded_runs_release(aws, ami, tmp_path, banner):
    """attach/cancel find the cluster from run.json; a corrupt aws.json still releases by tag."""
    c = cluster(aws, ami, tmp_path, port=banner.port)
    record = c.to_record()
    c.acquire()
    (tmp_path / "run" / "aws.json").write_text("{")
    again = BACKEND.from_record(record, log=lambda line: None)
    again._session = aws
    again.poll_s = 0.01
    again.release()
    assert live_resources(ec2_of(aws)) == NOTHING


CORRUPT_DOWN = """
import sys
sys.argv = ["reproduce", "down", {run!r}]
from launcher.commands.cli import app
app()
"""


def test_the_down_command_with_a_corrupt_aws_json_and_no_region_exits_2_without_traceback(
    tmp_path,
):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    (run / "aws.json").write_text("[1, 2")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PYTHONPATH=str(REPO), AWS_EC2_METADATA_DISABLED="true")
    proc = subprocess.run(
        [sys.executable, "-c", CORRUPT_DOWN.format(run=str(run))],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and f"{run / 'aws.json'}" in proc.stderr


# --- a crash between RunInstances and the state write; eventual consistency --------------------------


def hidden_for(aws, calls: int):
    """describe_instances does not show instances yet for the first `calls` calls (EC2 lag)."""
    real = ec2_of(aws)
    seen = []

    def describe(params):
        seen.append(1)
        if len(seen) > calls:
            return None
        if params.get("InstanceIds"):
            return client_error("InvalidInstanceID.NotFound", "not yet", "DescribeInstances")
        resp = real.describe_instances(**params)
        for r in resp["Reservations"]:
            r["Instances"] = []
        return resp

    return describe


def test_ctrl_c_during_run_instances_ends_what_it_launched_once_ec2_shows_it(
    aws, ami, tmp_path, banner
):
    from support.nodescript import plan_running

    from launcher.records.rundir import RunDir
    from launcher.runner.runner import Runner

    real = ec2_of(aws)

    def launched_then_ctrl_c(params):  # AWS launched it; the answer never reached the launcher
        real.run_instances(**params)
        aws.faults["describe_instances"] = hidden_for(aws, 3)
        return KeyboardInterrupt()

    aws.faults["run_instances"] = launched_then_ctrl_c
    c = cluster(aws, ami, tmp_path, port=banner.port)
    plan = plan_running("o1", str(tmp_path / "node"), "echo never reached\n")
    with pytest.raises(Interrupted):
        Runner(measure=False, poll_s=0.05).execute(plan, RunDir(tmp_path / "run"), c)
    assert live_resources(real) == NOTHING


def test_an_instance_not_yet_visible_is_not_counted_as_gone(aws, ami, tmp_path, banner):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    [node] = c.acquire()
    refused = []

    def not_yet(params):  # right after launch EC2 may not know the id yet
        if len(refused) < 2:
            refused.append(params)
            return client_error("InvalidInstanceID.NotFound", "not yet", "TerminateInstances")
        return None

    aws.faults["terminate_instances"] = not_yet
    aws.faults["describe_instances"] = hidden_for(aws, 2)
    c.release()
    assert instance_state(ec2_of(aws), node.meta["instance_id"]) == "terminated"
    assert live_resources(ec2_of(aws)) == NOTHING
