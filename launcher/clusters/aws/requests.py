"""The bodies of the AWS calls that provision a run, as plain data (no boto3).

Why pure: the dry run prints these bodies without credentials or network, `--check` sends them
with DryRun=True and the launch sends them for real; all three take them from here, through the
one launch program (launcher/clusters/aws/program.py). What only the launch can know (the AMI
behind an SSM parameter, the security group made for the run) is an explicit `<...>` placeholder
in the dry run. See docs/aws.md for why each field is set as it is (EFA, IMDSv2, tags, TTL).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from launcher.plan.protocol import FOLLOWED_MARK

if TYPE_CHECKING:
    from collections.abc import Sequence

    from types_boto3_ec2.type_defs import FilterTypeDef, TagTypeDef

    from launcher.clusters.aws.settings import AwsSettings
    from launcher.inputs.recipe import Recipe

TAG_PREFIX = "reproduce:"
TAG_RECIPE = "reproduce:recipe"
TAG_RUN_ID = "reproduce:run-id"
TAG_OWNER = "reproduce:owner"
TAG_EXPIRES = "reproduce:expires-at"
TAG_LAUNCH = "reproduce:launch-id"  # one launch of a run: a reused run id never adopts another's
TAG_IMAGE_DIGEST = "reproduce:image-digest"  # a baked AMI: the image digest it holds
TAG_BASE_AMI = "reproduce:base-ami"  # a baked AMI: the AMI it was made from
EXPIRES_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# The AWS services the launcher calls (the test extra has their stubs: pyproject.toml)
Service = Literal["ec2", "sts", "ssm", "ecr", "pricing", "service-quotas"]


@dataclass
class ApiCall:
    """One AWS API call: what the dry run prints and what the launch sends."""

    service: Service
    operation: str
    params: dict[str, Any]
    note: str = ""


def placeholder(what: str) -> str:
    """A value the dry run cannot know; the launch replaces it."""
    return f"<{what}>"


def is_placeholder(value: object) -> bool:
    return isinstance(value, str) and value.startswith("<") and value.endswith(">")


def to_jsonable(calls: list[ApiCall]) -> list[dict[str, Any]]:
    """The calls as plain data for printing (JSON or YAML)."""
    return [asdict(call) for call in calls]


# ------------------------------------------------------------------------------------------------
# Tags


def expires_at(now: datetime, ttl_hours: float) -> str:
    """ISO UTC time after which `reproduce reap` ends the run's resources."""
    when = now.astimezone(UTC) + timedelta(hours=ttl_hours)
    return when.strftime(EXPIRES_FORMAT)


def run_tags(
    recipe: Recipe,
    run_id: str,
    owner: str,
    expires: str,
    launch_id: str,
    extra: dict[str, str] | None = None,
) -> list[TagTypeDef]:
    """The tags on every resource the launcher creates (reap and `down` find them by these).

    The launch id is what teardown checks before it ends anything: the run id alone can be
    reused (`--run-id`), the launch id is drawn anew for every launch.
    """
    # The profile's schema refuses Name and reproduce:* (they were dropped here without a word);
    # kept as the last guard: what finds a run is never another's to set.
    tags = {k: v for k, v in (extra or {}).items() if not k.startswith(TAG_PREFIX) and k != "Name"}
    tags.update(
        {
            "Name": f"reproduce-{run_id}",
            TAG_RECIPE: str(recipe.slug)[:255],
            TAG_RUN_ID: run_id,
            TAG_LAUNCH: launch_id,
            TAG_OWNER: owner[:255],
            TAG_EXPIRES: expires,
        }
    )
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def tag_spec(resource_type: str, tags: Sequence[TagTypeDef]) -> list[dict[str, Any]]:
    return [{"ResourceType": resource_type, "Tags": list(tags)}]


def launch_filter(run_id: str, launch_id: str | None) -> list[FilterTypeDef]:
    """The Filters that find what one launch made (teardown's net for what aws.json missed).

    Without a launch id (a record from before launch ids, or one that could not be read) only the
    run id filters; the caller then decides whether what it finds is this launch's.
    """
    found: list[FilterTypeDef] = [{"Name": f"tag:{TAG_RUN_ID}", "Values": [run_id]}]
    if launch_id:
        found.append({"Name": f"tag:{TAG_LAUNCH}", "Values": [launch_id]})
    return found


def tag_values(tags: Sequence[TagTypeDef] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in tags or [] if "Key" in t}


