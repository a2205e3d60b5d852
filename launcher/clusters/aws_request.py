"""The AWS calls that provision a run, as data: one builder for the dry run and the real launch.

Why pure: `reproduce RECIPE --cluster aws --dry-run` must print the exact RunInstances request (and
the security-group, key-pair, placement and capacity calls) fast, with no credentials and no
network, and the launch must send the very same request (ARCHITECTURE.md, "one plan, two
renderings"). So this module imports no boto3: every request body is built here from the recipe,
the profile and whatever has been resolved; what is not resolved yet (the AMI behind an SSM
parameter, the security group made for the run) appears as an explicit `<...>` placeholder.
`launcher.clusters.aws` calls the same `*_request` functions with the real values.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from launcher.errors import BadInput

TAG_PREFIX = "reproduce:"
TAG_RECIPE = "reproduce:recipe"
TAG_RUN_ID = "reproduce:run-id"
TAG_OWNER = "reproduce:owner"
TAG_EXPIRES = "reproduce:expires-at"
DEFAULT_USER = "ubuntu"  # the DLAMI's login user
CAPACITY_TYPES = ("on-demand", "reservation", "capacity-block", "spot")
EFA_LAYOUTS = ("efa-primary", "ena-primary")


@dataclass(frozen=True)
class InstanceFacts:
    """What the launcher needs to know about an instance type (from describe_instance_types)."""

    gpus: int
    gpu_name: str
    network_cards: int
    max_efa: int


# Used only when the API cannot be asked (the dry run); the launch reads describe_instance_types.
# Figures: aws-p5en.md and the instance-type data moto copies from AWS.
KNOWN_INSTANCE_TYPES: dict[str, InstanceFacts] = {
    "p5en.48xlarge": InstanceFacts(8, "H200", 16, 16),
    "p5e.48xlarge": InstanceFacts(8, "H200", 32, 32),
    "p5.48xlarge": InstanceFacts(8, "H100", 32, 32),
    "p4de.24xlarge": InstanceFacts(8, "A100", 4, 4),
    "p4d.24xlarge": InstanceFacts(8, "A100", 4, 4),
}


@dataclass
class ApiCall:
    """One AWS API call: what the dry run prints and what the launch sends."""

    service: str
    operation: str
    params: dict[str, Any]
    note: str = ""


def placeholder(what: str) -> str:
    """A value the dry run cannot know; the launch replaces it."""
    return f"<{what}>"


def is_placeholder(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("<") and value.endswith(">")


# ------------------------------------------------------------------------------------------------
# Settings: the profile's aws fields, checked once


@dataclass(frozen=True)
class AwsSettings:
    """The aws fields of a profile, with the recipe's defaults filled in and checked."""

    region: str | None
    instance_type: str
    nodes: int
    ami: str
    subnet_id: str | None
    key_name: str | None
    identity_file: str | None
    ssh_cidr: str | None
    capacity_type: str
    reservation_id: str | None
    max_spot_price: float | None
    ttl_hours: float
    root_volume_gb: int
    efa_layout: str
    extra_tags: dict[str, str]
    port: int
    user: str
    connect_host: str | None
    connect_timeout_s: float
    elastic_ip: bool
    self_terminate: bool
    ready_timeout_s: float
    price_per_hour: float | None
    instance_id: str | None = None
    known_hosts: str | None = None
    host_key_fingerprint: str | None = None
    accept_unknown_host: bool = False

    @property
    def ami_is_ssm(self) -> bool:
        return self.ami.startswith("ssm:")

    @property
    def ssm_parameter(self) -> str:
        return self.ami[len("ssm:") :]


