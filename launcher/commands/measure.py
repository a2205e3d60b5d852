"""The bodies of `reproduce measure` and `reproduce compare`: load, compute, print, exit code.

Exit codes: 0 reproduced (compare: converged); 1 any other verdict, `mismatch` included (compare:
not converged); 2 bad input, which includes a log that could not be read (verdict `unreadable`:
nothing in it says training failed, so it is never reported as a failed run) and a compare of two
different recipes. Loaded only when one of these commands runs, so the CLI's start-up stays light.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launcher.errors import BadInput
from launcher.inputs.recipe import load_recipe
from launcher.judge.convergence import check, loss_curve
from launcher.judge.verdict import DEFAULT_TOLERANCE_PERCENT, Tolerance
from launcher.pages.report import render_convergence, render_summary
from launcher.results.evaluate import (
    RECIPE_FILE,
    check_input,
    json_safe,
    load_records,
    measure_path,
    recipe_identity,
)

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
    log = check_input(log)
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
        print(render_summary(result, verdict))
    if verdict.status == "unreadable":
        print(f"error: {log}: {result.unreadable}", file=sys.stderr)
        return UNREADABLE_EXIT
    return 0 if verdict.reproduced else 1


def run_compare(
    candidate: Path,
    reference: Path,
    *,
    json_out: bool = False,
    allow_different_recipes: bool = False,
    **thresholds: float,
) -> int:
    """Print every figure of the convergence check; return 0 on pass, 1 on fail.

    Two runs of different recipes are refused (BadInput) unless allowed: their loss curves
    passing the check would say nothing about either recipe. A bare log does not say which
    recipe it ran, and the output says that this was not checked.
    """
    ids = {"candidate": recipe_identity(check_input(candidate))}
    ids["reference"] = recipe_identity(check_input(reference))
    known = [v for v in ids.values() if v is not None]
    if len(known) == 2 and known[0] != known[1] and not allow_different_recipes:
        raise BadInput(
            f"{candidate} is a run of {ids['candidate']}, {reference} a run of "
            f"{ids['reference']}: different recipes, whose loss curves say nothing about "
            "each other.",
            hint="Pass --allow-different-recipes to compare them anyway.",
        )
    if len(known) < 2:
        bare = " and ".join(
            str(p) for p, v in zip((candidate, reference), ids.values(), strict=True) if v is None
        )
        identity = (
            f"not checked: {bare} does not say which recipe it ran (a log, or no recipe.yaml)"
        )
    elif known[0] != known[1]:
        identity = f"different recipes, compared as asked: {known[0]} and {known[1]}"
    else:
        identity = f"the same recipe: {known[0]}"
    cand_records, _ = load_records(candidate)
    ref_records, _ = load_records(reference)
    result = check(loss_curve(cand_records), loss_curve(ref_records), **thresholds)
    if json_out:
        payload = result.to_dict()
        payload["recipes"] = {**ids, "identity": identity}
        print(json.dumps(json_safe(payload), allow_nan=False))
    else:
        print(f"recipes: {identity}")
        print(render_convergence(result))
    return 0 if result.passed else 1
