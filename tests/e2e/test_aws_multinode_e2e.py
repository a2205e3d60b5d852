"""`reproduce RECIPE --cluster <aws profile>` for a 4-node recipe, end to end through the CLI.

AWS is a moto server on loopback (as in tests/test_aws_e2e.py). The launch goes into a moto
subnet of 127.0.0.0/24, so the 4 instances' private addresses are 127.0.0.4-7; the head is the
session's sshd (dialled at connect_host 127.0.0.1, its one Elastic IP allocated in moto), the
others are sshd listening on 127.0.0.5-7 only, reached through the head. The real Plan runs on
every node: the image pulled by digest, Ray's head on 127.0.0.4 and its workers on 127.0.0.5-7
(every container in one loopback-only network namespace, tests/support/multinode.py), and the
stand-in miles placing one actor per GPU across the 4 nodes. The CLI is entered through
tests/e2e/aws_one_host.py, which only gives each node a work dir of its own (they share this disk).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.aws import LOOPBACK_SUBNET, LOOPBACK_VPC, NOTHING, OPERATOR_KEY, live_with_operator_key
from support.cli import FOUR_NODES
from support.docker import containers_named, docker
from support.helpers import assert_log_collected, processes_mentioning, wait_for
from support.multinode import Netns
from support.paths import TESTS
from support.plan_env import write_profile, write_recipe

from launcher.inputs.recipe import load_recipe

pytestmark = [
    pytest.mark.aws,
    pytest.mark.multinode,
    pytest.mark.ssh,
    pytest.mark.docker,
    pytest.mark.timeout(900),
]
ENTRY = TESTS / "e2e" / "aws_one_host.py"
PRIVATE = ["127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7"]


@pytest.fixture(scope="module")
def netns(test_image, container_run_args):
    holder = Netns(test_image.ref, container_run_args).start()
    yield holder
    holder.stop()


def setup(moto, sshd, netns, test_image, run_args, tmp_path: Path, **env: str):
    """The 4-node recipe on the test image and an aws profile whose nodes are the loopback sshd."""
    ec2 = moto.ec2
    ami = ec2.register_image(Name="dlami-standin", RootDeviceName="/dev/sda1")["ImageId"]
    pub = Path(f"{sshd.identity_file}.pub").read_bytes()
    ec2.import_key_pair(KeyName=OPERATOR_KEY, PublicKeyMaterial=pub)
    vpc = ec2.create_vpc(CidrBlock=LOOPBACK_VPC)["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=LOOPBACK_SUBNET, AvailabilityZone="us-east-1a")
    recipe = write_recipe(
        tmp_path, test_image, raw=yaml.safe_load(FOUR_NODES.read_text()), name="standin-4node"
    )
    r = load_recipe(recipe)
    step_s = r.tokens_per_step / r.claim.tokens_per_s_per_gpu / r.gpu_count
    base = {
        "kind": "aws",
        "region": "us-east-1",
        "ami": ami,
        "subnet_id": subnet["Subnet"]["SubnetId"],
        "key_name": OPERATOR_KEY,
        "identity_file": str(sshd.identity_file),
        "user": sshd.user,
        "port": sshd.port,
        "connect_host": "127.0.0.1",
        "connect_timeout_s": 5,
        "ssh_cidr": "127.0.0.1/32",
        "ready_timeout_s": 60,
        "host_key_wait_s": 1,  # a moto server's console shows no fingerprints: trusted on first use
    }
    profile = write_profile(
        tmp_path,
        base,
        run_args,
        docker={"network": netns.network},
        env={"STANDIN_STEP_TIME_S": f"{step_s:.4f}", "STANDIN_STARTUP_S": "0", **env},
        ray={"port": 6379, "join_timeout_s": 120},
    )
    moto.entry = ENTRY
    moto.env["REPRODUCE_TEST_NODE_WORK_ROOT"] = str(tmp_path / "hosts")
    moto.env["REPRODUCE_TEST_HEALTH_EVERY_S"] = "1"
    return recipe, profile


def run_dir(runs: Path, run_id: str) -> Path:
    found = list(runs.glob(f"**/*{run_id}/run.json"))
    assert found, f"no run dir for {run_id} under {runs}"
    return found[0].parent


def nothing_left(moto, run_id: str) -> None:
    assert live_with_operator_key(moto.ec2) == NOTHING
    assert not docker("ps", "-aq", "--filter", f"name=reproduce-{run_id}").stdout.split()
    assert not processes_mentioning(run_id)


def calls_of(rd: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (rd / "aws-calls.jsonl").read_text().splitlines()]


def test_a_four_node_recipe_runs_on_aws_to_a_verdict(
    moto_aws, sshd, loopback_nodes, netns, test_image, container_run_args, tmp_path
):
    recipe, profile = setup(moto_aws, sshd, netns, test_image, container_run_args, tmp_path)
    run_id = f"am-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    result = moto_aws.reproduce(
        str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), "--run-id", run_id,
        "--on-interrupt", "cancel", "--yes", timeout=800,
    )  # fmt: skip
    rd = run_dir(runs, run_id)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "verdict: reproduced" in result.stderr
    assert_log_collected(rd)
    record = json.loads((rd / "run.json").read_text())
    assert [n["host"] for n in record["nodes"]] == PRIVATE
    assert [n["via"] for n in record["nodes"]][0] is None
    assert all(n["via"]["name"] == "node0" for n in record["nodes"][1:])
    for k in range(4):  # each node ran its part in its own work dir, to the end
        exit_code = tmp_path / "hosts" / f"node{k}" / "runs" / run_id / "exit_code"
        assert exit_code.read_text().strip() == "0"
    ray_log = (rd / "logs" / "ray.log").read_text()
    assert f"all 4 nodes joined: {' '.join(PRIVATE)}" in ray_log
    train_log = (rd / "logs" / "train.log").read_text()
    assert "placed 32 GPUs (4 actors) on 4 nodes" in train_log
    ops = [c["operation"] for c in calls_of(rd)]
    assert ops.count("RunInstances") == 1 and ops.count("AllocateAddress") == 1
    assert ops.count("CreatePlacementGroup") == 1 and ops.count("DeletePlacementGroup") == 1
    run = next(c for c in calls_of(rd) if c["operation"] == "RunInstances")["params"]
    assert run["MinCount"] == run["MaxCount"] == 4 and "Placement" in run
    assert json.loads((rd / "verdict.json").read_text())["status"] == "reproduced"
    nothing_left(moto_aws, run_id)


def test_a_node_terminated_mid_run_on_aws_stops_the_run_and_the_verdict_names_it(
    moto_aws, sshd, loopback_nodes, netns, test_image, container_run_args, tmp_path
):
    recipe, profile = setup(
        moto_aws, sshd, netns, test_image, container_run_args, tmp_path, STANDIN_SLEEP_S="1"
    )
    run_id = f"ak-{uuid.uuid4().hex[:8]}"
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        moto_aws.command(
            str(recipe),
            "--cluster",
            str(profile),
            "--runs-dir",
            str(runs),
            "--run-id",
            run_id,
            "--on-interrupt",
            "cancel",
            "--yes",
        ),  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=moto_aws.env,
        start_new_session=True,
        text=True,
    )
    try:
        wait_for(lambda: bool(list(runs.glob(f"**/*{run_id}/run.json"))), 120, "the run dir")
        rd = run_dir(runs, run_id)
        train_log = rd / "logs" / "train.log"
        wait_for(
            lambda: train_log.is_file() and "step 2:" in train_log.read_text(),
            500,
            "training on node 0",
        )
        # node 2's instance ends (a spot interruption, a failed host): AWS says so, and with the
        # instance goes everything on it (moto only marks it; the test ends what ran there)
        node2 = json.loads((rd / "aws.json").read_text())["nodes"][2]
        moto_aws.ec2.terminate_instances(InstanceIds=[node2["meta"]["instance_id"]])
        docker("kill", f"reproduce-{run_id}-node2", check=False)
        pid = tmp_path / "hosts" / "node2" / "runs" / run_id / "pid"
        try:
            os.killpg(int(pid.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass
        killed_at = time.monotonic()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 3, err[-4000:]
    assert "node2" in err or "node 2" in err, err[-3000:]
    assert time.monotonic() - killed_at < 120
    status = json.loads((rd / "status.json").read_text())
    assert status["state"] == "failed" and "node" in status["detail"], status
    verdict = json.loads((rd / "verdict.json").read_text())
    assert verdict["status"] == "failed"
    assert any("node-2:" in reason for reason in verdict["reasons"]), verdict
    assert json.loads((rd / "timeline.json").read_text())["released_at"] is not None
    nothing_left(moto_aws, run_id)
    assert not containers_named(f"reproduce-{run_id}")


def test_the_moto_server_keeps_placement_groups_with_their_tags(moto_aws):
    """The stand-in the end-to-end runs rely on (moto's server has no placement groups)."""
    ec2 = moto_aws.ec2
    tags = [{"Key": "reproduce:run-id", "Value": "r"}]
    ec2.create_placement_group(
        GroupName="g", Strategy="cluster",
        TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags}],
    )  # fmt: skip
    found = ec2.describe_placement_groups(
        Filters=[{"Name": "tag:reproduce:run-id", "Values": ["r"]}]
    )["PlacementGroups"]
    assert [(g["GroupName"], g["Strategy"], g["Tags"]) for g in found] == [("g", "cluster", tags)]
    ec2.delete_placement_group(GroupName="g")
    assert ec2.describe_placement_groups()["PlacementGroups"] == []
    with pytest.raises(Exception, match="InvalidPlacementGroup.Unknown"):
        ec2.delete_placement_group(GroupName="g")
