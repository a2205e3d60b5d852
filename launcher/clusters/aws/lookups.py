"""The launch program's first steps: what is read before anything is created (or paid for).

Each step checks what it learns (the instance type's GPUs against the recipe, the AMI, the
capacity reservation, a subnet in the right zone), so a launch that cannot work is refused before
the first resource exists. In the dry run every answer is a placeholder, except the instance
type's facts, which come from launcher/catalog.py (AWS's own answer wins at launch).
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from launcher import catalog
from launcher.catalog import InstanceType
from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.executor import Executor, Launch, Mode
from launcher.clusters.aws.session import error_code, translate
from launcher.clusters.aws.settings import check_instance_type
from launcher.errors import BadInput, InfraError

if TYPE_CHECKING:
    from types_boto3_ec2.type_defs import DescribeInstancesResultTypeDef, InstanceTypeDef

CHECKIP_URL = "https://checkip.amazonaws.com"


def account(launch: Launch, api: Executor) -> None:
    """The account the run's resources are made in: recorded, and checked by `reproduce down`
    (under other credentials none of the run's ids exist, which must not read as their end)."""
    resp = api.read(
        "sts",
        "GetCallerIdentity",
        {},
        "the account the run's resources are created in (recorded; `reproduce down` checks it)",
        "finding the account of these credentials",
    )
    if resp is not None:
        launch.account = str(resp["Account"])
        launch.save(account=launch.account)
        api.checked(f"ok   GetCallerIdentity: account {launch.account}")


def describe_type(launch: Launch, api: Executor, instance_type: str, note: str) -> None:
    """GPUs, network cards and EFA of the type, checked against the recipe."""
    try:
        resp = api.read(
            "ec2",
            "DescribeInstanceTypes",
            {"InstanceTypes": [instance_type]},
            note,
            "",
            raw=True,
        )
    except Exception as err:  # noqa: BLE001
        if error_code(err).startswith("InvalidInstanceType"):
            raise BadInput(
                f"instance type {instance_type!r} does not exist in {launch.region}."
            ) from err
        mine = translate(err, f"describing instance type {instance_type}", launch.s)
        if mine is err:
            raise
        raise mine from err
    if resp is None:
        launch.facts = catalog.instance(instance_type)
    else:
        types = resp.get("InstanceTypes") or []
        if not types:
            raise BadInput(f"instance type {instance_type!r} is not offered in {launch.region}.")
        launch.facts = facts_from_aws(types[0], launch.region)
    if not launch.bake:  # the bake's instance only pulls an image: it has no GPUs to check
        check_instance_type(launch.recipe, launch.facts)
    f = launch.facts
    if f is not None:
        api.checked(
            f"ok   DescribeInstanceTypes {f.name}: {f.gpus} x {f.gpu}, "
            f"{f.network_cards} network cards, {f.max_efa} EFA"
        )


def facts_from_aws(info: dict[str, Any], region: str | None) -> InstanceType:
    """describe_instance_types' answer as a catalog entry (it wins over the catalog at launch)."""
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    net = info.get("NetworkInfo") or {}
    efa = (net.get("EfaInfo") or {}).get("MaximumEfaInterfaces") if net.get("EfaSupported") else 0
    return InstanceType(
        name=str(info.get("InstanceType") or "?"),
        provider="aws",
        gpu=(gpus[0].get("Name", "") if gpus else "none"),
        gpus=sum(int(g.get("Count", 0)) for g in gpus),
        gpu_memory_gib=_gib((gpus[0].get("MemoryInfo") or {}).get("SizeInMiB")) if gpus else None,
        memory_gib=int((info.get("MemoryInfo") or {}).get("SizeInMiB") or 0) // 1024,
        vcpus=int((info.get("VCpuInfo") or {}).get("DefaultVCpus") or 0),
        network_cards=int(net.get("MaximumNetworkCards") or 1),
        max_efa=int(efa or 0),
        source=f"describe_instance_types in {region}",
    )


def _gib(mib: int | None) -> float | None:
    return float(mib) / 1024 if mib else None


def instance_type(launch: Launch, api: Executor) -> None:
    describe_type(
        launch,
        api,
        launch.s.instance_type,
        "the bake's instance: its network cards (no GPUs: nothing checked against the recipe)"
        if launch.bake
        else "GPU count and model (checked against the recipe), network cards and EFA interfaces",
    )


def ami(launch: Launch, api: Executor) -> None:
    """The AMI id (an SSM parameter is resolved and recorded) and its root device name."""
    s = launch.s
    if s.ami_is_baked:
        baked_ami(launch, api)
        return
    if not s.ami_is_ssm:
        launch.ami_id = s.ami
    elif api.mode is Mode.PRINT:
        params = {"Name": s.ssm_parameter}
        api.read("ssm", "GetParameter", params, "resolve the AMI id (recorded in the run)", "")
        launch.ami_id = rq.placeholder(f"resolved at launch: {s.ami}")
    elif launch.ami_resolver is not None:
        launch.ami_id = launch.ami_resolver(s.ssm_parameter)
    else:
        doing = f"resolving the AMI from SSM parameter {s.ssm_parameter}"
        answer = api.read("ssm", "GetParameter", {"Name": s.ssm_parameter}, "", doing)
        launch.ami_id = answer["Parameter"]["Value"]
    if s.ami_is_ssm and api.sending:
        launch.log(f"aws: AMI {launch.ami_id} (from {s.ami})")
    images = api.read(
        "ec2",
        "DescribeImages",
        {"ImageIds": [launch.ami_id]},
        "the AMI's root device name",
        f"describing AMI {launch.ami_id}",
    )
    if images is None:
        launch.root_device = rq.placeholder("root device name of the AMI")
        return
    found = images.get("Images") or []
    if not found:
        raise BadInput(
            f"AMI {launch.ami_id} does not exist in {launch.region} "
            "(or is not visible to this account)."
        )
    launch.root_device = found[0].get("RootDeviceName") or "/dev/sda1"
    api.checked(f"ok   AMI {launch.ami_id} (root device {launch.root_device})")


def baked_ami(launch: Launch, api: Executor) -> None:
    """`ami: baked`: the newest available AMI that this owner's `reproduce image bake` made for
    the run's image (reproduce:image-digest, reproduce:owner, a bake's run id), recorded like an
    SSM-resolved AMI. Another owner's bake of the same image is never taken (whoever baked it
    decides what its docker store holds, and the run's secrets go to that node): a newer one is
    named, not used. None of this owner's is a refusal here, before anything is created."""
    s = launch.s
    digest = str(s.image_digest)
    answer = api.read(
        "ec2",
        "DescribeImages",
        rq.baked_images_request(digest),
        f"ami: baked: this account's AMI holding {s.image_ref}, baked by {launch.owner} "
        "(newest wins; recorded in the run)",
        f"finding the baked AMI of {digest}",
    )
    if answer is None:
        launch.ami_id = rq.placeholder(
            f"resolved at launch: the newest AMI {launch.owner} baked with {digest}"
        )
        launch.root_device = rq.placeholder("root device name of the AMI")
        return
    images = answer.get("Images") or []
    why = {
        str(i.get("ImageId")): rq.foreign_bake(rq.tag_values(i.get("Tags")), launch.owner)
        for i in images
    }
    image = rq.newest_image([i for i in images if not why[str(i.get("ImageId"))]])
    since = str(image.get("CreationDate") or "") if image else ""
    others = [
        f"{i.get('ImageId')} ({why[str(i.get('ImageId'))]}, {i.get('CreationDate') or 'no date'})"
        for i in sorted(images, key=lambda i: str(i.get("CreationDate") or ""), reverse=True)
        if why[str(i.get("ImageId"))] and str(i.get("CreationDate") or "") >= since
    ]
    if image is None:
        theirs = f"; not taken: {', '.join(others)}" if others else ""
        raise BadInput(
            f"ami: baked, but {launch.owner} has no available AMI in {launch.region} tagged "
            f"{rq.TAG_IMAGE_DIGEST}={digest} (the image {s.image_ref}) and {rq.TAG_OWNER}="
            f"{launch.owner}{theirs}; nothing was created.",
            hint="Make one first: `reproduce image bake RECIPE --cluster PROFILE` "
            "(docs/aws.md, 'An AMI that holds the image'), or set ami to ssm:/... or ami-...",
        )
    for other in others:
        launch.log(f"aws: a newer AMI of this image is not taken: {other}")
        api.checked(f"note AMI {other} is newer but not taken")
    launch.ami_id = str(image["ImageId"])
    launch.root_device = image.get("RootDeviceName") or "/dev/sda1"
    tags = rq.tag_values(image.get("Tags"))
    launch.save(
        baked_ami={
            "image_id": launch.ami_id,
            "image_digest": digest,
            "image": s.image_ref,
            "base_ami": tags.get(rq.TAG_BASE_AMI),
            "created": image.get("CreationDate"),
            "name": image.get("Name"),
            "owner": tags.get(rq.TAG_OWNER),
            "not_taken": others,
        }
    )
    if api.sending:
        when = image.get("CreationDate")
        launch.log(f"aws: AMI {launch.ami_id} (baked with {s.image_ref} by {launch.owner}, {when})")
    api.checked(f"ok   AMI {launch.ami_id} baked with {digest} (root device {launch.root_device})")


def reservation_zone(launch: Launch, api: Executor) -> None:
    """A reservation or Capacity Block fixes the zone; one that cannot hold the run is refused."""
    s, rid = launch.s, launch.s.reservation_id
    if not rid:
        return
    resp = api.read(
        "ec2",
        "DescribeCapacityReservations",
        {"CapacityReservationIds": [rid]},
        f"{s.capacity_type}: its availability zone, state and instance type",
        f"describing capacity reservation {rid}",
    )
    if resp is None:
        launch.zone = rq.placeholder(f"availability zone of {rid}")
        return
    res = (resp.get("CapacityReservations") or [None])[0]
    if not res:
        raise BadInput(f"capacity reservation {rid} not found in {launch.region}.")
    if res.get("InstanceType") and res["InstanceType"] != s.instance_type:
        raise BadInput(
            f"capacity reservation {rid} is for {res['InstanceType']}, not {s.instance_type}."
        )
    state = res.get("State")
    if state == "scheduled":
        raise InfraError(
            f"the Capacity Block {rid} has not started yet (starts {res.get('StartDate')}); "
            "run again once it is active."
        )
    if state not in (None, "active"):
        raise InfraError(f"capacity reservation {rid} is {state}, not active.")
    free = res.get("AvailableInstanceCount")
    if free is not None and int(free) < s.nodes:
        raise InfraError(
            f"capacity reservation {rid} has {free} free instances; the recipe needs {s.nodes}."
        )
    launch.zone = res.get("AvailabilityZone")


def subnets(launch: Launch, api: Executor) -> None:
    """The subnet(s) to try, in order: the profile's, or the default VPC's in zones offering it."""
    s = launch.s
    vpc = rq.placeholder("VPC of the subnet")
    if s.subnet_id:
        doing = f"describing subnet {s.subnet_id}"
        params = {"SubnetIds": [s.subnet_id]}
        resp = api.read("ec2", "DescribeSubnets", params, "the subnet's VPC and zone", doing)
        if resp is None:
            launch.subnets = [{"SubnetId": s.subnet_id, "VpcId": vpc, "AvailabilityZone": None}]
            return
        launch.subnets = resp["Subnets"]
        zone = launch.subnets[0]["AvailabilityZone"] if launch.subnets else None
        if launch.zone and zone != launch.zone:
            raise BadInput(
                f"subnet {s.subnet_id} is in {zone}, but the capacity reservation is in "
                f"{launch.zone}; expected a subnet in {launch.zone}."
            )
    else:
        zones = [launch.zone] if launch.zone else _offering_zones(launch, api)
        defaults = api.read(
            "ec2",
            "DescribeSubnets",
            {"Filters": [{"Name": "default-for-az", "Values": ["true"]}]},
            "the default VPC's subnets",
            "finding the default VPC's subnets",
        )
        if defaults is None:
            what = "default subnet of the default VPC in a zone offering " + s.instance_type
            launch.subnets = [{"SubnetId": rq.placeholder(what), "VpcId": vpc}]
            return
        found = defaults["Subnets"]
        launch.subnets = [sub for z in zones for sub in found if sub["AvailabilityZone"] == z]
        if not launch.subnets:
            raise BadInput(
                f"no default subnet in a zone of {launch.region} offering {s.instance_type}"
                + (f" (zones: {', '.join(zones)})" if zones else "")
                + "; nothing was launched.",
                hint="Set subnet_id in the aws profile.",
            )
    first = launch.subnets[0]
    api.checked(f"ok   subnet {first['SubnetId']} in {first['AvailabilityZone']}")


def _offering_zones(launch: Launch, api: Executor) -> list[str]:
    offers = api.read(
        "ec2",
        "DescribeInstanceTypeOfferings",
        {
            "LocationType": "availability-zone",
            "Filters": [{"Name": "instance-type", "Values": [launch.s.instance_type]}],
        },
        "zones that offer the type (the next is tried on InsufficientInstanceCapacity)",
        f"finding zones offering {launch.s.instance_type}",
    )
    return sorted({o["Location"] for o in (offers or {}).get("InstanceTypeOfferings", [])})


def operator_address(launch: Launch, api: Executor) -> None:
    """The one address SSH is opened to: the profile's, else this machine's (found at launch)."""
    cidr = launch.s.ssh_cidr or launch.operator_cidr
    if not cidr and api.sending:
        cidr = lookup_operator_cidr()
    launch.cidr = cidr or rq.placeholder("your public address as a /32, looked up at launch")


def lookup_operator_cidr(timeout_s: float = 5.0) -> str:
    """This machine's public address as a /32 (only when ssh_cidr is null; never in the dry run)."""
    import urllib.request

    try:
        # a fixed https URL, not user input
        with urllib.request.urlopen(CHECKIP_URL, timeout=timeout_s) as resp:  # noqa: S310
            text = resp.read(64).decode().strip()
        addr = ipaddress.ip_address(text)
    except Exception as err:  # noqa: BLE001 - any failure means: ask the user for ssh_cidr
        raise InfraError(
            f"cannot find your public address at {CHECKIP_URL} ({err}).",
            hint="Set ssh_cidr in the aws profile to your address as a /32.",
        ) from err
    return f"{addr}/{addr.max_prefixlen}"


# ------------------------------------------------------------------------------------------------
# Targeting an existing instance: it is read, never created or ended


def target_instance(launch: Launch, api: Executor) -> None:
    iid = str(launch.target)
    launch.save(targeted=[iid])
    resp = api.read(
        "ec2",
        "DescribeInstances",
        {"InstanceIds": [iid]},
        "target the existing instance: nothing is created, and it is never terminated",
        f"describing instance {iid}",
    )
    if resp is None:
        return
    inst = only_instance(resp, iid)
    state = inst["State"]["Name"]
    if state != "running" and api.sending:
        raise BadInput(
            f"instance {iid} is {state}, not running; start it first (the launcher never starts "
            "or ends an instance it only targets)."
        )
    launch.instances = [inst]
    api.checked(f"ok   DescribeInstances {iid}: {state}, {inst['InstanceType']}")


def target_type(launch: Launch, api: Executor) -> None:
    found = launch.instances[0]["InstanceType"] if launch.instances else None
    describe_type(
        launch,
        api,
        found or rq.placeholder(f"instance type of {launch.target}"),
        "GPU count and model of the targeted instance (checked against the recipe)",
    )


def only_instance(resp: DescribeInstancesResultTypeDef, instance_id: str) -> InstanceTypeDef:
    for r in resp.get("Reservations", []):
        for inst in r.get("Instances", []):
            if inst["InstanceId"] == instance_id:
                return inst
    raise BadInput(f"instance {instance_id} not found.")
