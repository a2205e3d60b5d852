"""`result.runs`: a claim that is the mean of N runs, against a reproduction that measures one.

Why its own module: the recipe's `runs: N` says its figures summarise N runs. One reproduction
trains once, so its figure is one run, not a mean, and judging it as if it reproduced the mean
would claim more than was measured. The promise (docs/recipe-fields.md):

- the dry run's header says "the claim is a mean of N runs; this run measures 1";
- without `--runs 1` the verdict of such a claim is never `reproduced` (a run within the band is
  `incomplete`, with the reason and no in-band reason); slower, faster, unstable, failed stay
  what they are, since one run can show those;
- `--runs 1` is the explicit choice to judge one run against the mean; the verdict then says so
  among its reasons. It is recorded in plan.json (`runs`), so `reproduce measure RUN_DIR` judges
  the run again the same way;
- more measured runs than one per reproduction (the mean of K runs on one node) are not
  implemented: `--runs K` with K > 1 is refused before anything starts.

Pure apart from `accepted_in`, which reads a run directory's plan.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors import BadInput
from launcher.records.rundir import Files

if TYPE_CHECKING:
    from launcher.inputs.recipe import Recipe
    from launcher.judge.verdict import Verdict

MEASURED_PER_REPRODUCTION = 1  # one training per reproduction (docs/recipe-fields.md)


def claimed_runs(recipe: Recipe) -> int:
    """result.runs, 1 when the recipe does not say."""
    runs = (recipe.raw.get("result") or {}).get("runs")
    return int(runs) if isinstance(runs, int) and not isinstance(runs, bool) and runs > 0 else 1


def check_option(recipe: Recipe, runs: int | None) -> int | None:
    """The --runs value, checked against the claim: BadInput for what cannot be honoured."""
    if runs is None:
        return None
    claimed = claimed_runs(recipe)
    if runs < 1:
        raise BadInput(f"--runs {runs}: expected a number of runs >= 1.")
    if runs > claimed:
        raise BadInput(
            f"--runs {runs}: the claim of {recipe.path} is a mean of {claimed} run(s) "
            f"(result.runs); expected at most {claimed}."
        )
    if runs != MEASURED_PER_REPRODUCTION:
        raise BadInput(
            f"--runs {runs}: a reproduction measures one run; the mean of {runs} runs on one node "
            "is not implemented in this version. --runs 1 judges one run against the claimed mean "
            f"of {claimed}; or run `reproduce` {runs} times and compare the runs' figures."
        )
    return runs


def record(recipe: Recipe, accepted: int | None) -> dict[str, Any]:
    """plan.json's `runs`: what the claim summarises, what this run measures, what was accepted."""
    return {
        "claimed": claimed_runs(recipe),
        "measured": MEASURED_PER_REPRODUCTION,
        "accepted": accepted,
    }


def header_line(recipe: Recipe, accepted: int | None) -> str | None:
    """The dry run's and the cost header's line, or None when the claim is one run."""
    claimed = claimed_runs(recipe)
    if claimed <= MEASURED_PER_REPRODUCTION:
        return None
    text = f"runs      the claim is a mean of {claimed} runs (result.runs); this run measures 1"
    if accepted:
        return text + ": judged against the mean, as --runs 1 asks"
    return text + ": its verdict cannot be `reproduced` (--runs 1 judges one run against the mean)"


def claim_lines(recipe: Recipe, accepted: int | None) -> list[str]:
    """What the recipe's fields change about this run and its verdict (result.runs, patches),
    shown with the claim before anything is paid for: the dry run's and the cost gate's header
    (lines without '# ')."""
    from launcher.inputs import patches

    runs = header_line(recipe, accepted)
    return ([runs] if runs else []) + patches.header_lines(recipe)


def accepted_in(run_dir: Path) -> int | None:
    """The --runs a run was started with (plan.json's `runs.accepted`), None when not given."""
    try:
        plan = json.loads((Path(run_dir) / Files.PLAN).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    runs = plan.get("runs") if isinstance(plan, dict) else None
    accepted = runs.get("accepted") if isinstance(runs, dict) else None
    return accepted if isinstance(accepted, int) and not isinstance(accepted, bool) else None


def apply(verdict: Verdict, recipe: Recipe, accepted: int | None) -> Verdict:
    """The verdict with the claim's runs taken into account (see the module's promise)."""
    claimed = claimed_runs(recipe)
    if claimed <= MEASURED_PER_REPRODUCTION:
        return verdict
    if accepted:
        verdict.reasons.append(
            f"the claim is a mean of {claimed} runs (result.runs); this is 1 run, judged against "
            "the mean as --runs 1 asked"
        )
        return verdict
    reason = (
        f"the claim is a mean of {claimed} runs (result.runs); this is 1 run, which cannot "
        "reproduce a mean (--runs 1 judges one run against it)"
    )
    if verdict.status == "reproduced":
        # an incomplete verdict lists no in-band reason: the figure was not judged as a mean
        verdict.status = "incomplete"
        verdict.reasons = [reason] + [r for r in verdict.reasons if ", within -" not in r]
    else:
        verdict.reasons.append(reason)
    return verdict
