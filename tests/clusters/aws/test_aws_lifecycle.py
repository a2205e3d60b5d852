"""AwsCluster against moto: launch, wait, describe, EIP, security group, tags, release; target; keep; down; reap.

Exact payloads that moto drops are read from the recording client (what the launcher sent).
"""

from __future__ import annotations

import json
import stat
from datetime import UTC, datetime, timedelta

import pytest
from support.aws import (
    NOTHING,
    live_resources,
    live_with_operator_key,
    multinode_fields,
    two_node_recipe,
)
from support.aws import (
    cluster as aws_cluster,
)

from launcher.clusters.aws import BACKEND
from launcher.clusters.aws.down import down
from launcher.clusters.aws.reap import reap
from launcher.clusters.aws.requests import TAG_EXPIRES, TAG_RUN_ID

pytestmark = pytest.mark.aws


def cluster(aws, ami, tmp_path, recipe=None, run_id="r1", **fields):
    return aws_cluster(
        aws, ami, tmp_path, run_id=run_id, recipe=recipe, owner="alice@laptop", **fields
    )


def tags_of(item) -> dict:
    return {t["Key"]: t["Value"] for t in item.get("Tags", [])}


def test_launch_wait_release_leaves_nothing(aws, ami, tmp_path, banner):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    [node] = c.acquire()
    ec2 = aws._real.client("ec2")
    inst = ec2.describe_instances(InstanceIds=[node.meta["instance_id"]])["Reservations"][0][
        "Instances"
    ][0]
    assert inst["State"]["Name"] == "running" and inst["InstanceType"] == "p5en.48xlarge"
    assert node.connect_host == "127.0.0.1" and node.port == banner.port and node.user == "ubuntu"
    assert (
        node.host == inst["PrivateIpAddress"]
        and node.meta["launched"] is True
        and node.meta["ami_id"] == ami
    )
    # an Elastic IP (several interfaces get no public address), tagged, on the primary interface
    [addr] = ec2.describe_addresses()["Addresses"]
    assert addr["NetworkInterfaceId"] == inst["NetworkInterfaces"][0]["NetworkInterfaceId"]
    assert node.meta["public_ip"] == addr["PublicIp"] and tags_of(addr)[TAG_RUN_ID] == "r1"
    # the security group: itself and the operator's /32 on SSH only
    [group] = [
        g
        for g in ec2.describe_security_groups()["SecurityGroups"]
        if g["GroupName"].startswith("reproduce-r1-")
    ]
    perms = group["IpPermissions"]
    ssh = [p for p in perms if p["IpProtocol"] == "tcp"]
    assert [r["CidrIp"] for p in ssh for r in p["IpRanges"]] == ["127.0.0.1/32"]
    assert [
        g["GroupId"] for p in perms if p["IpProtocol"] == "-1" for g in p["UserIdGroupPairs"]
    ] == [group["GroupId"]]
    assert not any(r["CidrIp"] == "0.0.0.0/0" for p in perms for r in p["IpRanges"])
    for tagged in (inst, group, addr):
        assert set(tags_of(tagged)) >= {
            "Name",
            "reproduce:recipe",
            TAG_RUN_ID,
            "reproduce:owner",
            TAG_EXPIRES,
        }
    # the key pair made for the run: private key only on this machine, mode 0600, never in the run dir
    [key_file] = (tmp_path / "keys").glob("reproduce-r1-*.pem")
    assert node.identity_file == str(key_file) and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    state = json.loads((tmp_path / "run" / "aws.json").read_text())
    assert (
        state["instances"] == [inst["InstanceId"]] and state["security_group"] == group["GroupId"]
    )
    assert "PRIVATE KEY" not in (tmp_path / "run" / "aws.json").read_text()
    # payloads moto drops, as sent
    req = aws.calls.one("run_instances")
    assert [n["NetworkCardIndex"] for n in req["NetworkInterfaces"]] == list(range(16))
    assert (
        req["MetadataOptions"]["HttpTokens"] == "required"
        and req["BlockDeviceMappings"][0]["Ebs"]["Encrypted"]
    )

    c.release()
    assert live_resources(ec2) == NOTHING
    assert not key_file.exists()
    c.release()  # idempotent
    assert json.loads((tmp_path / "run" / "aws.json").read_text())["released"] is True


@pytest.mark.ssh
def test_two_nodes_placement_group_and_one_elastic_ip(aws, ami, tmp_path, loopback_nodes):
    fields = multinode_fields(aws, loopback_nodes)
    c = cluster(aws, ami, tmp_path, recipe=two_node_recipe(tmp_path), **fields)
    nodes = c.acquire()
    assert len(nodes) == 2 and len({n.meta["instance_id"] for n in nodes}) == 2
    assert nodes[1].via == nodes[0]  # reached through the head
    pg = aws.calls.one("create_placement_group")
    assert pg["Strategy"] == "cluster"
    assert aws.calls.one("run_instances")["Placement"] == {"GroupName": pg["GroupName"]}
    assert len(aws._real.client("ec2").describe_addresses()["Addresses"]) == 1
    c.release()
    assert aws.calls.one("delete_placement_group") == {"GroupName": pg["GroupName"]}
    assert live_with_operator_key(aws._real.client("ec2")) == NOTHING


