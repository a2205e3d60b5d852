"""The launch program's later steps: what is created for the run, then waited for.

Every id is written to aws.json (Launch.save) the moment AWS returns it, before the next call, so
`reproduce down` finds whatever a crash left. The nodes are made in one RunInstances call with
MinCount = MaxCount = the recipe's node count (all or nothing, in one cluster placement group when
there are several): a partial answer, or a node that never becomes ready, fails the launch and
the caller releases everything at once.

Only the head (node 0) gets an Elastic IP: AWS gives no public address to an instance with several
network interfaces, and its default quota is 5 Elastic IPs per region, so one per node would stop
most accounts at 6 nodes. The other nodes are reached through the head: an SSH jump to their
private addresses, which the security group's self-referencing rule lets through (docs/aws.md).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.executor import Executor, Launch, Mode
from launcher.clusters.aws.session import (
    CAPACITY_CODES,
    capacity_alternatives,
    error_code,
    error_message,
    translate,
)
from launcher.errors import InfraError

if TYPE_CHECKING:
    from types_boto3_ec2.type_defs import (
        DescribeInstancesResultTypeDef,
        DescribeInstanceStatusResultTypeDef,
        InstanceStatusTypeDef,
        InstanceTypeDef,
    )

STOPPED_STATES = ("shutting-down", "terminated", "stopping", "stopped")


def tag(launch: Launch, api: Executor) -> None:
    """The run's tags (run id, this launch's id, the expiry `reproduce reap` acts on); then, before
    the first create, the launcher's own record of who this launch is (state.py)."""
    expires = rq.expires_at(launch.now(), launch.s.ttl_hours)
    launch.tags = rq.run_tags(
        launch.recipe, launch.run_id, launch.owner, expires, launch.launch_id, launch.s.extra_tags
    )
    # `creating`: from here on a call may create something (teardown then searches by tag too);
    # a launch stopped before this created nothing (AwsCluster.release says so, ends nothing)
    launch.save(expires_at=expires, ami_id=launch.ami_id, creating=True)
    if api.sending and launch.record_launch is not None:
        launch.record_launch()


def security_group(launch: Launch, api: Executor) -> None:
    vpc = launch.subnets[0]["VpcId"]
    params = rq.security_group_request(launch.run_id, launch.launch_id, vpc, launch.tags)
    resp = api.create("CreateSecurityGroup", params, "", "creating the security group")
    if api.mode is Mode.PRINT:
        launch.group_id = rq.placeholder("security group created for this run")
    elif api.mode is Mode.CHECK:  # RunInstances' DryRun still needs a group that exists
        filters = [
            {"Name": "vpc-id", "Values": [vpc]},
            {"Name": "group-name", "Values": ["default"]},
        ]
        doing = "finding the VPC's default security group"
        found = api.read("ec2", "DescribeSecurityGroups", {"Filters": filters}, "", doing)
        groups = found["SecurityGroups"]
        launch.group_id = groups[0]["GroupId"] if groups else "sg-00000000"
    else:
        launch.group_id = resp["GroupId"]
        launch.save(security_group=launch.group_id)


def open_ingress(launch: Launch, api: Executor) -> None:
    api.create(
        "AuthorizeSecurityGroupIngress",
        rq.ingress_request(launch.group_id, launch.s.port, launch.cidr),
        "SSH from one address only; all traffic within the group for EFA",
        "opening SSH and EFA in the security group",
        dry_run=False,
    )


def key_pair(launch: Launch, api: Executor) -> None:
    """The profile's key pair, or one made for the run (private key 0600, outside the run dir)."""
    if launch.s.key_name:
        launch.key_name, launch.identity_file = launch.s.key_name, launch.s.identity_file
        return
    name = rq.resource_name(launch.run_id, launch.launch_id)
    resp = api.create(
        "CreateKeyPair",
        rq.key_pair_request(launch.run_id, launch.launch_id, launch.tags),
        "private key saved with mode 0600 outside the run directory; deleted at teardown",
        "creating the key pair",
    )
    launch.key_name = None if api.mode is Mode.CHECK else name  # --check: it does not exist
    if not api.sending:
        return
    launch.save(key_pair=name)
    assert launch.key_dir is not None
    launch.key_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = launch.key_dir / f"{name}.pem"
    # O_EXCL: never write a private key into a file someone else made (and whose mode they chose)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(resp["KeyMaterial"])
    launch.identity_file = str(path)
    launch.save(key_file=str(path))


def placement_group(launch: Launch, api: Executor) -> None:
    if launch.s.nodes <= 1:
        return
    api.create(
        "CreatePlacementGroup",
        rq.placement_group_request(launch.run_id, launch.launch_id, launch.tags),
        f"{launch.s.nodes} nodes: one cluster placement group",
        "creating the placement group",
    )
    if api.mode is not Mode.CHECK:  # --check: it does not exist, so RunInstances names none
        launch.placement_group = rq.resource_name(launch.run_id, launch.launch_id)
        launch.save(placement_group=launch.placement_group)


