"""Faults at every stage of an aws run; each must end with nothing running and nothing allocated.

Launch refused, instance never ready, SSH never answers, training fails (a real sshd on loopback),
Ctrl-C, SIGTERM, a second Ctrl-C during teardown, a teardown that cannot finish, the launcher
killed (SIGKILL) then `reap` or `down`, and the bad inputs that must launch nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from support.aws import (
    NOTHING,
    REPO,
    client_error,
    closed_port,
    console,
    ec2_of,
    live_resources,
    load,
    seed_recipe,
    serve_placement_groups,
    write_profile,
)
from support.aws import (
    cluster as aws_cluster,
)

from launcher.clusters.aws.cluster import AwsCluster
from launcher.clusters.aws.down import down
from launcher.clusters.aws.reap import reap
from launcher.errors import BadInput, CheckFailed, InfraError, Interrupted

pytestmark = pytest.mark.aws


def cluster(aws, ami, tmp_path, **fields):
    return aws_cluster(aws, ami, tmp_path, run_id="f1", **fields)


def run(c, tmp_path):
    """`c` driven by the real run path (Runner.execute), as `reproduce RECIPE --cluster aws` is."""
    from support.nodescript import plan_running

    from launcher.records.rundir import RunDir
    from launcher.runner.runner import Runner

    plan = plan_running("f1", str(tmp_path / "node"), "echo never reached\n")
    return Runner(measure=False, poll_s=0.05).execute(plan, RunDir(tmp_path / "run"), c)


def test_launch_refused_everywhere_names_the_alternatives_and_leaves_nothing(
    aws, ami, tmp_path, banner
):
    aws.faults["run_instances"] = client_error(
        "InsufficientInstanceCapacity", "no p5en for you", "RunInstances"
    )
    c = cluster(aws, ami, tmp_path, port=banner.port)
    with pytest.raises(InfraError) as err:
        run(c, tmp_path)
    text = str(err.value)
    assert err.value.exit_code == 3 and "InsufficientInstanceCapacity" in text
    assert (
        "reproduce capacity" in text
        and "capacity-block" in text
        and "spot" in text
        and "reservation" in text
    )
    zones = {p["NetworkInterfaces"][0]["SubnetId"] for p in aws.calls.params("run_instances")}
    assert (
        len(zones) == len(aws.calls.params("run_instances")) >= 2
    )  # every zone offering p5en was tried once
    assert live_resources(ec2_of(aws)) == NOTHING


def test_no_capacity_in_one_zone_launches_in_the_next(aws, ami, tmp_path, banner):
    tries = []
    aws.faults["run_instances"] = lambda p: (
        tries.append(p)
        or (client_error("InsufficientInstanceCapacity") if len(tries) == 1 else None)
    )
    c = cluster(aws, ami, tmp_path, port=banner.port)
    [node] = c.acquire()
    assert len(tries) == 2 and tries[0]["ClientToken"] != tries[1]["ClientToken"]
    assert node.meta["az"] != tries[0]["NetworkInterfaces"][0]["SubnetId"]
    c.release()
    assert live_resources(ec2_of(aws)) == NOTHING


def test_instance_that_never_passes_status_checks_is_torn_down(aws, ami, tmp_path, banner):
    aws.faults["describe_instance_status"] = lambda p: {
        "InstanceStatuses": [
            {
                "InstanceId": i,
                "InstanceStatus": {"Status": "initializing"},
                "SystemStatus": {"Status": "initializing"},
            }
            for i in p["InstanceIds"]
        ]
    }
    c = cluster(aws, ami, tmp_path, port=banner.port, ready_timeout_s=0.3)
    with pytest.raises(InfraError, match="status checks"):
        run(c, tmp_path)
    assert live_resources(ec2_of(aws)) == NOTHING


def test_instance_that_dies_while_starting_is_reported_and_torn_down(aws, ami, tmp_path, banner):
    real = ec2_of(aws)

    def reclaimed(params):  # AWS takes the capacity back while the instance boots (until teardown)
        if "InstanceIds" not in params or "terminate_instances" in aws.calls.names():
            return None
        resp = real.describe_instances(**params)
        for r in resp["Reservations"]:
            for i in r["Instances"]:
                i["State"] = {"Code": 32, "Name": "shutting-down"}
                i["StateReason"] = {"Message": "Server.InsufficientInstanceCapacity"}
        return resp

    aws.faults["describe_instances"] = reclaimed
    c = cluster(aws, ami, tmp_path, port=banner.port)
    with pytest.raises(InfraError, match="shutting-down.*InsufficientInstanceCapacity"):
        run(c, tmp_path)
    assert live_resources(real) == NOTHING


def test_ssh_that_never_answers_fails_within_the_timeout_and_tears_down(aws, ami, tmp_path):
    c = cluster(aws, ami, tmp_path, port=closed_port(), ready_timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(InfraError, match="SSH on 127.0.0.1:.* never answered"):
        run(c, tmp_path)
    assert time.monotonic() - t0 < 30
    assert live_resources(ec2_of(aws)) == NOTHING


@pytest.mark.ssh
def test_training_that_fails_on_the_node_still_ends_the_instance(
    aws, ami, tmp_path, sshd, runs_root
):
    from support.nodescript import plan_with_script

    from launcher.records.rundir import RunDir
    from launcher.runner.runner import Runner

    ec2 = ec2_of(aws)
    pub = open(f"{sshd.identity_file}.pub").read()
    ec2.import_key_pair(KeyName="operator", PublicKeyMaterial=pub.encode())
    aws.canned["get_console_output"] = console(sshd.host_fingerprint)  # the node's real key
    rd = RunDir.create(runs_root, "test/aws")
    c = AwsCluster(
        seed_recipe(),
        load(
            tmp_path,
            port=sshd.port,
            user=sshd.user,
            key_name="operator",
            identity_file=str(sshd.identity_file),
            ready_timeout_s=10,
        ),
        rd.run_id,
        session=aws,
        ami_resolver=lambda name: ami,
        state_path=rd.path / "aws.json",
        key_dir=tmp_path / "keys",
        poll_s=0.01,
        log=lambda m: None,
        owner="test",
    )
    node_dir = str(tmp_path / "node" / rd.run_id)
    body = (
        '_mark train start; echo "step 0 loss nan"; echo "CUDA error: out of memory" >&2; exit 9\n'
    )
    with pytest.raises(
        CheckFailed
    ) as err:  # a failed training is judged (exit 1), not an infra error
        plan = plan_with_script(rd.run_id, node_dir, body)
        Runner(poll_s=0.05, measure=False).execute(plan, rd, c)
    assert "exit code 9" in str(err.value) and err.value.exit_code == 1
    assert "step 0 loss nan" in (rd.logs / "node.log").read_text()  # the run really ran over SSH
    assert live_resources(ec2) == {
        **NOTHING,
        "key_pairs": ["operator"],
    }  # the operator's own key is untouched


def test_ctrl_c_after_launch_releases_everything(aws, ami, tmp_path, banner):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    aws.faults["describe_instance_status"] = KeyboardInterrupt()  # the instance is launched
    with pytest.raises(Interrupted) as err:
        run(c, tmp_path)
    assert err.value.exit_code == 130
    assert live_resources(ec2_of(aws)) == NOTHING


def test_sigterm_releases_everything(aws, ami, tmp_path, banner):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    before = signal.getsignal(signal.SIGTERM)
    # SIGTERM arrives once the instance is launched; the handler the run path installs takes it
    aws.faults["describe_instance_status"] = lambda params: os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(Interrupted, match="SIGTERM"):
        run(c, tmp_path)
    assert signal.getsignal(signal.SIGTERM) == before  # the previous handler is back
    assert live_resources(ec2_of(aws)) == NOTHING


def test_a_second_ctrl_c_during_teardown_does_not_stop_it(aws, ami, tmp_path, banner):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    pressed = []

    def ctrl_c_once(params):
        if not pressed:
            pressed.append(1)
            raise KeyboardInterrupt
        return None

    aws.faults["describe_instance_status"] = KeyboardInterrupt()  # the first Ctrl-C
    aws.faults["terminate_instances"] = ctrl_c_once
    with pytest.raises(Interrupted):
        run(c, tmp_path)
    assert pressed and live_resources(ec2_of(aws)) == NOTHING


def test_teardown_that_cannot_finish_says_what_is_left_and_how_to_end_it(
    aws, ami, tmp_path, banner
):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    aws.faults["delete_security_group"] = client_error(
        "UnauthorizedOperation", "no", "DeleteSecurityGroup"
    )
    with pytest.raises(InfraError) as err:  # staging fails (no real sshd), then the teardown
        run(c, tmp_path)
    text = str(err.value)
    group = json.loads((tmp_path / "run" / "aws.json").read_text())["security_group"]
    assert f"security group {group}" in text and f"reproduce down {tmp_path / 'run'}" in text
    assert live_resources(ec2_of(aws))["instances"] == []  # the instance itself is gone
    aws.faults.clear()
    down(tmp_path / "run", session=aws, poll_s=0.01, log=lambda m: None)
    assert live_resources(ec2_of(aws)) == NOTHING


def test_a_refused_termination_is_reported_at_once_with_the_instance_named(
    aws, ami, tmp_path, banner
):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    [node] = c.acquire()
    aws.faults["terminate_instances"] = client_error(
        "UnauthorizedOperation", "no", "TerminateInstances"
    )
    t0 = time.monotonic()
    with pytest.raises(InfraError) as err:
        c.release()
    assert time.monotonic() - t0 < 60  # no 20-minute wait for a termination AWS refused
    assert f"instance {node.meta['instance_id']}" in str(err.value) and "reproduce down" in str(
        err.value
    )
    aws.faults.clear()
    down(tmp_path / "run", session=aws, poll_s=0.01, log=lambda m: None)
    assert live_resources(ec2_of(aws)) == NOTHING


# --- bad input: a clear message, exit 2, nothing launched ---------------------------------------------


def test_no_credentials_launches_nothing(tmp_path, monkeypatch):
    import boto3

    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    c = AwsCluster(
        seed_recipe(),
        load(tmp_path),
        "n1",
        session=boto3.Session(region_name="us-east-1"),
        state_path=tmp_path / "aws.json",
        log=lambda m: None,
    )
    with pytest.raises(BadInput, match="no AWS credentials") as err:
        c.acquire()
    assert err.value.exit_code == 2 and not (tmp_path / "aws.json").exists()
    c.release()  # nothing to end, no credentials needed


def test_unknown_region_launches_nothing(aws, ami, tmp_path):
    c = cluster(aws, ami, tmp_path, region="us-nowhere-9")
    with pytest.raises(BadInput, match="unknown AWS region 'us-nowhere-9'"):
        c.acquire()
    assert aws.calls.names() == []


def test_instance_type_without_the_recipes_gpus_launches_nothing(aws, ami, tmp_path):
    with pytest.raises(BadInput, match="H100"):
        cluster(
            aws, ami, tmp_path, instance_type="p5.48xlarge"
        ).acquire()  # the builder's table refuses it
    c = cluster(
        aws, ami, tmp_path, instance_type="g5.48xlarge"
    )  # not in the table: describe_instance_types does
    with pytest.raises(BadInput, match="A10G") as err:
        c.acquire()
    assert err.value.exit_code == 2
    assert not [n for n in aws.calls.names() if n.startswith(("create_", "run_", "allocate_"))]


# --- the launcher killed outright, then reap or down ------------------------------------------------------

CHILD = """
import sys, time, json
sys.path.insert(0, {tests!r})
from pathlib import Path
from support.aws import seed_recipe
from launcher.inputs.profile import load_profile
from launcher.clusters.aws.cluster import AwsCluster
c = AwsCluster(seed_recipe(), load_profile({profile!r}), "killed", state_path=Path({state!r}),
               key_dir=Path({keys!r}), poll_s=0.05, owner="test", log=lambda m: None)
