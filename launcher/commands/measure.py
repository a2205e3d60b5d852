"""`reproduce measure LOG|RUN`: a miles log measured against the recipe's claim, and judged.

Exit codes: 0 reproduced; 1 any other verdict, `mismatch` included; 2 bad input, which includes a
log that could not be read (verdict `unreadable`: nothing in it says training failed, so it is
never reported as a failed run).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from launcher.commands import options as o
from launcher.commands.options import finite
from launcher.commands.output import fail, say
from launcher.errors import BadInput, ReproduceError
from launcher.judge.verdict import DEFAULT_TOLERANCE_PERCENT


def measure_cmd(
    log: Path = typer.Argument(
        ...,
        help="one miles log file, a run directory (one with run.json; its artifacts are "
        "written there), or a run id",
    ),
    recipe: Path | None = typer.Option(
        None,
        "--recipe",
        help="the recipe whose claim is judged (default: a run directory's recipe.yaml)",
    ),
    json_out: o.Json = False,
    price_per_hour: o.PricePerHour = None,
    region: o.Region = None,
    timeline: Path | None = typer.Option(
        None, "--timeline", help="timeline.json for GPU-hours (log file only)"
    ),
    slower: float = typer.Option(
        DEFAULT_TOLERANCE_PERCENT,
        "--tolerance-slower",
        help="percent below the claim still 'reproduced'",
        callback=finite,
    ),
    faster: float = typer.Option(
        DEFAULT_TOLERANCE_PERCENT,
        "--tolerance-faster",
        help="percent above the claim still 'reproduced'",
        callback=finite,
    ),
    out: o.Out = None,
    runs: o.Runs = None,
) -> None:
    """Measure a miles log against the recipe's claim (files written to --out, or a run directory; a log file's nowhere without it). Exit 0 reproduced, 1 otherwise (mismatch included), 2 bad input or an unreadable log."""  # noqa: E501 - typer shows its line breaks
    try:
        code = run_measure(
            log,
            recipe,
            json_out=json_out,
            price_per_hour=price_per_hour,
            region=region,
            timeline=timeline,
            slower=slower,
            faster=faster,
            out=out,
            runs=runs,
        )
    except ReproduceError as err:
        raise fail(err, json_out) from None
    raise typer.Exit(code)


UNREADABLE_EXIT = BadInput.exit_code


def run_measure(
    log: Path,
    recipe: Path | None,
    *,
    json_out: bool = False,
    price_per_hour: float | None = None,
    region: str | None = None,
    timeline: Path | None = None,
    slower: float = DEFAULT_TOLERANCE_PERCENT,
    faster: float = DEFAULT_TOLERANCE_PERCENT,
    out: Path | None = None,
    runs: int | None = None,
) -> int:
    """Print the figures and the verdict; 0 when reproduced, 2 when the log could not be read,
    else 1. BadInput propagates."""
    from launcher.inputs.recipe import load_recipe
    from launcher.judge.verdict import Tolerance
    from launcher.pages.report import render_summary
    from launcher.records.rundir import RunDir
    from launcher.results.evaluate import RECIPE_FILE, check_input, measure_path
    from launcher.results.measure_record import json_safe

    log = check_input(RunDir.target(log))
    if recipe is None:
        if not (log.is_dir() and (log / RECIPE_FILE).is_file()):
            raise BadInput(
                f"--recipe is required unless LOG is a run directory holding {RECIPE_FILE}."
            )
        recipe = log / RECIPE_FILE
    from launcher.plan.claimruns import check_option

    loaded = load_recipe(recipe)
    result, verdict = measure_path(
        log,
        loaded,
        runs=check_option(loaded, runs),
        price_per_hour=price_per_hour,
        region=region,
        tolerance=Tolerance(slower_percent=slower, faster_percent=faster),
        timeline_path=timeline,
        out=out,
    )
    if json_out:
        payload = result.to_dict()
        payload["verdict"] = verdict.to_dict()
        if verdict.status == "unreadable":  # bad input: the object says so, as every --json does
            payload["error"] = f"{log}: {result.unreadable}"
            payload["exit_code"] = UNREADABLE_EXIT
        print(json.dumps(json_safe(payload), allow_nan=False))
    elif verdict.status != "unreadable":
        say(render_summary(result, verdict))
    if verdict.status == "unreadable":
        say(f"error: {log}: {result.unreadable}", err=True)
        return UNREADABLE_EXIT
    return 0 if verdict.reproduced else 1