def run_instances(launch: Launch, api: Executor) -> None:
    """All nodes in one call; with no subnet pinned, the next zone on InsufficientCapacity."""
    s = launch.s
    tried: list[str] = []
    subnets = launch.subnets if api.sending else launch.subnets[:1]
    doing = f"launching {s.nodes} x {s.instance_type}"
    for attempt, subnet in enumerate(subnets):
        req = rq.run_instances_request(
            s,
            ami_id=launch.ami_id,
            subnet_id=subnet["SubnetId"],
            group_id=launch.group_id,
            key_name=launch.key_name,
            placement_group=launch.placement_group,
            root_device=launch.root_device,
            network_cards=launch.facts.network_cards if launch.facts else None,
            max_efa=launch.facts.max_efa if launch.facts else None,
            tags=launch.tags,
            client_token=rq.client_token(
                launch.launch_id, 99 if api.mode is Mode.CHECK else attempt
            ),
        )
        nics = req["NetworkInterfaces"]
        launch.interfaces = len(nics) if isinstance(nics, list) else 1
        # Until AWS answers, the call may have launched: teardown then looks for it by tag
        # (and waits for it to become visible) rather than assuming nothing exists.
        launch.save(pending_launch=req["ClientToken"], launched_at=time.time())
        try:
            resp = api.create("RunInstances", req, rq.capacity_words(s), doing, raw=True)
        except Exception as err:  # noqa: BLE001 - an interrupt is no answer: it stays pending
            if error_code(err):  # AWS answered with an error: nothing was launched
                launch.save(pending_launch=None)
            if error_code(err) not in CAPACITY_CODES:
                mine = translate(err, doing, s)
                if mine is err:
                    raise
                raise mine from err
            tried.append(subnet["AvailabilityZone"])
            if attempt + 1 < len(subnets):
                launch.log(
                    f"aws: no {s.instance_type} capacity in {tried[-1]}; trying the next zone"
                )
                continue
            raise InfraError(
                f"{doing}: {error_code(err)}: {error_message(err)}",
                hint=capacity_alternatives(s, tried),
            ) from err
        if resp is not None:
            _launched(launch, resp["Instances"], subnet["AvailabilityZone"])
        return


def _launched(launch: Launch, instances: list[InstanceTypeDef], zone: str) -> None:
    launch.instances = instances
    if launch.state is not None:
        for inst in instances:
            launch.state.add("instances", inst["InstanceId"])
    launch.save(pending_launch=None, availability_zone=zone)
    launch.deadline = time.monotonic() + launch.s.ready_timeout_s
    wanted = launch.s.nodes
    if len(instances) != wanted:
        # MinCount = MaxCount makes EC2 launch all or none; an answer with fewer is not a cluster
        # the recipe can run on, and every instance in it bills: end them all (the caller does)
        raise InfraError(
            f"AWS launched {len(instances)} of the {wanted} {launch.s.instance_type} instances "
            f"asked for ({', '.join(launch.ids) or 'none'}); the recipe needs all {wanted} "
            "nodes at once, so everything launched is being torn down"
        )
    launch.log(
        f"aws: launched {', '.join(launch.ids)} ({launch.s.instance_type}, "
        f"{rq.capacity_words(launch.s)}); waiting until running"
    )


def _launched_ids(launch: Launch) -> list[str]:
    return launch.ids or [rq.placeholder("launched instances")]


def wait_running(launch: Launch, api: Executor) -> None:
    ids = _launched_ids(launch)

    def running(resp: DescribeInstancesResultTypeDef) -> list[InstanceTypeDef] | None:
        found = {i["InstanceId"]: i for r in resp["Reservations"] for i in r["Instances"]}
        for iid, inst in found.items():
            state = inst["State"]["Name"]
            if state in STOPPED_STATES:
                reason = (inst.get("StateReason") or {}).get("Message") or state
                raise InfraError(f"instance {iid} went {state} while starting: {reason}")
        if len(found) == len(ids) and all(i["State"]["Name"] == "running" for i in found.values()):
            return [found[i] for i in ids]
        return None

    answer = api.poll(
        "DescribeInstances",
        {"InstanceIds": ids},
        "wait until running: each node's addresses and network interfaces",
        "describing the launched instances",
        running,
        f"the instances {', '.join(ids)} did not reach running",
        launch.deadline,
    )
    if answer is not None:
        launch.instances = answer


def addresses(launch: Launch, api: Executor) -> None:
    """ONE Elastic IP, for the head, when it has no usable public address; then the nodes: the
    head dialled from here, every other node through the head at its private address."""
    s = launch.s
    head: InstanceTypeDef = launch.instances[0] if api.sending else {}
    public = head.get("PublicIpAddress")
    if s.elastic_ip and (not api.sending or not public or launch.interfaces > 1):
        public = _elastic_ip(launch, api, head)
    if not api.sending:
        return
    assert launch.make_node is not None
    first = head.copy()
    if public is None:
        first.pop("PublicIpAddress", None)
    else:
        first["PublicIpAddress"] = public
    head_node = launch.make_node(first, 0, True, launch.ami_id, launch.identity_file)
    launch.nodes = [head_node]
    for index, inst in enumerate(launch.instances[1:], start=1):
        node = launch.make_node(
            inst, index, True, launch.ami_id, launch.identity_file, via=head_node
        )
        launch.nodes.append(node)