def settings_from(recipe: Any, profile: Any) -> AwsSettings:
    """Read and check the aws fields; BadInput names the field for anything that cannot work."""
    get = profile.get
    instance_type = get("instance_type") or recipe.instance_type
    if not instance_type:
        raise BadInput(
            f"{recipe.path}: gpu.instance names no instance type and the profile sets no instance_type; "
            "expected e.g. `instance_type: p5en.48xlarge` in the aws profile."
        )
    provider = getattr(recipe, "provider", None)
    if not get("instance_type") and provider not in (None, "aws"):
        raise BadInput(
            f"{recipe.path}: gpu.instance is {recipe.raw['gpu'].get('instance')!r}, not an AWS instance; "
            "set instance_type in the aws profile to the EC2 type to use."
        )
    ami = (
        get("ami")
        or "ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
    )
    if not (re.fullmatch(r"ami-[0-9a-f]{8,17}", ami) or re.fullmatch(r"ssm:/\S+", ami)):
        raise BadInput(
            f"profile {profile.path}: ami {ami!r}; expected ami-<hex> or ssm:/<public parameter name>."
        )
    capacity = dict(get("capacity", {}) or {})
    ctype = capacity.get("type") or "on-demand"
    reservation_id = capacity.get("reservation_id")
    if ctype not in CAPACITY_TYPES:
        raise BadInput(
            f"profile {profile.path}: capacity.type {ctype!r}; expected one of {', '.join(CAPACITY_TYPES)}."
        )
    if ctype in ("reservation", "capacity-block") and not reservation_id:
        raise BadInput(
            f"profile {profile.path}: capacity.type {ctype} needs capacity.reservation_id (cr-...).",
            hint="`reproduce capacity RECIPE --cluster aws` lists Capacity Block offerings.",
        )
    if reservation_id and not re.fullmatch(r"cr-[0-9a-f]{8,17}", str(reservation_id)):
        raise BadInput(
            f"profile {profile.path}: capacity.reservation_id {reservation_id!r}; expected cr-<hex>."
        )
    if reservation_id and ctype not in ("reservation", "capacity-block"):
        raise BadInput(
            f"profile {profile.path}: capacity.reservation_id is set but capacity.type is {ctype}; "
            "expected type reservation or capacity-block."
        )
    layout = get("efa_layout")
    if layout not in EFA_LAYOUTS:
        raise BadInput(
            f"profile {profile.path}: efa_layout {layout!r}; expected one of {', '.join(EFA_LAYOUTS)}."
        )
    cidr = get("ssh_cidr")
    if cidr is not None:
        _check_cidr(str(cidr), f"profile {profile.path}: ssh_cidr")
    return AwsSettings(
        region=get("region"),
        instance_type=str(instance_type),
        nodes=int(recipe.nodes),
        ami=str(ami),
        subnet_id=get("subnet_id"),
        key_name=get("key_name"),
        identity_file=get("identity_file"),
        ssh_cidr=cidr,
        capacity_type=ctype,
        reservation_id=reservation_id,
        max_spot_price=capacity.get("max_spot_price"),
        ttl_hours=float(get("ttl_hours")),
        root_volume_gb=int(get("root_volume_gb")),
        efa_layout=layout,
        extra_tags={str(k): str(v) for k, v in (get("tags") or {}).items()},
        port=int(get("port")),
        user=get("user") or DEFAULT_USER,
        connect_host=get("connect_host"),
        connect_timeout_s=float(get("connect_timeout_s")),
        elastic_ip=bool(get("elastic_ip", True)),
        self_terminate=bool(get("self_terminate", True)),
        ready_timeout_s=float(get("ready_timeout_s", 1800)),
        price_per_hour=get("price_per_hour"),
        instance_id=get("instance_id"),
        known_hosts=get("known_hosts"),
        host_key_fingerprint=get("host_key_fingerprint"),
        accept_unknown_host=bool(get("accept_unknown_host", False)),
    )


def _check_cidr(cidr: str, where: str) -> None:
    import ipaddress

    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise BadInput(
            f"{where} {cidr!r} is not a CIDR; expected your address as a /32, e.g. 203.0.113.7/32."
        ) from None
    if net.prefixlen == 0:
        raise BadInput(
            f"{where} {cidr} opens SSH to the whole internet; expected the operator's address as a /32."
        )


def gpu_mismatch(recipe: Any, instance_type: str, facts: InstanceFacts) -> str | None:
    """Why this instance type cannot run the recipe's nodes (GPU count or model), or None."""
    wanted = str(recipe.gpu_type).upper().replace("NVIDIA", "").strip()
    have = facts.gpu_name.upper().replace("NVIDIA", "").strip()
    problems = []
    if facts.gpus != recipe.gpus_per_node:
        problems.append(
            f"{facts.gpus} GPUs per instance, the recipe needs gpu.per_node={recipe.gpus_per_node}"
        )
    if wanted and have and wanted not in have and have not in wanted:
        problems.append(
            f"its GPUs are {facts.gpu_name}, the recipe's gpu.type is {recipe.gpu_type}"
        )
    if not problems:
        return None
    return f"instance type {instance_type} does not match the recipe: " + "; ".join(problems) + "."


def check_instance_type(recipe: Any, instance_type: str, facts: InstanceFacts | None) -> None:
    if facts is None:
        return
    problem = gpu_mismatch(recipe, instance_type, facts)
    if problem:
        raise BadInput(
            problem, hint="Set instance_type in the aws profile to a type with the recipe's GPUs."
        )


