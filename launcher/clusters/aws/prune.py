"""`reproduce image prune`'s AWS part: which baked AMIs are old, and their removal.

Why: an AMI that `reproduce image bake` made is kept on purpose, and its snapshot bills every
month (EBS snapshot storage, $0.05/GB-month in the standard tier in us-east-1, Amazon EBS pricing).
`ami: baked` only ever launches from the newest available AMI of a digest (lookups.py), so every
newer bake turns the older ones into pure cost that nobody sees until the bill.

The promise, kept here and nowhere else: prune removes only what it can prove is a finished bake
of this owner that a run would not take. An AMI is removable only if it is this account's
(`Owners: [self]`), carries `reproduce:image-digest`, `reproduce:owner` = this owner and a
`reproduce:run-id` of a bake (`bake-...`); per digest, the newest `keep` available ones stay (the
first is what `ami: baked` uses); an AMI still pending (a bake under way) or disabled (someone chose
to keep it that way) is left alone, as is everyone else's. An AMI's snapshots go only after the
AMI is deregistered (AWS refuses to delete a snapshot an AMI still uses). Instances already
running from a removed AMI keep running: their volumes do not need the AMI or its snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.session import error_code, error_message

if TYPE_CHECKING:
    from types_boto3_ec2 import EC2Client
    from types_boto3_ec2.type_defs import ImageTypeDef

SNAPSHOT_USD_PER_GB_MONTH = 0.05  # Amazon EBS pricing: snapshot storage, standard tier, us-east-1
BAKE_RUN_PREFIX = rq.BAKE_RUN_PREFIX
LEFT_ALONE_STATES = {
    "pending": "a bake still under way",
    "disabled": "disabled by hand: enable or deregister it yourself",
}


@dataclass(frozen=True)
class BakedAmi:
    """One AMI of DescribeImages' answer, as prune reads it."""

    image_id: str
    name: str
    created: str  # CreationDate, ISO 8601 UTC: sorts as text
    state: str
    digest: str
    owner: str
    run_id: str
    snapshots: tuple[str, ...]
    size_gb: int  # the mapped volumes' sizes: at most what its snapshots hold

    @classmethod
    def of(cls, image: ImageTypeDef) -> BakedAmi:
        tags = rq.tag_values(image.get("Tags"))
        ebs = [m.get("Ebs") or {} for m in image.get("BlockDeviceMappings") or []]
        return cls(
            image_id=str(image["ImageId"]),
            name=str(image.get("Name") or ""),
            created=str(image.get("CreationDate") or ""),
            state=str(image.get("State") or ""),
            digest=tags.get(rq.TAG_IMAGE_DIGEST, ""),
            owner=tags.get(rq.TAG_OWNER, ""),
            run_id=tags.get(rq.TAG_RUN_ID, ""),
            snapshots=tuple(str(e["SnapshotId"]) for e in ebs if e.get("SnapshotId")),
            size_gb=sum(int(e.get("VolumeSize") or 0) for e in ebs),
        )


@dataclass(frozen=True)
class PrunePlan:
    keep: list[BakedAmi]  # newest first within each digest
    remove: list[BakedAmi]
    left: list[tuple[BakedAmi, str]]  # not this prune's to touch, and why


def images_request(digest: str | None) -> dict[str, Any]:
    """DescribeImages of this account's baked AMIs: of one image digest, or of every digest.
    Every state: a failed bake's leftover is removable too, a pending one is named."""
    tag = (
        {"Name": f"tag:{rq.TAG_IMAGE_DIGEST}", "Values": [digest]}
        if digest
        else {"Name": "tag-key", "Values": [rq.TAG_IMAGE_DIGEST]}
    )
    return {"Owners": ["self"], "Filters": [tag]}


def list_baked(ec2: EC2Client, digest: str | None) -> list[BakedAmi]:
    """Every page of DescribeImages' answer (a paginator: an account may hold many)."""
    found: list[BakedAmi] = []
    for page in ec2.get_paginator("describe_images").paginate(**images_request(digest)):
        found += [BakedAmi.of(image) for image in page.get("Images") or []]
    return found


def prune_plan(images: list[BakedAmi], *, owner: str, keep: int) -> PrunePlan:
    """The promise (module docstring) applied: what stays, what goes, what is not ours."""
    kept: list[BakedAmi] = []
    remove: list[BakedAmi] = []
    left: list[tuple[BakedAmi, str]] = []
    mine: dict[str, list[BakedAmi]] = {}
    for ami in images:
        tags = {rq.TAG_OWNER: ami.owner, rq.TAG_RUN_ID: ami.run_id, rq.TAG_IMAGE_DIGEST: ami.digest}
        if why := rq.foreign_bake(tags, owner):
            left.append((ami, why))
        elif ami.state in LEFT_ALONE_STATES:
            left.append((ami, LEFT_ALONE_STATES[ami.state]))
        elif ami.state != "available":  # failed, error, invalid: no run can use it
            remove.append(ami)
        else:
            mine.setdefault(ami.digest, []).append(ami)
    for group in mine.values():
        group.sort(key=lambda a: (a.created, a.image_id), reverse=True)
        kept += group[:keep]
        remove += group[keep:]
    return PrunePlan(kept, remove, left)


def remove(ec2: EC2Client, ami: BakedAmi, log: Callable[[str], Any]) -> tuple[bool, list[str]]:
    """Deregister the AMI, then delete its snapshots. Whether the AMI is gone (no run can take it
    any more), and what could not be removed, in words, with the command that removes it (the
    AMI first: its snapshots cannot go while it is registered)."""
    try:
        ec2.deregister_image(ImageId=ami.image_id)
    except Exception as err:  # noqa: BLE001 - said with what is left, never raised midway
        if not error_code(err).startswith("InvalidAMIID"):
            return False, [
                f"AMI {ami.image_id} ({error_message(err)}; `aws ec2 deregister-image "
                f"--image-id {ami.image_id}`, then delete its snapshots "
                f"{', '.join(ami.snapshots) or '(none)'})"
            ]
    log(f"aws: deregistered {ami.image_id} ({ami.name or 'no name'}, {ami.created})")
    left: list[str] = []
    for snap in ami.snapshots:
        try:
            ec2.delete_snapshot(SnapshotId=snap)
            log(f"aws: deleted its snapshot {snap}")
        except Exception as err:  # noqa: BLE001
            if error_code(err) != "InvalidSnapshot.NotFound":
                left.append(
                    f"snapshot {snap} of {ami.image_id} ({error_message(err)}; `aws ec2 "
                    f"delete-snapshot --snapshot-id {snap}`)"
                )
    return True, left
