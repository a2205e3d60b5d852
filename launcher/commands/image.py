"""`reproduce image build`, `bake` and `prune`: the recipe's image built with EFA (docs/image.md),
baked into an AMI and the older AMIs removed (docs/aws.md). One module: the `image` group.

Progress goes to stderr as it comes, the result to stdout: only what a script or a person needs
afterwards (the pushed reference, what it was built FROM, the record, the profile lines that make
a run use it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from launcher.commands import options as o
from launcher.commands.options import output_file
from launcher.commands.output import fail
from launcher.errors import ReproduceError

if TYPE_CHECKING:
    from launcher.prepare.bake import BakeRequest
    from launcher.prepare.image import BuildRequest
    from launcher.prepare.prune import PruneRequest


image_app = typer.Typer(
    no_args_is_help=True,
    help="The recipe's image: built with EFA (docs/image.md), baked into an AMI (docs/aws.md).",
)


@image_app.command("build")
def image_build_cmd(
    recipe: Path = typer.Argument(..., help="Recipe whose image (pinned by digest) is the base."),
    push: str = typer.Option(
        ..., "--push", help="REGISTRY or REGISTRY/NAMESPACE: ECR (login via boto3) or any other."
    ),
    efa_installer: Path = typer.Option(
        ..., "--efa-installer", help="The EFA installer tarball, downloaded and verified."
    ),
    efa_sha256: str = typer.Option(
        ..., "--efa-sha256", help="The installer's pinned SHA256; a file that differs is refused."
    ),
    tag: str | None = typer.Option(
        None, "--tag", help="Tag to push (default: <base tag>-efa<version>)."
    ),
    efa_version: str | None = typer.Option(
        None, "--efa-version", help="Installer version when its file name does not say it."
    ),
    record: Path | None = typer.Option(
        None,
        "--record",
        help="Record file (default: images/<recipe slug>.json beside runs/).",
        callback=output_file,
    ),
    network: o.BuildNetwork = typer.Option(
        o.BuildNetwork.default, "--network", help="docker build --network for RUN steps."
    ),
    dockerfile: Path | None = typer.Option(
        None, "--dockerfile", help="Another Dockerfile (default: the repository's)."
    ),
) -> None:
    """Build the Dockerfile FROM RECIPE's image by digest, push it, record the pushed digest and the base digest."""  # noqa: E501 - typer shows its line breaks
    from launcher.prepare.image import BuildRequest

    try:
        code = build_command(
            BuildRequest(
                recipe=recipe,
                push=push,
                efa_installer=efa_installer,
                efa_sha256=efa_sha256,
                tag=tag,
                efa_version=efa_version,
                record=record,
                network=network.value,
                dockerfile=dockerfile,
            )
        )
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


@image_app.command("bake")
def image_bake_cmd(
    recipe: Path = typer.Argument(..., help="Recipe whose image (pinned by digest) the AMI holds."),
    cluster: o.Cluster = "aws",
    region: o.Region = None,
    dry_run: o.DryRun = False,
) -> None:
    """Bake an AMI holding RECIPE's image by digest, for `ami: baked` (docs/aws.md)."""
    from launcher.prepare.bake import BakeRequest

    try:
        code = bake_command(
            BakeRequest(recipe=recipe, profile=cluster, region=region), dry_run=dry_run
        )
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


@image_app.command("prune")
def image_prune_cmd(
    recipe: Path | None = typer.Argument(
        None, help="Recipe whose image's baked AMIs are pruned (or --all-images)."
    ),
    cluster: o.Cluster = "aws",
    region: o.Region = None,
    keep_newest: int = typer.Option(
        1,
        "--keep-newest",
        help="The newest available AMIs of each image that stay (1: the one runs use).",
    ),
    all_images: bool = typer.Option(False, "--all-images", help="Every image's baked AMIs."),
    dry_run: o.DryRun = False,
) -> None:
    """Remove this owner's older baked AMIs and their snapshots; the newest of each image stays (docs/aws.md)."""  # noqa: E501 - typer shows its line breaks
    from launcher.prepare.prune import PruneRequest

    req = PruneRequest(recipe, cluster, region, keep=keep_newest, all_images=all_images)
    try:
        code = prune_command(req, dry_run=dry_run)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:  # a closed terminal never stops a build that is under way
        pass


def build_command(req: BuildRequest, *, ecr_client: Any = None) -> int:
    from launcher.prepare.image import build_and_push

    result = build_and_push(req, say=_say, ecr_client=ecr_client)
    record = Path(result.record_path).resolve()
    base = result.record["base"]
    print(f"image     {result.ref}")
    print(f"built     FROM {result.base_ref} (the recipe's {base['recipe_field']})")
    print(f"record    {record}")
    print("use it in a cluster profile (schema/profile.schema.yaml):")
    print("  image:")
    print(f"    record: {record}")
    return 0


