"""The bodies of `reproduce measure` and `reproduce compare`: load, compute, print, exit code.

Exit codes: 0 reproduced (compare: converged); 1 any other verdict, `mismatch` included (compare:
not converged); 2 bad input, which includes a log that could not be read (verdict `unreadable`:
nothing in it says training failed, so it is never reported as a failed run) and a compare of two
different recipes. Loaded only when one of these commands runs, so the CLI's start-up stays light.
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.commands.output import say
from launcher.errors import BadInput
from launcher.inputs.recipe import load_recipe
from launcher.judge.assurance import shown
from launcher.judge.convergence import check, loss_curve
from launcher.judge.gate import LogEvidence, argument_differences
from launcher.judge.verdict import DEFAULT_TOLERANCE_PERCENT, Tolerance
from launcher.pages.report import fmt, render_convergence, render_summary
from launcher.records.rundir import RunDir
from launcher.results.evaluate import (
    RECIPE_FILE,
    check_input,
    measure_path,
    read_log,
)
from launcher.results.measure_record import json_safe
from launcher.results.side_by_side import FIGURES, Side, side_of

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


def _identity(cand: LogEvidence, ref: LogEvidence, allow_different: bool) -> str:
    """What says the two logs are runs of one recipe: the recipes of run directories, and the
    arguments both logs printed (Megatron's listing). BadInput when they differ, unless asked."""
    hint = "Pass --allow-different-recipes to compare them anyway."
    if cand.recipe and ref.recipe and cand.recipe != ref.recipe and not allow_different:
        raise BadInput(
            f"{cand.path} is a run of {cand.recipe}, {ref.path} a run of {ref.recipe}: "
            "different recipes, whose loss curves say nothing about each other.",
            hint=hint,
        )
    differ = argument_differences(cand, ref)
    if differ and not allow_different:
        raise BadInput(
            f"{cand.path} and {ref.path} printed different arguments ({'; '.join(differ[:6])}): "
            "runs of different recipes, whose loss curves say nothing about each other.",
            hint=hint,
        )
    compared = len(set(cand.arguments) & set(ref.arguments))
    printed = f"; printed arguments: {compared} compared, {len(differ)} differ" if compared else ""
    if cand.recipe and ref.recipe:
        if cand.recipe != ref.recipe:
            return f"different recipes, compared as asked: {cand.recipe} and {ref.recipe}{printed}"
        return f"the same recipe: {cand.recipe}{printed}"
    if compared and not differ:
        return f"the same printed arguments ({compared} compared); no recipe.yaml says which recipe"
    if differ:
        return f"different printed arguments, compared as asked: {'; '.join(differ[:6])}"
    bare = " and ".join(str(e.path) for e in (cand, ref) if e.recipe is None)
    return (
        f"not checked: {bare} does not say which recipe it ran (a log, or no recipe.yaml), and "
        "the two logs do not both print an arguments listing"
    )


def _side_by_side(sides: tuple[Side, Side]) -> str:
    """Both runs' figures and verdicts (with their assurance), above the loss check."""
    rows = [f"{'':<20}{'candidate':>24}{'reference':>24}"]
    for key, label, digits in FIGURES:
        cells = [fmt(s.figures.get(key), digits) if s.figures else "n/a" for s in sides]
        rows.append(f"{label:<20}{cells[0]:>24}{cells[1]:>24}")
    verdicts = [shown(s.verdict, s.assurance) if s.verdict else "not judged" for s in sides]
    rows.append(f"{'verdict':<20}{verdicts[0]:>24}{verdicts[1]:>24}")
    rows += [
        f"{role}: {s.path}: {s.source}"
        for role, s in zip(("candidate", "reference"), sides, strict=True)
    ]
    return "\n".join(rows)


def run_compare(
    candidate: Path,
    reference: Path,
    *,
    json_out: bool = False,
    allow_different_recipes: bool = False,
    **thresholds: float,
) -> int:
    """Print every figure of the convergence check; return 0 on pass, 1 on fail.

    Both logs are read through the gate (launcher/judge/gate.py), as `measure` reads them: an
    unreadable log is bad input (exit 2, as `measure` says), and a log whose steps carry two
    different values, or lines only half understood, never passes. Two runs of different recipes
    (by their recipe.yaml, or by the arguments both printed) are refused (BadInput) unless
    allowed: their loss curves passing the check would say nothing about either recipe.
    """
    cand = read_log(check_input(RunDir.target(candidate)))
    ref = read_log(check_input(RunDir.target(reference)))
    for ev in (cand, ref):
        if ev.unreadable:
            raise BadInput(f"{ev.path}: {ev.unreadable}")
    identity = _identity(cand, ref, allow_different_recipes)
    result = check(loss_curve(cand.records), loss_curve(ref.records), **thresholds)
    unsound = [
        f"{role} {ev.path}: {p}"
        for role, ev in (("candidate", cand), ("reference", ref))
        for p in ev.problems()
    ]
    if unsound:  # the gate's findings decide before any figure: never a pass
        result.passed = False
        result.reasons[:0] = unsound
    ids = {"candidate": cand.recipe, "reference": ref.recipe}
    sides = (side_of(cand.path, ref.path), side_of(ref.path, cand.path))
    if json_out:
        payload = result.to_dict()
        payload["recipes"] = {**ids, "identity": identity}
        payload["runs"] = {"candidate": sides[0].to_dict(), "reference": sides[1].to_dict()}
        print(json.dumps(json_safe(payload), allow_nan=False))
    else:
        say(_side_by_side(sides))
        say(f"recipes: {identity}")
        say(render_convergence(result))
    return 0 if result.passed else 1
