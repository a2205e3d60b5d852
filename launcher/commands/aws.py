"""The bodies of `reproduce down`, `reproduce reap` and `reproduce capacity`: args in, lines out.

The AWS work itself (launcher/clusters/aws/) returns values and reports through a log callback;
this is where those lines reach the terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from launcher.errors import BadInput
from launcher.records.rundir import Files

Say = Callable[[str], Any]


def down_run(
    ref: str, *, runs_root: Path | None = None, region: str | None = None, say: Say = print
) -> list[str]:
    """`reproduce down RUN`: RUN is a run directory, its aws.json, or a run id in the runs root.

    `region` is used when aws.json cannot be read and no other record names the region.
    """
    from launcher.clusters.aws.down import down

    path = Path(ref)
    if not (path.is_file() or (path / Files.AWS).is_file()):
        from launcher.records.rundir import RunDir

        path = RunDir.find(ref, runs_root).path
    ended = down(path, log=say, region=region)
    say(
        f"aws: ended {', '.join(ended)}"
        if ended
        else "aws: nothing of this run was still allocated"
    )
    return ended


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
        if _has_terminal():
            return _ask(f"End these {count} resources in {found.region}? [y/N] ")
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


def capacity_command(
    recipe_path: str,
    cluster: str = "aws",
    *,
    hours: int = 24,
    nodes: int | None = None,
    start_after: str | None = None,
    end_before: str | None = None,
    buy_id: str | None = None,
    max_usd: float | None = None,
    yes: bool = False,
    say: Say = print,
) -> str | None:
    """`reproduce capacity RECIPE`: list offerings; with --buy ID, buy that one (price first)."""
    from launcher.catalog import price_per_hour
    from launcher.clusters.aws.capacity import buy, format_offerings, list_offerings
    from launcher.inputs.profile import load_profile
    from launcher.inputs.recipe import load_recipe

    recipe = load_recipe(recipe_path)
    profile = load_profile(cluster)
    if profile.kind != "aws":
        raise BadInput(
            f"--cluster {cluster} is of kind {profile.kind}; Capacity Blocks are AWS's: "
            "give an aws profile."
        )
    after, before = _when(start_after, "--start-after"), _when(end_before, "--end-before")
    if buy_id:
        return buy(
            recipe,
            profile,
            buy_id,
            hours=hours,
            nodes=nodes,
            max_usd=max_usd,
            start_after=after,
            end_before=before,
            log=say,
            yes=yes,
            confirm=_ask if _has_terminal() else None,
        )
    offerings = list_offerings(
        recipe, profile, hours=hours, nodes=nodes, start_after=after, end_before=before
    )
    try:
        od = price_per_hour(profile.instance_type or recipe.instance_type, profile.region)
    except BadInput:
        od = None
    say(format_offerings(offerings, od.value if od else None))
    return None


def _has_terminal() -> bool:
    from launcher.commands.run import has_terminal

    return has_terminal()


def _ask(question: str) -> bool:
    """y/yes goes on (buys, ends); anything else, an end of input or Ctrl-C is a no (the
    launch's rule)."""
    try:
        sys.stderr.write(question)
        sys.stderr.flush()
        return sys.stdin.readline().strip().lower() in ("y", "yes")
    except (KeyboardInterrupt, OSError):
        return False


def _when(text: str | None, flag: str) -> datetime | None:
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(
            f"{flag} {text!r}: expected an ISO date or time, e.g. 2026-12-01 or 2026-12-01T11:30Z."
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)
