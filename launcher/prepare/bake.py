"""`reproduce image bake`: an AMI that holds the recipe's image, pinned by digest, so a fresh GPU
node launched from it (`ami: baked`) costs no image pull.

Why: on a fresh p5en the image pull (about 20 GB, extraction-bound at about 0.15 GB/s) is the
critical path of our own overhead (launcher/cost/estimate.py). The pull is paid once here, on one
cheap non-GPU instance (`bake_instance_type`, cents per bake), instead of on every GPU node.

The bake, in order (docs/aws.md, "An AMI that holds the image"):
1. the settings checked as a run checks them (bad input: exit 2, nothing created);
2. ONE instance launched from the profile's base AMI by the run's own launch program
   (program.py, `Launch.bake`: the same requests, aws.json, host key pin, teardown);
3. over SSH: `docker pull repo@sha256:...` as node.sh pulls it, the pulled image's RepoDigests
   must hold that reference (a tag alone is never trusted), docker stopped and the disk synced;
4. CreateImage (NoReboot), tagged reproduce:image-digest / reproduce:base-ami / reproduce:owner
   and the launch's tags, waited for until `available` within bake_timeout_s;
5. ALWAYS: the instance, its security group and key pair ended (the run's teardown); after a
   failure past CreateImage the half-made AMI deregistered and its snapshots deleted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.clusters.aws import bake as ab
from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.cluster import AwsCluster
from launcher.clusters.aws.executor import Executor, Launch, Mode
from launcher.clusters.aws.program import run as run_program
from launcher.errors import CheckFailed, InfraError, ReproduceError
from launcher.inputs.profile import Profile, load_profile
from launcher.inputs.recipe import Recipe, load_recipe
from launcher.records.rundir import new_run_id, owner

if TYPE_CHECKING:
    from boto3.session import Session

    from launcher.clusters.aws.state import AwsState
    from launcher.clusters.base import Transport


@dataclass(frozen=True)
class BakeRequest:
    recipe: Path
    profile: str = "aws"  # a name from env/ or a path
    region: str | None = None
    runs_root: Path = Path("runs")  # the bake's aws.json goes to images/bakes/ beside it


@dataclass(frozen=True)
class BakeResult:
    image_id: str
    image_ref: str
    digest: str
    base_ami: str  # the AMI id it was made from
    name: str
    state_dir: Path
    region: str


@dataclass
class Bake:
    """A bake's inputs, read and checked once (the dry run and the bake share it)."""

    recipe: Recipe
    profile: Profile
    target: ab.BakeTarget
    run_id: str = field(default_factory=lambda: "bake-" + new_run_id())
    owner: str = field(default_factory=owner)

    @classmethod
    def read(cls, req: BakeRequest) -> Bake:
        recipe = load_recipe(req.recipe)
        profile = load_profile(req.profile)
        if req.region:
            profile = profile.with_overrides(region=req.region)
        return cls(recipe, profile, ab.bake_target(recipe, profile))


def dry_run(bake: Bake, now: datetime | None = None) -> tuple[list[rq.ApiCall], list[str]]:
    """The requests a bake sends, in order (the launch's, then CreateImage and its wait), and the
    commands it runs on the instance: printed, nothing sent, no credentials."""
    s = bake.target.settings
    when = now or datetime.now(UTC)
    launch = Launch(bake.recipe, s, bake.run_id, bake.owner, lambda: when, region=s.region)
    launch.bake = True
    api = Executor(Mode.PRINT, s)
    run_program(launch, api)
    ab.print_calls(launch, api, bake.target)
    return api.printed, ab.node_commands(bake.target.image_ref)


class BakeCluster(AwsCluster):
    """The run's AwsCluster with the bake's settings: one non-GPU instance, no GPU check."""

    launch: Launch | None = None

    def launch_context(self, state: AwsState | None = None) -> Launch:
        ctx = super().launch_context(state)
        ctx.bake = True
        self.launch = ctx
        return ctx


