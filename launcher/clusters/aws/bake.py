"""`reproduce image bake`'s AWS part: the bake's instance settings, CreateImage and its wait, the
removal of a half-made AMI, and the commands the bake runs on its instance.

Why here, beside the launch program: the bake launches its one instance with the very steps a run
uses (program.py with `Launch.bake`: no GPU check, no P-family quota), so its dry run, launch and
teardown are the run's; only making the AMI is new. The AMI outlives the bake (that is its point),
so teardown never ends it; a bake that fails after CreateImage removes it here instead. Pure
request bodies and steps against an Executor; no boto3 import (docs/aws.md, "An AMI that holds
the image").
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.executor import Executor, Launch, Mode
from launcher.clusters.aws.session import error_code, error_message
from launcher.clusters.aws.settings import (
    DEFAULT_AMI,
    AwsSettings,
    _finite,
    check_ami_form,
    run_image,
    settings_from,
)
from launcher.errors import BadInput, InfraError
from launcher.inputs.profile import AwsProfile
from launcher.plan.image_record import DIGEST

if TYPE_CHECKING:
    from collections.abc import Sequence

    from types_boto3_ec2 import EC2Client
    from types_boto3_ec2.type_defs import TagTypeDef

    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe

# Docker must be stopped (its metadata and layers written out) and the disk synced before the
# snapshot: CreateImage runs with NoReboot, so what is on disk at that moment is the AMI.
QUIESCE = "sudo -n systemctl stop docker.socket docker.service && sync"
_NAME_CHARS = re.compile(r"[^A-Za-z0-9()\[\]./\-'@_]")  # what an AMI name may hold
FAILED_STATES = ("invalid", "failed", "error", "deregistered", "disabled")


@dataclass(frozen=True)
class BakeTarget:
    """What one bake makes: the image (pinned by digest) on an AMI made from `base_ami`."""

    settings: AwsSettings  # of the bake's own instance (one, non-GPU, on-demand)
    image_ref: str
    image_digest: str
    base_ami: str  # as the profile names it (ssm:/... or ami-...); the id is resolved at launch
    timeout_s: float


def bake_target(recipe: Recipe, profile: Profile) -> BakeTarget:
    """The bake's settings: the profile's aws fields, checked as for a run, with the instance
    replaced by `bake_instance_type` from `bake_base_ami`. BadInput names the field."""
    s = settings_from(recipe, profile)  # every field checked as a run checks it
    assert isinstance(profile, AwsProfile)
    where = f"profile {profile.path}"
    if profile.runtime != "docker":
        raise BadInput(
            f"{where}: runtime {profile.runtime}; an AMI holding the image is for runtime docker "
            "(the node runs the image in docker); expected runtime: docker."
        )
    base = profile.bake_base_ami or (DEFAULT_AMI if s.ami_is_baked else s.ami)
    check_ami_form(where, "bake_base_ami", base, baked_allowed=False)
    image = run_image(recipe, profile)
    if not DIGEST.fullmatch(str(image.digest or "")):
        raise BadInput(
            f"{recipe.path}: {image.source_field} names no sha256 digest for {image.repository}; "
            "expected the image pinned by digest (repository@sha256:<64 hex>)."
        )
    timeout = float(_finite(where, "bake_timeout_s", profile.bake_timeout_s))
    bake = dataclasses.replace(
        s,
        instance_type=profile.bake_instance_type,
        nodes=1,
        ami=base,
        capacity_type="on-demand",
        reservation_id=None,
        max_spot_price=None,
        instance_id=None,
        price_per_hour=None,
        image_ref=image.ref,
        image_digest=image.digest,
        volume_initialization_rate=None,  # the bake reads little of its base: the default rate
    )
    return BakeTarget(bake, image.ref, image.digest, base, timeout)


# ------------------------------------------------------------------------------------------------
# On the instance (over SSH; no AWS call)


def pull_command(ref: str) -> str:
    """The pull by digest, as node.sh pulls it."""
    return f"docker pull {shlex.quote(ref)}"


def digests_command(ref: str) -> str:
    """docker's RepoDigests of the pulled image, one a line (node.sh's check reads the same)."""
    return (
        "docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "
        f"{shlex.quote(ref)}"
    )


def node_commands(ref: str, quiesce: str = QUIESCE) -> list[str]:
    """What the bake runs on its instance, in order (the dry run prints them)."""
    return [pull_command(ref), digests_command(ref), quiesce]


# ------------------------------------------------------------------------------------------------
# Request bodies


def image_name(slug: str, digest: str, launch_id: str) -> str:
    """reproduce-<recipe slug>-<12 hex of the digest>-<launch id>, as an AMI name may be (at
    most 128 of its characters; the distinguishing end is kept)."""
    tail = f"-{digest.removeprefix('sha256:')[:12]}-{launch_id}"
    head = _NAME_CHARS.sub("-", f"reproduce-{slug}")[: 128 - len(tail)]
    return _NAME_CHARS.sub("-", head + tail)


def image_tags(tags: Sequence[TagTypeDef], digest: str, base_ami: str) -> list[TagTypeDef]:
    """The launch's tags less its expiry (an AMI is kept: `reap` must not read it as due), plus
    the digest it holds (what `ami: baked` looks it up by) and the AMI it was made from."""
    kept = [t for t in tags if t["Key"] != rq.TAG_EXPIRES]
    return kept + [
        {"Key": rq.TAG_IMAGE_DIGEST, "Value": digest},
        {"Key": rq.TAG_BASE_AMI, "Value": base_ami},
    ]


def create_image_request(
    instance_id: str,
    name: str,
    image_ref: str,
    digest: str,
    base_ami: str,
    tags: Sequence[TagTypeDef],
) -> dict[str, Any]:
    """CreateImage of the bake's instance: NoReboot (docker is stopped and the disk synced), the
    AMI and its snapshots tagged alike (a failed bake finds its snapshots by tag)."""
    every = image_tags(tags, digest, base_ami)
    return {
        "InstanceId": instance_id,
        "Name": name,
        "Description": f"reproduce image bake: {image_ref} on {base_ami}"[:255],
        "NoReboot": True,
        "TagSpecifications": rq.tag_spec("image", every) + rq.tag_spec("snapshot", every),
    }


# ------------------------------------------------------------------------------------------------
# Steps against the launch program's executor


def create_image(launch: Launch, api: Executor, target: BakeTarget) -> str | None:
    """CreateImage; the new AMI's id is written to aws.json the moment AWS returns it."""
    iid = launch.ids[0] if launch.instances else rq.placeholder("the bake's instance")
    name = image_name(str(launch.recipe.slug), target.image_digest, launch.launch_id)
    req = create_image_request(
        iid, name, target.image_ref, target.image_digest, launch.ami_id, launch.tags
    )
    resp = api.create(
        "CreateImage",
        req,
        f"the AMI holding {target.image_ref} (tag {rq.TAG_IMAGE_DIGEST}); kept after the bake",
        "making the AMI",
    )
    if resp is None:
        return None
    image_id = str(resp["ImageId"])
    launch.save(baked_image=image_id)
    launch.log(f"aws: CreateImage {image_id} ({name}); waiting until available")
    return image_id


