"""The bodies of `reproduce measure` and `reproduce compare`: load, compute, print, exit code.

Loaded only when one of these commands runs, so the CLI's start-up stays light.
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.convergence import check, loss_curve
from launcher.errors import BadInput
from launcher.evaluate import RECIPE_FILE, json_safe, load_records, measure_path
from launcher.recipe import load_recipe
from launcher.report import render_convergence, render_summary
from launcher.verdict import DEFAULT_TOLERANCE_PERCENT, Tolerance


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
) -> int:
    """Print the figures and the verdict; return 0 when reproduced, else 1. BadInput propagates."""
    if recipe is None:
        if not (Path(log).is_dir() and (Path(log) / RECIPE_FILE).is_file()):
            raise BadInput(
                f"--recipe is required unless LOG is a run directory holding {RECIPE_FILE}."
            )
        recipe = Path(log) / RECIPE_FILE
    result, verdict = measure_path(
        log,
        load_recipe(recipe),
        price_per_hour=price_per_hour,
        region=region,
        tolerance=Tolerance(slower_percent=slower, faster_percent=faster),
        timeline_path=timeline,
    )
    if json_out:
        payload = result.to_dict()
        payload["verdict"] = verdict.to_dict()
        print(json.dumps(json_safe(payload), allow_nan=False))
    else:
        print(render_summary(result, verdict))
    return 0 if verdict.reproduced else 1


def run_compare(
    candidate: Path, reference: Path, *, json_out: bool = False, **thresholds: float
) -> int:
    """Print every figure of the convergence check; return 0 on pass, 1 on fail."""
    cand_records, _ = load_records(candidate)
    ref_records, _ = load_records(reference)
    result = check(loss_curve(cand_records), loss_curve(ref_records), **thresholds)
    if json_out:
        print(json.dumps(json_safe(result.to_dict()), allow_nan=False))
    else:
        print(render_convergence(result))
    return 0 if result.passed else 1
