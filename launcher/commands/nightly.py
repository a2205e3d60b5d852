"""`reproduce nightly RECIPE...`: each recipe reproduced in turn, recorded, regressions flagged.

launcher/runner/nightly.py returns values; this is where they meet the console: plain lines, no
live display and no question, since a nightly runs unattended.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher.commands import options as o
from launcher.commands.output import fail, say
from launcher.errors import ReproduceError


def nightly_cmd(
    recipes: Annotated[
        list[Path],
        typer.Argument(help="Recipe files, or directories (every *.yaml under them, sorted)."),
    ],
    cluster: o.Cluster,
    runs_dir: o.RunsDir = None,
    history: o.History = None,
    max_usd: o.MaxUsd = None,
    max_hours: o.MaxHours = None,
    yes: o.Yes = False,
    key: o.Key = None,
) -> None:
    """Reproduce each recipe in turn (recipes of one node shape share one launched node on aws, one allocation on slurm), record it in the history, flag regressions; exit 0 all good, 1 any regression or failed check, 3 infra.

    --max-usd and --max-hours hold for each recipe; on a paid cluster a nightly, unattended, needs --max-usd or --yes. --key attests every measured run (as `reproduce attest`)."""  # noqa: E501 - typer shows its line breaks

    try:
        code = run_nightly(
            recipes,
            cluster,
            runs_dir=runs_dir,
            history=history,
            max_usd=max_usd,
            max_hours=max_hours,
            yes=yes,
            attest_key=key,
        )
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def run_nightly(
    recipes: list[Path],
    cluster: str,
    *,
    runs_dir: Path | None = None,
    history: Path | None = None,
    max_usd: float | None = None,
    max_hours: float | None = None,
    yes: bool = False,
    attest_key: Path | None = None,
) -> int:
    """`reproduce nightly`: each recipe's progress and the summary table, line by line (a
    nightly runs unattended: plain lines, no live display, no question)."""
    from functools import partial

    from launcher.commands.console import ConsoleReporter
    from launcher.runner.nightly import nightly, run_recipe

    result = nightly(
        recipes,
        cluster,
        runs_dir=runs_dir,
        history=history,
        max_usd=max_usd,
        max_hours=max_hours,
        yes=yes,
        runner=partial(run_recipe, reporter=ConsoleReporter(live=False)),
        echo=say,
        attest_key=attest_key,
    )
    return result.exit_code