def test_capacity_block_launch_sends_the_reservation_target_and_market_type(
    aws, ami, tmp_path, banner
):
    aws.canned["describe_capacity_reservations"] = {
        "CapacityReservations": [
            {
                "CapacityReservationId": "cr-0123456789abcdef0",
                "InstanceType": "p5en.48xlarge",
                "AvailabilityZone": "us-east-1b",
                "State": "active",
                "AvailableInstanceCount": 1,
            }
        ]
    }
    c = cluster(
        aws,
        ami,
        tmp_path,
        port=banner.port,
        capacity={"type": "capacity-block", "reservation_id": "cr-0123456789abcdef0"},
    )
    [node] = c.acquire()
    req = aws.calls.one("run_instances")
    assert req["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert req["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
    }
    assert node.meta["az"] == "us-east-1b"  # the subnet of the block's zone
    c.release()
    assert live_resources(aws._real.client("ec2")) == NOTHING


def test_targeted_instance_is_used_and_never_terminated(aws, ami, tmp_path, banner):
    ec2 = aws._real.client("ec2")
    iid = ec2.run_instances(ImageId=ami, InstanceType="p5en.48xlarge", MinCount=1, MaxCount=1)[
        "Instances"
    ][0]["InstanceId"]
    c = cluster(aws, ami, tmp_path, port=banner.port, instance_id=iid)
    [node] = c.acquire()
    assert node.meta == {**node.meta, "instance_id": iid, "launched": False}
    assert not [n for n in aws.calls.names() if n.startswith(("create_", "run_", "allocate_"))]
    c.release()
    assert live_resources(ec2)["instances"] == [iid]
    assert "terminate_instances" not in aws.calls.names()


def test_targeted_instance_with_the_wrong_gpus_is_refused(aws, ami, tmp_path, banner):
    from launcher.errors import BadInput

    ec2 = aws._real.client("ec2")
    iid = ec2.run_instances(ImageId=ami, InstanceType="p5.48xlarge", MinCount=1, MaxCount=1)[
        "Instances"
    ][0]["InstanceId"]
    with pytest.raises(BadInput, match="H100"):
        cluster(aws, ami, tmp_path, port=banner.port, instance_id=iid).acquire()


def test_keep_prints_the_price_and_down_ends_it_later(aws, ami, tmp_path, banner):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    c.keep = True
    [node] = c.acquire()
    c.release()
    ec2 = aws._real.client("ec2")
    assert live_resources(ec2)["instances"] == [node.meta["instance_id"]]
    kept = " ".join(c.logs)
    assert "$63.30/h" in kept and f"reproduce down {tmp_path / 'run'}" in kept
    ended = down(tmp_path / "run", session=aws, poll_s=0.01, log=lambda m: None)
    assert f"instance {node.meta['instance_id']}" in ended
    assert live_resources(ec2) == NOTHING


def test_record_restores_a_cluster_that_releases_what_was_launched(aws, ami, tmp_path, banner):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    record = c.to_record()
    json.dumps(record)
    c.acquire()
    again = BACKEND.from_record(record)
    again._session = aws
    assert [n.meta["instance_id"] for n in again.acquire()] == [
        n.meta["instance_id"] for n in c.nodes
    ]
    again.poll_s = 0.01
    again.release()
    assert live_resources(aws._real.client("ec2")) == NOTHING


def test_reap_ends_only_expired_runs_and_their_resources(aws, ami, tmp_path, banner):
    (tmp_path / "a").mkdir()
    old = cluster(aws, ami, tmp_path / "a", run_id="old", port=banner.port, ttl_hours=1)
    old.now = lambda: datetime.now(UTC) - timedelta(hours=3)
    [old_node] = old.acquire()
    (tmp_path / "b").mkdir()
    fresh = cluster(aws, ami, tmp_path / "b", run_id="fresh", port=banner.port, ttl_hours=6)
    [fresh_node] = fresh.acquire()
    ec2 = aws._real.client("ec2")
    untagged = ec2.run_instances(ImageId=ami, InstanceType="t3.micro", MinCount=1, MaxCount=1)[
        "Instances"
    ][0]["InstanceId"]

    assert "instance " + old_node.meta["instance_id"] in reap(
        "us-east-1", owner="alice@laptop", dry_run=True, session=aws, log=lambda m: None
    )
    assert (
        old_node.meta["instance_id"] in live_resources(ec2)["instances"]
    )  # a dry run ends nothing

    ended = reap("us-east-1", owner="alice@laptop", session=aws, poll_s=0.01, log=lambda m: None)
    assert ended[0] == f"instance {old_node.meta['instance_id']}"
    assert any(e.startswith("Elastic IP") for e in ended) and any(
        e.startswith("key pair reproduce-old-") for e in ended
    )
    left = live_resources(ec2)
    assert sorted(left["instances"]) == sorted([fresh_node.meta["instance_id"], untagged])
    assert [k.rsplit("-", 1)[0] for k in left["key_pairs"]] == ["reproduce-fresh"]
    assert len(left["addresses"]) == 1
    fresh.release()