def bake_command(req: BakeRequest, *, dry_run: bool = False) -> int:
    """`reproduce image bake`: the dry run prints the requests (nothing sent); the bake prints
    its progress on stderr and the AMI id and how to use it on stdout."""
    import json

    from launcher.clusters.aws import to_jsonable
    from launcher.prepare.bake import Bake, bake, state_dir_for
    from launcher.prepare.bake import dry_run as bake_dry_run

    job = Bake.read(req)  # bad input: BadInput (exit 2) before anything is asked or created
    t = job.target
    if dry_run:
        calls, commands = bake_dry_run(job)
        print(f"# bake      {t.image_ref} onto an AMI made from {t.base_ami}")
        print(
            f"# instance  1 x {t.settings.instance_type} (on-demand, no GPU), region "
            f"{t.settings.region or '<the session region>'}; ended whatever happens"
        )
        print(f"# bake id   {job.run_id}; aws.json under {state_dir_for(job, req.runs_root)}")
        print("# ---- requests (boto3, in order; no credentials used or shown) ----")
        print(json.dumps(to_jsonable(calls), indent=2, sort_keys=False))
        print("# ---- on the instance, over SSH (after the launch, before CreateImage) ----")
        for command in commands:
            print(command)
        print(
            "# ---- then, always: TerminateInstances, ReleaseAddress, DeleteSecurityGroup, "
            "DeleteKeyPair (the run's teardown); after a failure past CreateImage also "
            "DeregisterImage and DeleteSnapshot ----"
        )
        return 0
    from launcher.errors import Interrupted
    from launcher.runner.signals import release_hard, signals_cancel

    try:
        with signals_cancel():  # Ctrl-C, SIGTERM, SIGHUP: the instance is still ended
            result = bake(
                job,
                state_dir=state_dir_for(job, req.runs_root),
                log=_say,
                release=lambda cluster: release_hard(cluster, _say),
            )
    except KeyboardInterrupt:
        raise Interrupted(
            "interrupted: the bake's teardown ran (its lines above say what was ended)"
        ) from None
    print(f"ami       {result.image_id} ({result.region}, {result.name})")
    print(f"image     {result.image_ref} (tag reproduce:image-digest={result.digest})")
    print(f"base      {result.base_ami}")
    print("use it in the aws profile (a run then finds the newest such AMI by the digest):")
    print("  ami: baked")
    return 0


def prune_command(
    req: PruneRequest, *, dry_run: bool = False, session: Any = None, say: Any = _say
) -> int:
    """`reproduce image prune`: the plan on stdout, one line per AMI (keep / remove / left alone
    and why), then what was removed and what it saves; what could not be removed is exit 3."""
    from launcher.clusters.aws.prune import SNAPSHOT_USD_PER_GB_MONTH
    from launcher.errors import InfraError
    from launcher.prepare.prune import PruneJob, prune
    from launcher.records.rundir import owner

    job = PruneJob.read(req)  # bad input: BadInput (exit 2) before anything is asked
    me = owner()
    result = prune(job, owner=me, dry_run=dry_run, session=session, log=say)
    p = result.plan
    print(
        f"baked AMIs of {result.scope} image in {result.region}: {len(p.keep) + len(p.remove)} "
        f"of {me}'s (keeping the newest {job.keep} of each image), {len(p.left)} left alone"
    )
    for ami in p.keep:
        print(f"  keep    {ami.image_id}  {ami.created}  {ami.name}")
    verb = "would remove" if dry_run else "remove"
    for ami in p.remove:
        what = f"{ami.state}, snapshots {', '.join(ami.snapshots) or 'none'}"
        print(f"  {verb:<7} {ami.image_id}  {ami.created}  {ami.name}  ({what})")
    for ami, why in p.left:
        print(f"  left    {ami.image_id}  {ami.created}  {ami.name}  ({why})")
    gone = p.remove if dry_run else result.removed
    size = sum(a.size_gb for a in gone)
    saving = f"up to {size} GB of snapshots, up to ${size * SNAPSHOT_USD_PER_GB_MONTH:.2f} a month"
    if dry_run:
        print(f"dry run: nothing removed; removing them would free {saving}")
    elif gone:
        print(f"removed {len(gone)} AMI(s) and their snapshots: {saving}")
    else:
        print("nothing to remove")
    if result.left:
        raise InfraError(
            "prune could not remove: " + "; ".join(result.left) + f" (region {result.region})."
        )
    return 0