def foreign_because(tags: Sequence[TagTypeDef] | None, run_id: str, launch_id: str | None) -> str:
    """Why a resource is not this launch's ('' when it is): what teardown checks before it ends.

    A resource is this launch's only when it carries the run id and, where one is known, the
    launch id: an aws.json can list anything (a node wrote it, a run id was reused).
    """
    have = tag_values(tags)
    if have.get(TAG_RUN_ID) != run_id:
        return f"its {TAG_RUN_ID} tag is {have.get(TAG_RUN_ID)!r}, not {run_id!r}"
    if launch_id and have.get(TAG_LAUNCH) != launch_id:
        return f"its {TAG_LAUNCH} tag is {have.get(TAG_LAUNCH)!r}, not {launch_id!r}"
    return ""


# ------------------------------------------------------------------------------------------------
# Request bodies


def resource_name(run_id: str, launch_id: str) -> str:
    """Name of the security group, key pair and placement group made for one launch of a run.

    Names are unique per account, so two launches with the same run id must not share one.
    """
    return f"reproduce-{run_id}-{launch_id}"


def security_group_request(
    run_id: str, launch_id: str, vpc_id: str, tags: Sequence[TagTypeDef]
) -> dict[str, Any]:
    return {
        "GroupName": resource_name(run_id, launch_id),
        "Description": f"reproduce run {run_id}: all traffic within the group (EFA), "
        "SSH from the operator",
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


def key_pair_request(run_id: str, launch_id: str, tags: Sequence[TagTypeDef]) -> dict[str, Any]:
    return {
        "KeyName": resource_name(run_id, launch_id),
        "KeyType": "ed25519",
        "KeyFormat": "pem",
        "TagSpecifications": tag_spec("key-pair", tags),
    }


def placement_group_request(
    run_id: str, launch_id: str, tags: Sequence[TagTypeDef]
) -> dict[str, Any]:
    return {
        "GroupName": resource_name(run_id, launch_id),
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


PREPULL_LOG = "/var/log/reproduce-prepull.log"
RUN_END_LOG = "/var/log/reproduce-run-end.log"
RUN_END_POLL_S = 2  # how often the watcher looks for the run's exit code (a file test)


def user_data(s: AwsSettings) -> str | None:
    """What the instance runs as it boots (cloud-init, as root): a dead man's switch (it powers
    itself off, and so terminates, at its TTL) and the start of the image's pull. The pull would
    otherwise begin only once EC2's status checks pass, SSH answers and node.sh runs, while the
    node is billed: started here it overlaps that wait, and node.sh's own `docker pull` of the
    same digest joins the layers in flight (or does the whole pull, where this one failed: a
    registry that needs a login). Nothing secret is in it (user data is readable to whoever may
    describe the instance)."""
    lines = []
    if s.self_terminate:
        minutes = max(1, int(round(s.ttl_hours * 60)))
        lines += [
            "# reproduce: end this instance at its expires-at even if no launcher or reaper is"
            " left",
            f"shutdown -h +{minutes} 'reproduce: ttl_hours reached'",
        ]
    if s.self_terminate and s.run_end_watch:
        lines += [
            "# reproduce: end this instance when its run has ended and a follower had"
            f" {s.run_end_grace_s:g} s to collect (unless --keep)",
            *run_end_lines(s.run_end_watch, s.run_end_grace_s, RUN_END_LOG),
        ]
    if s.prepull_ref:
        lines += [
            "# reproduce: start pulling the run's image now; node.sh's pull joins it",
            *prepull_lines(s.prepull_ref, PREPULL_LOG),
        ]
    return "#!/bin/bash\n" + "".join(f"{line}\n" for line in lines) if lines else None


def prepull_lines(ref: str, log: str) -> list[str]:
    """The boot's pull, in the background (cloud-init waits for the script, not for this): it
    waits up to 5 minutes for dockerd, then pulls by digest, its output in `log`."""
    body = (
        "for _ in $(seq 150); do docker info >/dev/null 2>&1 && break; sleep 2; done; "
        f"docker pull {shlex.quote(ref)}"
    )
    return [f"nohup setsid bash -c {shlex.quote(body)} >{shlex.quote(log)} 2>&1 </dev/null &"]


def run_end_lines(node_run_dir: str, grace_s: float, log: str) -> list[str]:
    """The boot's watcher of the run's end, in the background: once the node run directory's
    exit_code exists (the wrapper writes it last, also for a cancel), it gives a follower
    `grace_s` to collect, counted from the later of exit_code and the follower's last heartbeat
    (protocol.FOLLOWED_MARK, touched while it reads), then powers the instance off, which
    terminates it (InstanceInitiatedShutdownBehavior), as the TTL's shutdown does. A follower that
    attached late and is still reading keeps the node; one that is gone does not."""
    d = shlex.quote(node_run_dir)
    mark = shlex.quote(f"{node_run_dir}/{FOLLOWED_MARK}")
    grace = math.ceil(grace_s)
    body = (
        f"until [ -f {d}/exit_code ]; do sleep {RUN_END_POLL_S}; done; "
        f'echo "run ended: $(date -u +%FT%TZ); powering off {grace} s after it or after the last '
        'read of its follower"; '
        f"while last=$(stat -c %Y {d}/exit_code {mark} 2>/dev/null | sort -n | tail -n 1); "
        f"[ $(( $(date +%s) - ${{last:-0}} )) -lt {grace} ]; do sleep {RUN_END_POLL_S}; done; "
        "shutdown -h now 'reproduce: the run ended'"
    )
    # stdin is cloud-init's (nothing to read): no `<` redirect, which a reader of the printed
    # request takes for the start of a placeholder
    return [f"nohup setsid bash -c {shlex.quote(body)} >{shlex.quote(log)} 2>&1 &"]


def run_instances_request(
    s: AwsSettings,
    *,
    ami_id: str,
    subnet_id: str,
    group_id: str,
    key_name: str | None,
    placement_group: str | None,
    root_device: str,
    network_cards: int | None,
    max_efa: int | None,
    tags: Sequence[TagTypeDef],
    client_token: str,
) -> dict[str, Any]:
    """The RunInstances body: all nodes at once, in one placement group, IMDSv2, encrypted gp3.

    key_name None leaves KeyName out (`--check`: the run's own key pair does not exist yet).
    """
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
                    # provisioned above gp3's baseline (125 MiB/s, 3000 IOPS): the pull writes here
                    "Throughput": s.root_volume_throughput,
                    "Iops": s.root_volume_iops,
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
    if key_name is None:
        del req["KeyName"]
    if s.volume_initialization_rate is not None:  # the root volume from the AMI's snapshot
        req["BlockDeviceMappings"][0]["Ebs"]["VolumeInitializationRate"] = int(
            s.volume_initialization_rate
        )
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


def allocate_address_request(tags: Sequence[TagTypeDef]) -> dict[str, Any]:
    return {"Domain": "vpc", "TagSpecifications": tag_spec("elastic-ip", tags)}


def associate_address_request(allocation_id: str, network_interface_id: str) -> dict[str, Any]:
    return {
        "AllocationId": allocation_id,
        "NetworkInterfaceId": network_interface_id,
        "AllowReassociation": False,
    }


def client_token(launch_id: str, attempt: int = 0) -> str:
    """Idempotency token: a retried RunInstances never launches twice (one per subnet tried).

    Made from the launch id, not the run id: AWS answers a RunInstances whose token it has seen
    with the instances of the first call, so a reused run id would otherwise adopt them.
    """
    return f"reproduce-{launch_id}-{attempt}"


def capacity_words(s: AwsSettings) -> str:
    """The capacity a launch asks for, in words (the dry run's note and the launch's log)."""
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


# ------------------------------------------------------------------------------------------------
# Baked AMIs (`reproduce image bake`, `ami: baked`)


def baked_images_request(digest: str) -> dict[str, Any]:
    """DescribeImages of this account's available AMIs that hold the image `digest`."""
    return {
        "Owners": ["self"],
        "Filters": [
            {"Name": f"tag:{TAG_IMAGE_DIGEST}", "Values": [digest]},
            {"Name": "state", "Values": ["available"]},
        ],
    }


BAKE_RUN_PREFIX = "bake-"  # prepare/bake.py: a bake's run id


def foreign_bake(have: dict[str, str], owner: str) -> str:
    """Why an AMI is not a bake of OWNER's ('' when it is): `ami: baked` launches and `image
    prune` removes only AMIs tagged reproduce:owner = OWNER by a bake's run id, since whoever
    baked the AMI decides what image its docker store holds. HAVE: its tags (tag_values)."""
    if have.get(TAG_OWNER) != owner:
        return f"{TAG_OWNER}={have.get(TAG_OWNER) or '(none)'}: not this owner's"
    if not have.get(TAG_RUN_ID, "").startswith(BAKE_RUN_PREFIX) or not have.get(TAG_IMAGE_DIGEST):
        return "not made by `reproduce image bake`"
    return ""


def newest_image(images: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest of DescribeImages' answer (CreationDate is ISO 8601 UTC: it sorts as text)."""
    return max(images, key=lambda i: (str(i.get("CreationDate") or ""), i["ImageId"]), default=None)