# ------------------------------------------------------------------------------------------------
# Tags


def expires_at(now: datetime, ttl_hours: float) -> str:
    """ISO UTC time after which `reproduce reap` ends the run's resources."""
    when = now.astimezone(UTC) + timedelta(hours=ttl_hours)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def run_tags(
    recipe: Any, run_id: str, owner: str, expires: str, extra: dict[str, str] | None = None
) -> list[dict[str, str]]:
    """The tags on every resource the launcher creates (the reaper and `down` find them by these)."""
    tags = {k: v for k, v in (extra or {}).items() if not k.startswith(TAG_PREFIX) and k != "Name"}
    tags.update(
        {
            "Name": f"reproduce-{run_id}",
            TAG_RECIPE: str(recipe.slug)[:255],
            TAG_RUN_ID: run_id,
            TAG_OWNER: owner[:255],
            TAG_EXPIRES: expires,
        }
    )
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def tag_spec(resource_type: str, tags: list[dict[str, str]]) -> list[dict[str, Any]]:
    return [{"ResourceType": resource_type, "Tags": list(tags)}]


# ------------------------------------------------------------------------------------------------
# Request bodies (shared by the dry run and the launch)


def resource_name(run_id: str) -> str:
    """Name of the security group, key pair and placement group made for a run."""
    return f"reproduce-{run_id}"


def security_group_request(run_id: str, vpc_id: str, tags: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "GroupName": resource_name(run_id),
        "Description": f"reproduce run {run_id}: all traffic within the group (EFA), SSH from the operator",
        "VpcId": vpc_id,
        "TagSpecifications": tag_spec("security-group", tags),
    }


def ingress_request(group_id: str, port: int, cidr: str) -> dict[str, Any]:
    """All traffic from the group itself (EFA needs it) and SSH from one address only."""
    ranges = "Ipv6Ranges" if ":" in cidr else "IpRanges"
    key = "CidrIpv6" if ":" in cidr else "CidrIp"
    ssh = {
        "IpProtocol": "tcp",
        "FromPort": port,
        "ToPort": port,
        ranges: [{key: cidr, "Description": "SSH from the operator"}],
    }
    return {
        "GroupId": group_id,
        "IpPermissions": [
            {
                "IpProtocol": "-1",
                "UserIdGroupPairs": [
                    {"GroupId": group_id, "Description": "the run's own nodes (EFA, NCCL, Ray)"}
                ],
            },
            ssh,
        ],
    }


def key_pair_request(run_id: str, tags: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "KeyName": resource_name(run_id),
        "KeyType": "ed25519",
        "KeyFormat": "pem",
        "TagSpecifications": tag_spec("key-pair", tags),
    }


def placement_group_request(run_id: str, tags: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "GroupName": resource_name(run_id),
        "Strategy": "cluster",
        "TagSpecifications": tag_spec("placement-group", tags),
    }


def network_interfaces(
    network_cards: int | None, max_efa: int | None, layout: str, subnet_id: str, group_id: str
) -> Any:
    """One interface per network card, EFA on every card the type allows.

    efa-primary: card 0 device 0 is an `efa` interface (EFA plus IP), every further card an
    `efa-only` at device index 0. ena-primary (AWS's current advice): card 0 device 0 a plain ENA
    `interface`, an `efa-only` at card 0 device 1, and an `efa-only` at device 0 of each further
    card. Either way a p5en gets 16 EFA devices, one per card.
    """
    if network_cards is None:
        return placeholder(
            "one interface per network card: counts from describe_instance_types at launch"
        )

    def nic(card: int, device: int, kind: str) -> dict[str, Any]:
        return {
            "NetworkCardIndex": card,
            "DeviceIndex": device,
            "InterfaceType": kind,
            "SubnetId": subnet_id,
            "Groups": [group_id],
            "DeleteOnTermination": True,
        }

    efa = max(0, min(network_cards, max_efa or 0))
    if efa == 0:
        return [nic(0, 0, "interface")]
    if layout == "ena-primary":
        out = [nic(0, 0, "interface"), nic(0, 1, "efa-only")]
        out += [nic(card, 0, "efa-only") for card in range(1, efa)]
        return out
    return [nic(0, 0, "efa")] + [nic(card, 0, "efa-only") for card in range(1, efa)]


