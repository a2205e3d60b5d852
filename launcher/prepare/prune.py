"""`reproduce image prune`: this owner's old baked AMIs deregistered and their snapshots deleted.

Why: each `reproduce image bake` leaves an AMI that bills for its snapshot every month, and a run
with `ami: baked` only uses the newest of a digest, so the older ones are cost without use
(docs/aws.md, "An AMI that holds the image"). What may be removed is decided in one place,
launcher/clusters/aws/prune.py; this module reads the command's inputs (the recipe's image digest,
the profile's region), checks them before anything is asked, and carries the plan out.

`--dry-run` lists the same plan from the same DescribeImages and removes nothing (prune cannot
know what to remove without reading the account, as `reap --dry-run` cannot).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.clusters.aws import prune as ap
from launcher.errors import BadInput

if TYPE_CHECKING:
    from boto3.session import Session


@dataclass(frozen=True)
class PruneRequest:
    recipe: Path | None  # its run image's AMIs; None with all_images
    profile: str = "aws"  # a name from env/ or a path: the region
    region: str | None = None
    keep: int = 1  # per image digest, the newest available ones that stay
    all_images: bool = False


@dataclass
class PruneResult:
    region: str
    scope: str  # in words: which digest(s)
    plan: ap.PrunePlan
    removed: list[ap.BakedAmi] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # what could not be removed, with commands


@dataclass(frozen=True)
class PruneJob:
    """The request read and checked: nothing is asked of AWS before this succeeds."""

    region: str | None
    digest: str | None
    scope: str
    keep: int

    @classmethod
    def read(cls, req: PruneRequest) -> PruneJob:
        from launcher.inputs.profile import load_profile

        if req.keep < 0:
            raise BadInput(
                f"--keep-newest {req.keep}: expected 0 or more (the newest AMIs of each image that "
                "stay; 0 removes even the one `ami: baked` would use)."
            )
        if (req.recipe is None) == (not req.all_images):
            raise BadInput(
                "reproduce image prune: give a RECIPE (the AMIs baked with its image) or "
                "--all-images (every image's), one of the two."
            )
        profile = load_profile(req.profile)
        if profile.kind != "aws":
            raise BadInput(
                f"profile {profile.path}: kind {profile.kind}; baked AMIs are AWS's: expected "
                "an aws profile (--cluster)."
            )
        region = req.region or profile.region
        if req.recipe is None:
            return cls(region, None, "every image's", req.keep)
        from launcher.clusters.aws.settings import run_image
        from launcher.inputs.recipe import load_recipe
        from launcher.plan.image_record import DIGEST

        recipe = load_recipe(req.recipe)
        image = run_image(recipe, profile)
        if not DIGEST.fullmatch(str(image.digest or "")):
            raise BadInput(
                f"{recipe.path}: {image.source_field} names no sha256 digest for "
                f"{image.repository}; expected the image pinned by digest, as the bake needs."
            )
        return cls(region, str(image.digest), f"{image.ref}'s", req.keep)


def prune(
    job: PruneJob,
    *,
    owner: str,
    dry_run: bool = False,
    session: Session | None = None,
    log: Callable[[str], Any] = print,
) -> PruneResult:
    """List, plan and (unless a dry run) remove; removal failures are collected, never raised
    midway, so one stuck snapshot does not keep the rest billing."""
    from launcher.clusters.aws.session import make_session, translate

    nothing = "nothing was removed"
    session = make_session(job.region, session, nothing=nothing)
    region = str(job.region or session.region_name)
    ec2 = session.client("ec2", region_name=region)
    try:
        found = ap.list_baked(ec2, job.digest)
    except Exception as err:  # noqa: BLE001 - in the launcher's words (exit 2 or 3)
        raise translate(err, f"listing this account's baked AMIs in {region}; {nothing}") from err
    result = PruneResult(region, job.scope, ap.prune_plan(found, owner=owner, keep=job.keep))
    if dry_run:
        return result
    for ami in result.plan.remove:
        gone, missed = ap.remove(ec2, ami, log)
        result.left += missed
        if gone:
            result.removed.append(ami)
    return result