def wait_image(
    launch: Launch, api: Executor, image_id: str | None, timeout_s: float
) -> dict[str, Any] | None:
    """DescribeImages until the AMI is available (within `timeout_s`); a failed state is an
    InfraError naming AWS's reason."""
    iid = image_id or rq.placeholder("the new AMI")
    params = {"ImageIds": [iid]}
    note = "until the AMI is available (within bake_timeout_s); then the instance is ended"
    if not api.sending:
        api.poll("DescribeImages", params, note, "", lambda _r: None, "", 0.0)
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            resp = api.read("ec2", "DescribeImages", params, "", "", raw=True)
        except Exception as err:  # noqa: BLE001 - a new AMI AWS does not show yet is not gone
            if not error_code(err).startswith("InvalidAMIID"):
                raise InfraError(f"describing AMI {iid}: {error_message(err)}") from err
            resp = {"Images": []}
        found = resp.get("Images") or []
        state = found[0].get("State") if found else None
        if state == "available":
            return dict(found[0])
        if state in FAILED_STATES:
            why = (found[0].get("StateReason") or {}).get("Message") or state
            raise InfraError(f"AMI {iid} is {state}: {why}")
        if time.monotonic() >= deadline:
            raise InfraError(
                f"AMI {iid} was not available within bake_timeout_s={timeout_s:g} s "
                f"(last state {state or 'not shown yet'})"
            )
        time.sleep(api.poll_s)


def discard_image(
    ec2: EC2Client, image_id: str, run_id: str, launch_id: str, log: Callable[[str], Any]
) -> list[str]:
    """Deregister a half-made AMI and delete its snapshots (those its mappings name, and those
    carrying this launch's tags whose description EC2 wrote for this AMI: "Created by
    CreateImage(i-...) for ami-..."; a snapshot that only copies the tags is left); returns what
    could not be removed, in words."""
    left: list[str] = []
    snapshots: set[str] = set()
    try:
        for img in ec2.describe_images(ImageIds=[image_id]).get("Images", []):
            for bdm in img.get("BlockDeviceMappings") or []:
                mapped = (bdm.get("Ebs") or {}).get("SnapshotId")
                if mapped:
                    snapshots.add(str(mapped))
    except Exception:  # noqa: BLE001, S110 - the tag search below still finds its snapshots
        pass
    try:
        ec2.deregister_image(ImageId=image_id)
        log(f"aws: deregistered the half-made AMI {image_id}")
    except Exception as err:  # noqa: BLE001
        if not error_code(err).startswith("InvalidAMIID"):
            left.append(f"AMI {image_id} ({error_message(err)})")
    try:
        found = ec2.describe_snapshots(
            OwnerIds=["self"], Filters=rq.launch_filter(run_id, launch_id)
        ).get("Snapshots", [])
        for snap in found:
            if image_id in str(snap.get("Description") or ""):
                snapshots.add(str(snap["SnapshotId"]))
            elif str(snap["SnapshotId"]) not in snapshots:
                log(
                    f"aws: snapshot {snap['SnapshotId']} carries this bake's tags but was not "
                    f"made for {image_id}: left alone"
                )
    except Exception as err:  # noqa: BLE001
        left.append(f"snapshots tagged {rq.TAG_LAUNCH}={launch_id} ({error_message(err)})")
    for snapshot_id in sorted(snapshots):
        try:
            ec2.delete_snapshot(SnapshotId=snapshot_id)
            log(f"aws: deleted its snapshot {snapshot_id}")
        except Exception as err:  # noqa: BLE001
            if error_code(err) != "InvalidSnapshot.NotFound":
                left.append(f"snapshot {snapshot_id} ({error_message(err)})")
    return left


def print_calls(launch: Launch, api: Executor, target: BakeTarget) -> None:
    """The dry run's part after the launch: CreateImage and its wait (placeholders for ids)."""
    assert api.mode is Mode.PRINT
    create_image(launch, api, target)
    wait_image(launch, api, None, target.timeout_s)