c.acquire()
print("acquired", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("cleanup", ["reap", "down"])
def test_launcher_killed_then_reap_or_down_ends_everything(
    moto_server, tmp_path, banner, cleanup, monkeypatch
):
    import boto3

    serve_placement_groups(monkeypatch)  # reap's listing needs them answered, not failed

    ec2 = boto3.client("ec2", region_name="us-east-1")
    image = ec2.register_image(Name="dlami-standin", RootDeviceName="/dev/sda1")["ImageId"]
    profile = write_profile(tmp_path, port=banner.port, ami=image, ready_timeout_s=30)
    state = tmp_path / "run" / "aws.json"
    code = CHILD.format(
        tests=str(REPO / "tests"),
        profile=str(profile),
        state=str(state),
        keys=str(tmp_path / "keys"),
    )
    errors = tmp_path / "child.err"
    with open(errors, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            start_new_session=True,
        )
    try:
        line = proc.stdout.readline()  # EOF (empty) if the child fails
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher dies without any teardown
        proc.wait()
    assert line.strip() == "acquired", errors.read_text()[-3000:]
    assert live_resources(ec2)["instances"]  # the launcher died holding an instance
    session = boto3.Session(region_name="us-east-1")
    if cleanup == "reap":
        assert (
            reap("us-east-1", owner="test", session=session, poll_s=0.01, log=lambda m: None) == []
        )  # not expired yet
        ended = reap(
            "us-east-1",
            owner="test",
            now=datetime.now(UTC) + timedelta(hours=7),
            session=session,
            poll_s=0.01,
            log=lambda m: None,
            key_dir=tmp_path / "keys",
        )
        assert ended and ended[0].startswith("instance ")
    else:
        down(tmp_path / "run", session=session, poll_s=0.01, log=lambda m: None)
    assert live_resources(ec2) == NOTHING
    assert not list((tmp_path / "keys").glob("reproduce-killed-*.pem"))
