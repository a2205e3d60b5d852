"""The bodies of `reproduce measure` and `reproduce compare`: load, compute, print, exit code.

Kept out of cli.py so the CLI stays a thin layer and its start-up light (this module and what
it imports load only when one of these commands runs).
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.convergence import check, loss_curve
from launcher.errors import BadInput
from launcher.measure import json_safe, load_recipe_raw, load_records, measure_path
from launcher.report import render_convergence, render_summary
from launcher.verdict import Tolerance


def run_measure(
    log: Path,
    recipe: Path | None,
    *,
    json_out: bool = False,
    price_per_hour: float | None = None,
    region: str | None = None,
    timeline: Path | None = None,
    slower: float = 3.0,
    faster: float = 3.0,
) -> int:
    """Print the figures and the verdict; return 0 when reproduced, else 1. BadInput propagates."""
    if recipe is None:
        if not (Path(log).is_dir() and (Path(log) / "recipe.yaml").is_file()):
            raise BadInput(
                "--recipe is required unless LOG is a run directory holding recipe.yaml."
            )
        recipe = Path(log) / "recipe.yaml"
    recipe_raw = load_recipe_raw(recipe)
    tolerance = Tolerance(slower_percent=slower, faster_percent=faster)
    result, verdict = measure_path(
        log,
        recipe_raw,
        price_per_hour=price_per_hour,
        region=region,
        tolerance=tolerance,
        timeline_path=timeline,
    )
    if json_out:
        payload = result.to_dict()
        payload["verdict"] = verdict.to_dict()
        print(json.dumps(json_safe(payload), allow_nan=False))
    else:
        print(render_summary(result, verdict))
    return 0 if verdict.reproduced else 1


def run_compare(candidate: Path, reference: Path, *, json_out: bool = False, **thresholds) -> int:
    """Print every figure of the convergence check; return 0 on pass, 1 on fail."""
    cand_records, _ = load_records(candidate)
    ref_records, _ = load_records(reference)
    result = check(loss_curve(cand_records), loss_curve(ref_records), **thresholds)
    if json_out:
        print(json.dumps(json_safe(result.to_dict()), allow_nan=False))
    else:
        print(render_convergence(result))
    return 0 if result.passed else 1