def bake(
    bake: Bake,
    *,
    state_dir: Path,
    session: Session | None = None,
    log: Callable[[str], Any] = print,
    ami_resolver: Callable[[str], str] | None = None,
    key_dir: Path | None = None,
    poll_s: float = 5.0,
    quiesce: str = ab.QUIESCE,
    release: Callable[[AwsCluster], ReproduceError | None] | None = None,
) -> BakeResult:
    """Make the AMI (module docstring); the instance is always ended, a half-made AMI removed.

    `release` ends the cluster and returns what it could not end (the command passes the
    runner's release_hard, which a Ctrl-C does not stop); by default a plain release."""
    target = bake.target
    cluster = BakeCluster(
        bake.recipe,
        bake.profile,
        bake.run_id,
        owner=bake.owner,
        session=session,
        ami_resolver=ami_resolver,
        log=log,
        state_path=state_dir / "aws.json",
        key_dir=key_dir,
        poll_s=poll_s,
    )
    cluster.settings, cluster.target_id = target.settings, None
    cluster.session  # noqa: B018 - credentials and region first: without them nothing is made
    state_dir.mkdir(parents=True, exist_ok=True)
    image_id: str | None = None
    try:
        [node] = cluster.acquire()
        launch = cluster.launch
        assert launch is not None
        _pull_and_check(cluster.transport(node), target.image_ref, quiesce, log, target.timeout_s)
        api = Executor(Mode.SEND, target.settings, cluster.client, poll_s)
        image_id = ab.create_image(launch, api, target)
        assert image_id is not None
        image = ab.wait_image(launch, api, image_id, target.timeout_s)
        assert image is not None
        result = BakeResult(
            image_id=image_id,
            image_ref=target.image_ref,
            digest=target.image_digest,
            base_ami=launch.ami_id,
            name=str(image.get("Name") or ""),
            state_dir=state_dir,
            region=cluster.region,
        )
    except BaseException as err:
        left = (
            ab.discard_image(cluster.ec2, image_id, bake.run_id, cluster.launch_id, _quiet(log))
            if image_id
            else []
        )
        failed = _end(cluster, release)
        if failed is not None:  # said, not raised: the bake's own failure is the one to raise
            _quiet(log)(f"bake: {failed}")
        if left:
            raise InfraError(
                f"{err}; the bake failed after CreateImage and these could not be removed: "
                + "; ".join(left)
                + f" (region {cluster.region}): `aws ec2 deregister-image` / `aws ec2 "
                "delete-snapshot`."
            ) from err
        raise
    failed = _end(cluster, release)
    if failed is not None:  # the AMI is made and good; the instance may still bill
        raise failed
    return result


def _end(
    cluster: AwsCluster, release: Callable[[AwsCluster], ReproduceError | None] | None
) -> ReproduceError | None:
    """The bake's instance, group and key ended (the run's teardown); an error naming what is
    left, or None."""
    if release is not None:
        return release(cluster)
    try:
        cluster.release()
    except ReproduceError as err:
        return err
    return None


def _pull_and_check(
    transport: Transport, ref: str, quiesce: str, log: Callable[[str], Any], timeout_s: float
) -> None:
    """The image pulled by digest on the instance and checked as node.sh checks it, then docker
    stopped and the disk synced for the snapshot."""
    log(f"bake: pulling {ref} on the instance")
    pulled = transport.run(ab.pull_command(ref), timeout_s=timeout_s, check=False)
    if pulled.exit_code != 0:
        raise InfraError(
            f"docker pull {ref} failed on the bake's instance (exit {pulled.exit_code}): "
            + (pulled.stderr.strip() or pulled.stdout.strip())[-400:]
        )
    digests = transport.run(ab.digests_command(ref), timeout_s=120).stdout.split()
    if ref not in digests:
        raise CheckFailed(
            f"image {ref}: the pulled image does not carry that digest (RepoDigests: "
            f"{' '.join(digests) or 'none'}); no AMI was made."
        )
    log(f"bake: {ref} pulled; its RepoDigests hold the digest")
    transport.run(quiesce, timeout_s=600)
    log("bake: docker stopped and the disk synced for the snapshot")


def _quiet(log: Callable[[str], Any]) -> Callable[[str], None]:
    def say(line: str) -> None:
        with contextlib.suppress(Exception):
            log(line)

    return say


def state_dir_for(bake: Bake, runs_root: Path) -> Path:
    """images/bakes/<recipe slug>/<bake id>/ beside the runs root (aws.json, aws-calls.jsonl):
    `reproduce down` of it ends whatever a killed bake left."""
    return runs_root.parent / "images" / "bakes" / str(bake.recipe.slug) / bake.run_id
