"""`reproduce reap`: end the caller's launches whose expires-at has passed, after listing them."""

from __future__ import annotations

from launcher.commands import options as o
from launcher.commands.output import Say, ask, fail, has_terminal
from launcher.errors import BadInput, ReproduceError


def reap_cmd(
    cluster: o.Cluster = "aws",
    region: o.Region = None,
    dry_run: o.DryRun = False,
    all_owners: o.AllOwners = False,
    yes: o.Yes = False,
) -> None:
    """End your launches (instances, Elastic IPs, groups, key pairs) whose expires-at has passed, after listing them."""  # noqa: E501 - typer shows its line breaks

    try:
        reap_command(cluster, region, dry_run=dry_run, all_owners=all_owners, yes=yes)
    except ReproduceError as err:
        raise fail(err) from None


def reap_command(
    cluster: str = "aws",
    region: str | None = None,
    *,
    dry_run: bool = False,
    all_owners: bool = False,
    yes: bool = False,
    say: Say = print,
) -> list[str]:
    """`reproduce reap`: the region from --region, else the aws profile's, else AWS's config.
    Only the caller's launches unless ALL_OWNERS; what would end is listed first, then asked
    at a terminal, taken by YES, and refused (exit 2, nothing ended) otherwise."""
    from launcher.clusters.aws.reap import ReapPlan, reap
    from launcher.clusters.aws.session import make_session
    from launcher.records.rundir import owner

    if region is None:
        from launcher.inputs.profile import load_profile

        profile = load_profile(cluster)
        if profile.kind != "aws":
            raise BadInput(
                f"--cluster {cluster} is of kind {profile.kind}; reap ends AWS instances, "
                "give an aws profile."
            )
        region = profile.region
    if region is None:
        region = make_session(None).region_name
    refused: list[ReapPlan] = []

    def confirm(found: ReapPlan) -> bool:
        if yes:
            return True
        count = sum(len(state.allocated()) for state in found.runs.values())
        if has_terminal():
            return ask(f"End these {count} resources in {found.region}? [y/N] ")
        refused.append(found)
        return False

    ended = reap(
        str(region),
        owner=None if all_owners else owner(),
        dry_run=dry_run,
        confirm=confirm,
        log=say,
    )
    if refused:
        raise BadInput(
            "reap would end what is listed above, and nobody confirmed it (no terminal to ask); "
            "nothing was ended.",
            hint="Pass --yes to end them, or --dry-run to only list them.",
        )
    return ended
