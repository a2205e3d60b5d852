"""`reproduce capacity RECIPE`: list Capacity Block offerings for a recipe; buy one with --buy."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import typer

from launcher.commands import options as o
from launcher.commands.output import Say, ask, fail, has_terminal
from launcher.errors import BadInput, ReproduceError


def capacity_cmd(
    recipe: Path = typer.Argument(
        ..., help="Recipe whose instance type and node count are wanted."
    ),
    cluster: o.Cluster = "aws",
    hours: int = typer.Option(24, "--hours", help="Block length: whole days (24, 48, ...)."),
    nodes: int | None = typer.Option(
        None, "--nodes", help="Instances in the block (default: the recipe's nodes)."
    ),
    start_after: str | None = typer.Option(
        None, "--start-after", help="Earliest start (ISO, UTC)."
    ),
    end_before: str | None = typer.Option(None, "--end-before", help="Latest end (ISO, UTC)."),
    buy: str | None = typer.Option(
        None,
        "--buy",
        help="Buy this offering id. It CANNOT be cancelled; its price is printed first.",
    ),
    max_usd: o.MaxUsd = None,
    yes: o.Yes = False,
) -> None:
    """List Capacity Block offerings for RECIPE (price, start time); buy one only with --buy OFFERING_ID."""  # noqa: E501 - typer shows its line breaks

    try:
        capacity_command(
            str(recipe),
            cluster,
            hours=hours,
            nodes=nodes,
            start_after=start_after,
            end_before=end_before,
            buy_id=buy,
            max_usd=max_usd,
            yes=yes,
        )
    except ReproduceError as err:
        raise fail(err) from None


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
            confirm=ask if has_terminal() else None,
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
