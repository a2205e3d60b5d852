"""`reproduce compare CANDIDATE REFERENCE`: both runs' figures side by side, then the loss-curve
convergence check.

Exit codes: 0 converged; 1 not converged; 2 bad input, which includes a log that could not be
read and a compare of two different recipes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from launcher.commands import options as o
from launcher.commands.output import fail, say
from launcher.errors import BadInput, ReproduceError

if TYPE_CHECKING:
    from launcher.judge.gate import LogEvidence
    from launcher.results.side_by_side import Side


def compare_cmd(
    candidate: Path = typer.Argument(..., help="candidate run directory, run id or log"),
    reference: Path = typer.Argument(..., help="reference run directory, run id or log"),
    json_out: o.Json = False,
    allow_different: bool = typer.Option(
        False,
        "--allow-different-recipes",
        help="compare runs of two different recipes (refused otherwise)",
    ),
) -> None:
    """Both runs' figures side by side (with each verdict's assurance), then the loss-curve convergence check of CANDIDATE against REFERENCE. Exit 0 pass, 1 fail, 2 bad input or two different recipes."""  # noqa: E501 - typer shows its line breaks
    try:
        code = run_compare(
            candidate, reference, json_out=json_out, allow_different_recipes=allow_different
        )
    except ReproduceError as err:
        raise fail(err, json_out) from None
    raise typer.Exit(code)


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
    from launcher.judge.convergence import check, loss_curve
    from launcher.pages.report import render_convergence
    from launcher.records.rundir import RunDir
    from launcher.results.evaluate import check_input, read_log
    from launcher.results.measure_record import json_safe
    from launcher.results.side_by_side import side_of

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


def _identity(cand: LogEvidence, ref: LogEvidence, allow_different: bool) -> str:
    """What says the two logs are runs of one recipe: the recipes of run directories, and the
    arguments both logs printed (Megatron's listing). BadInput when they differ, unless asked."""
    from launcher.judge.gate import argument_differences

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
    from launcher.judge.assurance import shown
    from launcher.pages.report import fmt
    from launcher.results.side_by_side import FIGURES

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