def _elastic_ip(launch: Launch, api: Executor, inst: InstanceTypeDef) -> str | None:
    note = "node 0: an Elastic IP for SSH (several interfaces get no public address)"
    if launch.s.nodes > 1:
        others = "node 1 is" if launch.s.nodes == 2 else f"nodes 1-{launch.s.nodes - 1} are"
        note = (
            "node 0, the head: the run's ONE Elastic IP (several interfaces get no public "
            f"address; the default quota is 5 per region); {others} reached through the head "
            "(SSH jump to their private addresses)"
        )
    alloc = api.create(
        "AllocateAddress",
        rq.allocate_address_request(launch.tags),
        note,
        "allocating an Elastic IP",
    )
    if alloc is None:  # printed or checked: nothing was allocated
        params = rq.associate_address_request(
            rq.placeholder("allocation of node 0"),
            rq.placeholder("primary interface of node 0"),
        )
        api.create("AssociateAddress", params, "", "attaching the Elastic IP", dry_run=False)
        return None
    record: dict[str, str | None] = {
        "allocation_id": alloc["AllocationId"],
        "public_ip": alloc["PublicIp"],
        "association_id": None,
    }
    assert launch.state is not None
    launch.state.add("addresses", record)
    params = rq.associate_address_request(alloc["AllocationId"], primary_interface(inst))
    assoc = api.create("AssociateAddress", params, "", "attaching the Elastic IP")
    record["association_id"] = assoc.get("AssociationId")
    launch.state.save()
    return str(alloc["PublicIp"])


def primary_interface(inst: InstanceTypeDef) -> str:
    for eni in inst.get("NetworkInterfaces", []):
        att = eni.get("Attachment") or {}
        if att.get("DeviceIndex", 0) == 0 and att.get("NetworkCardIndex", 0) == 0:
            return eni["NetworkInterfaceId"]
    raise InfraError(
        f"instance {inst['InstanceId']} has no primary network interface to attach an Elastic IP to"
    )


def wait_status_ok(launch: Launch, api: Executor) -> None:
    ids = _launched_ids(launch)

    def status(st: InstanceStatusTypeDef, kind: str) -> str | None:
        summary = st.get("InstanceStatus") if kind == "InstanceStatus" else st.get("SystemStatus")
        return (summary or {}).get("Status")

    def passed(resp: DescribeInstanceStatusResultTypeDef) -> bool:
        statuses = resp.get("InstanceStatuses", [])
        bad = [
            st["InstanceId"]
            for st in statuses
            if "impaired" in (status(st, "InstanceStatus"), status(st, "SystemStatus"))
        ]
        if bad:
            raise InfraError(f"instance status checks failed (impaired) on {', '.join(bad)}")
        ok = [
            st
            for st in statuses
            if status(st, "InstanceStatus") == "ok" == status(st, "SystemStatus")
        ]
        return len(ok) == len(ids)

    api.poll(
        "DescribeInstanceStatus",
        {"InstanceIds": ids},
        "wait for running and status ok, then for SSH, within ready_timeout_s",
        "reading instance status checks",
        passed,
        f"the instances {', '.join(ids)} did not pass their status checks",
        launch.deadline,
    )


def wait_ssh(launch: Launch, api: Executor) -> None:
    """Until the head answers SSH (no AWS call: nothing to print or check)."""
    if api.sending:
        assert launch.wait_ssh is not None
        launch.wait_ssh([n for n in launch.nodes if n.via is None], launch.deadline)


def wait_behind_head(launch: Launch, api: Executor) -> None:
    """Until every other node answers SSH through the head (no AWS call). After the host keys:
    the head's own connection, which carries the others', checks its pinned key."""
    behind = [n for n in launch.nodes if n.via is not None]
    if api.sending and behind:
        assert launch.wait_ssh is not None
        launch.wait_ssh(behind, launch.deadline)


def target_node(launch: Launch, api: Executor) -> None:
    """The targeted instance as the run's node, once it answers SSH."""
    if not api.sending:
        return
    assert launch.make_node is not None and launch.wait_ssh is not None
    inst = launch.instances[0]
    node = launch.make_node(inst, 0, False, inst.get("ImageId"), launch.s.identity_file)
    launch.log(
        f"aws: targeting {launch.target} ({inst['InstanceType']}, {node.meta['az']}); "
        "it will not be terminated"
    )
    launch.nodes = [node]
    launch.wait_ssh([node], time.monotonic() + launch.s.ready_timeout_s)
