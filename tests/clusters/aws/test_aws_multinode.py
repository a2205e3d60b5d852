"""A 4-node launch on moto: one placement group, all or nothing, ONE Elastic IP, the other nodes
reached through the head, and every node ended on every path.

The nodes are real sshd servers on this machine (tests/support/aws.py, `loopback_nodes`): the
session's sshd is the head, dialled at connect_host 127.0.0.1; the instances are launched into a
moto subnet of 127.0.0.0/24, so their private addresses are 127.0.0.4-7 and the workers' sshd
listen on 127.0.0.5-7, reached only through the head's sshd (a `direct-tcpip` channel). moto
drops the placement group and every network card but the first: those are read from what the
launcher sent (the recording client).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from support.aws import (
    NOTHING,
    client_error,
    ec2_of,
    live_with_operator_key,
    load,
    multinode_fields,
    nodes_recipe,
)
from support.aws import (
    cluster as aws_cluster,
)

from launcher.clusters.aws import provisioning_calls
from launcher.cost.budget import Budget
from launcher.errors import CheckFailed, InfraError, Interrupted

pytestmark = [pytest.mark.aws, pytest.mark.ssh, pytest.mark.multinode]


def cluster(aws, ami, tmp_path, loopback_nodes, nodes=4, base=None, **fields):
    """An AwsCluster for `nodes` nodes on the loopback sshd (`base`: the multinode_fields already
    made for this account, when the test made them first)."""
    base = base or multinode_fields(aws, loopback_nodes)
    profile = load(tmp_path, **{**base, **fields})
    return aws_cluster(
        aws, ami, tmp_path, "run", "m1", recipe=nodes_recipe(tmp_path, nodes), profile=profile
    )


def run(c, tmp_path, **execute):
    """`c` driven by the real run path (Runner.execute), as `reproduce RECIPE --cluster aws` is."""
    from support.nodescript import plan_running

    from launcher.records.rundir import RunDir
    from launcher.runner.runner import Runner

    plan = plan_running("m1", str(tmp_path / "node"), "echo never reached\n")
    return Runner(measure=False, poll_s=0.05).execute(plan, RunDir(tmp_path / "run"), c, **execute)


def test_four_nodes_one_placement_group_one_elastic_ip_the_rest_through_the_head(
    aws, ami, tmp_path, loopback_nodes
):
    c = cluster(aws, ami, tmp_path, loopback_nodes)
    nodes = c.acquire()
    ec2 = ec2_of(aws)
    assert [n.name for n in nodes] == ["node0", "node1", "node2", "node3"]
    head, workers = nodes[0], nodes[1:]

    # all or nothing, in one cluster placement group, EFA on every card of every node
    pg = aws.calls.one("create_placement_group")
    req = aws.calls.one("run_instances")
    assert pg["Strategy"] == "cluster" and req["Placement"] == {"GroupName": pg["GroupName"]}
    assert req["MinCount"] == req["MaxCount"] == 4
    nics = req["NetworkInterfaces"]
    assert [(n["NetworkCardIndex"], n["InterfaceType"]) for n in nics] == [(0, "efa")] + [
        (card, "efa-only") for card in range(1, 16)
    ]
    # node to node: all traffic from the group itself (EFA, NCCL, Ray, the jump's SSH)
    ingress = aws.calls.one("authorize_security_group_ingress")
    assert ingress["IpPermissions"][0]["UserIdGroupPairs"][0]["GroupId"] == ingress["GroupId"]

    # ONE Elastic IP, on the head's primary interface; nobody else has a public address
    assert len(aws.calls.params("allocate_address")) == 1
    [addr] = ec2.describe_addresses()["Addresses"]
    [inst] = ec2.describe_instances(InstanceIds=[head.meta["instance_id"]])["Reservations"][0][
        "Instances"
    ]
    assert addr["NetworkInterfaceId"] == inst["NetworkInterfaces"][0]["NetworkInterfaceId"]
    assert head.meta["public_ip"] == addr["PublicIp"] and head.via is None
    assert head.connect_host == "127.0.0.1" and head.host == "127.0.0.4"  # its private address
    for worker, address in zip(workers, ("127.0.0.5", "127.0.0.6", "127.0.0.7"), strict=True):
        assert worker.via == head and worker.host == worker.connect_host == address
        assert worker.meta["public_ip"] is None
    # every node's host key pinned from its own console
    for node in nodes:
        expected = loopback_nodes.fingerprint(node.host)
        assert node.meta["host_key_fingerprints"] == [expected]

    # each node answers on its own sshd, the workers through the head
    for node in nodes:
        out = c.transport(node).run("echo $SSH_CONNECTION").stdout.split()
        assert out[2] == (node.host if node.via else "127.0.0.1")
    state = json.loads((tmp_path / "run" / "aws.json").read_text())
    assert len(state["instances"]) == 4 and len(state["addresses"]) == 1
    assert state["nodes"][1]["via"]["name"] == "node0"  # the record keeps the route

    c.release()
    assert aws.calls.one("delete_placement_group") == {"GroupName": pg["GroupName"]}
    assert live_with_operator_key(ec2) == NOTHING
    terminated = aws.calls.params("terminate_instances")
    assert sorted(terminated[0]["InstanceIds"]) == sorted(n.meta["instance_id"] for n in nodes)


def test_a_256_node_dry_run_allocates_one_elastic_ip(tmp_path):
    from support.aws import write_profile

    from launcher.inputs.profile import load_profile

    profile = load_profile(str(write_profile(tmp_path)))
    calls = provisioning_calls(nodes_recipe(tmp_path, 256), profile, "big", owner="a", now=_now())
    ops = [c.operation for c in calls]
    assert ops.count("AllocateAddress") == ops.count("AssociateAddress") == 1
    assert ops.count("CreatePlacementGroup") == ops.count("RunInstances") == 1
    assert ops.count("GetConsoleOutput") == 256  # every node's host key is pinned
    run = next(c for c in calls if c.operation == "RunInstances").params
    assert run["MinCount"] == run["MaxCount"] == 256 and "Placement" in run
    note = next(c for c in calls if c.operation == "AllocateAddress").note
    assert "ONE Elastic IP" in note and "nodes 1-255 are reached through the head" in note


def _now():
    from datetime import UTC, datetime

    return datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_a_partial_launch_is_released_at_once(aws, ami, tmp_path, loopback_nodes):
    real = ec2_of(aws)

    def fewer(params):  # EC2 answering with 3 of the 4 instances asked for
        return real.run_instances(**{**params, "MinCount": 3, "MaxCount": 3})

    aws.faults["run_instances"] = fewer
    c = cluster(aws, ami, tmp_path, loopback_nodes)
    with pytest.raises(InfraError, match="launched 3 of the 4") as err:
        run(c, tmp_path)
    assert err.value.exit_code == 3
    assert "allocate_address" not in aws.calls.names()  # nothing more was made
    assert live_with_operator_key(real) == NOTHING
    assert len(aws.calls.params("terminate_instances")[0]["InstanceIds"]) == 3


def test_a_node_that_never_passes_its_status_checks_releases_every_node(
    aws, ami, tmp_path, loopback_nodes
):
    real = ec2_of(aws)

    def one_stuck(params):
        resp = real.describe_instance_status(**params)
        resp["InstanceStatuses"][-1]["InstanceStatus"] = {"Status": "initializing"}
        return resp

    aws.faults["describe_instance_status"] = one_stuck
    c = cluster(aws, ami, tmp_path, loopback_nodes, ready_timeout_s=0.5)
    with pytest.raises(InfraError, match="did not pass their status checks"):
        run(c, tmp_path)
    assert live_with_operator_key(real) == NOTHING
    assert len(aws.calls.params("terminate_instances")[0]["InstanceIds"]) == 4


def test_a_worker_that_never_answers_through_the_head_releases_every_node(
    aws, ami, tmp_path, loopback_nodes
):
    """Someone else's instance takes 127.0.0.4 first: the nodes become .5-.8, and nothing listens
    on 127.0.0.8 (node3)."""
    fields = multinode_fields(aws, loopback_nodes)
    real = ec2_of(aws)
    bystander = real.run_instances(
        ImageId=ami, InstanceType="t3.micro", MinCount=1, MaxCount=1, SubnetId=fields["subnet_id"]
    )["Instances"][0]["InstanceId"]
    c = cluster(aws, ami, tmp_path, loopback_nodes, base=fields, ready_timeout_s=3)
    t0 = time.monotonic()
    with pytest.raises(
        InfraError, match=r"SSH on 127\.0\.0\.8:\d+ through node0 .* never answered"
    ):
        run(c, tmp_path)
    assert time.monotonic() - t0 < 60
    left = live_with_operator_key(real)
    assert left == {**NOTHING, "instances": [bystander]}  # every node ended, not the bystander


def test_ctrl_c_while_the_workers_are_reached_ends_every_node(aws, ami, tmp_path, loopback_nodes):
    c = cluster(aws, ami, tmp_path, loopback_nodes)
    aws.faults["get_console_output"] = KeyboardInterrupt()  # all 4 launched, the head answers
    with pytest.raises(Interrupted) as err:
        run(c, tmp_path)
    assert err.value.exit_code == 130
    assert live_with_operator_key(ec2_of(aws)) == NOTHING


def test_sigterm_while_booting_ends_every_node(aws, ami, tmp_path, loopback_nodes):
    c = cluster(aws, ami, tmp_path, loopback_nodes)
    aws.faults["describe_instance_status"] = lambda params: os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(Interrupted, match="SIGTERM"):
        run(c, tmp_path)
    assert live_with_operator_key(ec2_of(aws)) == NOTHING


def test_the_budget_reached_while_booting_ends_every_node(aws, ami, tmp_path, loopback_nodes):
    real = ec2_of(aws)
    aws.faults["describe_instance_status"] = lambda params: {
        "InstanceStatuses": [
            {
                "InstanceId": i,
                "InstanceStatus": {"Status": "initializing"},
                "SystemStatus": {"Status": "initializing"},
            }
            for i in params["InstanceIds"]
        ]
    }  # a slow boot, billed
    c = cluster(aws, ami, tmp_path, loopback_nodes, ready_timeout_s=60)
    budget = Budget(max_usd=None, max_hours=0.0003, price_per_hour=4 * 63.296)  # ~1 s
    t0 = time.monotonic()
    with pytest.raises(CheckFailed, match="stopped while acquiring"):
        run(c, tmp_path, budget=budget)
    assert time.monotonic() - t0 < 30
    assert live_with_operator_key(real) == NOTHING


def test_a_teardown_of_several_nodes_refused_once_names_each_and_down_ends_them(
    aws, ami, tmp_path, loopback_nodes
):
    from launcher.clusters.aws.down import down

    c = cluster(aws, ami, tmp_path, loopback_nodes)
    nodes = c.acquire()
    aws.faults["terminate_instances"] = client_error(
        "UnauthorizedOperation", "no", "TerminateInstances"
    )
    with pytest.raises(InfraError) as err:
        c.release()
    for node in nodes:
        assert f"instance {node.meta['instance_id']}" in str(err.value)
    aws.faults.clear()
    down(tmp_path / "run", session=aws, poll_s=0.01, log=lambda m: None)
    assert live_with_operator_key(ec2_of(aws)) == NOTHING


def test_lost_nodes_names_a_node_aws_no_longer_runs(aws, ami, tmp_path, loopback_nodes):
    c = cluster(aws, ami, tmp_path, loopback_nodes)
    nodes = c.acquire()
    c.health_every_s = 0
    assert c.lost_nodes() == []
    ec2_of(aws).terminate_instances(InstanceIds=[nodes[2].meta["instance_id"]])
    [lost] = c.lost_nodes()
    assert lost.startswith(f"node2 ({nodes[2].meta['instance_id']}) is ")
    assert "terminated" in lost or "shutting-down" in lost
    c.release()
    assert live_with_operator_key(ec2_of(aws)) == NOTHING


def test_the_first_health_check_asks_ec2_on_a_freshly_booted_launcher(
    aws, ami, tmp_path, loopback_nodes, monkeypatch
):
    """time.monotonic() counts from the boot: on a launcher machine up 2 s, the first look (at
    most every health_every_s) is still taken, not mistaken for one taken at time 0 (issue 22)."""
    import launcher.clusters.aws.cluster as cluster_mod

    c = cluster(aws, ami, tmp_path, loopback_nodes)
    nodes = c.acquire()
    ec2_of(aws).terminate_instances(InstanceIds=[nodes[1].meta["instance_id"]])
    monkeypatch.setattr(cluster_mod.time, "monotonic", lambda: 2.0)
    lost = c.lost_nodes()
    monkeypatch.undo()
    assert c.health_every_s > 2.0 and [n.split()[0] for n in lost] == ["node1"]
    c.release()


def test_a_recorded_cluster_reaches_the_workers_through_the_head_again(
    aws, ami, tmp_path, loopback_nodes
):
    """attach/cancel: run.json's record gives the nodes back, routes included."""
    from dataclasses import asdict

    from launcher.clusters.aws import BACKEND
    from launcher.clusters.base import Node

    c = cluster(aws, ami, tmp_path, loopback_nodes)
    record = c.to_record()
    nodes = c.acquire()
    again = BACKEND.from_record(record)
    again._session = aws
    restored = again.acquire()
    assert restored == nodes and restored[3].via == restored[0]
    assert [Node(**asdict(n)) for n in nodes] == nodes  # as the runner reads run.json
    assert again.transport(restored[3]).run("echo $SSH_CONNECTION").stdout.split()[2] == (
        "127.0.0.7"
    )
    again.poll_s = 0.01
    again.release()
    assert live_with_operator_key(ec2_of(aws)) == NOTHING


def test_the_4_node_dry_run_on_aws_is_not_refused_and_shows_one_address(tmp_path):
    """What `reproduce RECIPE --cluster aws --dry-run` prints for 4 nodes: no refusal, the
    placement group, one Elastic IP, and a host key per node."""
    from launcher.runner import prelaunch

    recipe = nodes_recipe(tmp_path, 4)
    prepared = prelaunch.prepare(str(recipe.path), prelaunch.RunOptions(cluster="aws"))
    text = prelaunch.dry_run_text(prepared)
    assert "REFUSED" not in text, text[:3000]
    assert text.count('"operation": "AllocateAddress"') == 1
    assert text.count('"operation": "CreatePlacementGroup"') == 1
    assert text.count('"operation": "GetConsoleOutput"') == 4
    assert '"MinCount": 4' in text and '"MaxCount": 4' in text