def user_data(s: AwsSettings) -> str | None:
    """A dead man's switch: the instance powers itself off (and so terminates) at its TTL."""
    if not s.self_terminate:
        return None
    minutes = max(1, int(round(s.ttl_hours * 60)))
    return (
        "#!/bin/bash\n# reproduce: end this instance at its expires-at even if no launcher or reaper is left\n"
        f"shutdown -h +{minutes} 'reproduce: ttl_hours reached'\n"
    )


def run_instances_request(
    s: AwsSettings,
    *,
    ami_id: str,
    subnet_id: str,
    group_id: str,
    key_name: str,
    placement_group: str | None,
    root_device: str,
    network_cards: int | None,
    max_efa: int | None,
    tags: list[dict[str, str]],
    client_token: str,
) -> dict[str, Any]:
    """The RunInstances body: all nodes at once, in one placement group, IMDSv2, encrypted gp3."""
    req: dict[str, Any] = {
        "ImageId": ami_id,
        "InstanceType": s.instance_type,
        "MinCount": s.nodes,
        "MaxCount": s.nodes,
        "KeyName": key_name,
        "NetworkInterfaces": network_interfaces(
            network_cards, max_efa, s.efa_layout, subnet_id, group_id
        ),
        "BlockDeviceMappings": [
            {
                "DeviceName": root_device,
                "Ebs": {
                    "VolumeSize": s.root_volume_gb,
                    "VolumeType": "gp3",
                    "Encrypted": True,
                    "DeleteOnTermination": True,
                },
            }
        ],
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "InstanceInitiatedShutdownBehavior": "terminate",
        "TagSpecifications": tag_spec("instance", tags)
        + tag_spec("volume", tags)
        + tag_spec("network-interface", tags),
        "ClientToken": client_token,
    }
    if placement_group:
        req["Placement"] = {"GroupName": placement_group}
    if s.capacity_type in ("reservation", "capacity-block"):
        req["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": s.reservation_id}
        }
    if s.capacity_type == "capacity-block":
        req["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    if s.capacity_type == "spot":
        spot: dict[str, Any] = {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        }
        if s.max_spot_price is not None:
            spot["MaxPrice"] = f"{float(s.max_spot_price):.4f}"
        req["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
    data = user_data(s)
    if data:
        req["UserData"] = data  # boto3 base64-encodes it
    return req


def allocate_address_request(tags: list[dict[str, str]]) -> dict[str, Any]:
    return {"Domain": "vpc", "TagSpecifications": tag_spec("elastic-ip", tags)}


def associate_address_request(allocation_id: str, network_interface_id: str) -> dict[str, Any]:
    return {
        "AllocationId": allocation_id,
        "NetworkInterfaceId": network_interface_id,
        "AllowReassociation": False,
    }


def client_token(run_id: str, attempt: int = 0) -> str:
    """Idempotency token: a retried RunInstances never launches twice (one per subnet tried)."""
    return f"reproduce-{run_id}-{attempt}"


# ------------------------------------------------------------------------------------------------
# The dry run's list


def provisioning_calls(
    recipe: Any,
    profile: Any,
    run_id: str,
    *,
    owner: str,
    now: datetime,
    ami_id: str | None = None,
    operator_cidr: str | None = None,
) -> list[ApiCall]:
    """Every AWS call a launch makes, in order, with placeholders for what only the launch knows."""
    s = settings_from(recipe, profile)
    facts = KNOWN_INSTANCE_TYPES.get(s.instance_type)
    check_instance_type(recipe, s.instance_type, facts)
    tags = run_tags(recipe, run_id, owner, expires_at(now, s.ttl_hours), s.extra_tags)
    calls: list[ApiCall] = []
    if s.instance_id:
        calls.append(
            ApiCall(
                "ec2",
                "DescribeInstances",
                {"InstanceIds": [s.instance_id]},
                "target the existing instance: nothing is created, and it is never terminated",
            )
        )
        return calls

    calls.append(
        ApiCall(
            "ec2",
            "DescribeInstanceTypes",
            {"InstanceTypes": [s.instance_type]},
            "GPU count and model (checked against the recipe), network cards and EFA interfaces",
        )
    )
    if ami_id is None and s.ami_is_ssm:
        calls.append(
            ApiCall(
                "ssm",
                "GetParameter",
                {"Name": s.ssm_parameter},
                "resolve the AMI id (recorded in the run)",
            )
        )
        ami = placeholder(f"resolved at launch: {s.ami}")
    else:
        ami = ami_id or s.ami
    calls.append(
        ApiCall("ec2", "DescribeImages", {"ImageIds": [ami]}, "the AMI's root device name")
    )

    if s.reservation_id:
        calls.append(
            ApiCall(
                "ec2",
                "DescribeCapacityReservations",
                {"CapacityReservationIds": [s.reservation_id]},
                f"{s.capacity_type}: its availability zone, state and instance type",
            )
        )
    if s.subnet_id:
        subnet = s.subnet_id
        calls.append(
            ApiCall(
                "ec2", "DescribeSubnets", {"SubnetIds": [s.subnet_id]}, "the subnet's VPC and zone"
            )
        )
    else:
        subnet = placeholder(
            "default subnet of the default VPC in a zone offering " + s.instance_type
        )
        if not s.reservation_id:
            calls.append(
                ApiCall(
                    "ec2",
                    "DescribeInstanceTypeOfferings",
                    {
                        "LocationType": "availability-zone",
                        "Filters": [{"Name": "instance-type", "Values": [s.instance_type]}],
                    },
                    "zones that offer the type (the next is tried on InsufficientInstanceCapacity)",
                )
            )
        calls.append(
            ApiCall(
                "ec2",
                "DescribeSubnets",
                {"Filters": [{"Name": "default-for-az", "Values": ["true"]}]},
                "the default VPC's subnets",
            )
        )

    group = placeholder("security group created for this run")
    calls.append(
        ApiCall(
            "ec2",
            "CreateSecurityGroup",
            security_group_request(run_id, placeholder("VPC of the subnet"), tags),
        )
    )
    cidr = (
        s.ssh_cidr
        or operator_cidr
        or placeholder("your public address as a /32, looked up at launch")
    )
    calls.append(
        ApiCall(
            "ec2",
            "AuthorizeSecurityGroupIngress",
            ingress_request(group, s.port, cidr),
            "SSH from one address only; all traffic within the group for EFA",
        )
    )
    if s.key_name:
        key_name = s.key_name
    else:
        key_name = resource_name(run_id)
        calls.append(
            ApiCall(
                "ec2",
                "CreateKeyPair",
                key_pair_request(run_id, tags),
                "private key saved with mode 0600 outside the run directory; deleted at teardown",
            )
        )
    pg = None
    if s.nodes > 1:
        pg = resource_name(run_id)
        calls.append(
            ApiCall(
                "ec2",
                "CreatePlacementGroup",
                placement_group_request(run_id, tags),
                f"{s.nodes} nodes: one cluster placement group",
            )
        )
    cards = facts.network_cards if facts else None
    efa = facts.max_efa if facts else None
    calls.append(
        ApiCall(
            "ec2",
            "RunInstances",
            run_instances_request(
                s,
                ami_id=ami,
                subnet_id=subnet,
                group_id=group,
                key_name=key_name,
                placement_group=pg,
                root_device=placeholder("root device name of the AMI"),
                network_cards=cards,
                max_efa=efa,
                tags=tags,
                client_token=client_token(run_id),
            ),
            _capacity_note(s),
        )
    )
    if s.elastic_ip:
        for i in range(s.nodes):
            calls.append(
                ApiCall(
                    "ec2",
                    "AllocateAddress",
                    allocate_address_request(tags),
                    f"node {i}: an Elastic IP for SSH (several interfaces get no public address)",
                )
            )
            calls.append(
                ApiCall(
                    "ec2",
                    "AssociateAddress",
                    associate_address_request(
                        placeholder(f"allocation of node {i}"),
                        placeholder(f"primary interface of node {i}"),
                    ),
                    "",
                )
            )
    calls.append(
        ApiCall(
            "ec2",
            "DescribeInstanceStatus",
            {"InstanceIds": [placeholder("launched instances")]},
            "wait for running and status ok, then for SSH, within ready_timeout_s",
        )
    )
    return calls


def _capacity_note(s: AwsSettings) -> str:
    if s.capacity_type == "on-demand":
        return "on-demand capacity"
    if s.capacity_type == "reservation":
        return f"into the capacity reservation {s.reservation_id}"
    if s.capacity_type == "capacity-block":
        return f"into the Capacity Block {s.reservation_id} (market type capacity-block)"
    return "spot" + (
        f", at most ${s.max_spot_price}/h"
        if s.max_spot_price is not None
        else ", at most the on-demand price"
    )


def to_jsonable(calls: list[ApiCall]) -> list[dict[str, Any]]:
    """The calls as plain data for printing (JSON or YAML)."""
    return [asdict(call) for call in calls]
