"""`result.runs`: a claim that is the mean of N runs, and how many runs this reproduction measures.

Why its own module: the recipe's `runs: N` says its figures summarise N runs, so a reproduction
measures N runs too, on the one node it acquired (a p5en costs about $63/h: no re-provisioning
between runs), and judges their mean (launcher/judge/aggregate.py). The promise
(docs/recipe-fields.md, docs/measurement.md "A mean of several runs"):

- K, the runs this reproduction measures, is the claim's N unless `--runs K` (1 <= K <= N) asks
  for fewer; K > N, or K < 1, is refused before anything starts (exit 2);
- the dry run's header says "the claim is a mean of N runs; this run measures K", and the cost
  estimate counts the training K times;
- node.sh runs the recipe's `run` block K times inside the one train stage loop
  (launcher/plan/measured.py); each run is kept and judged alone, the verdict is on their mean;
- K < N is judged on the mean of the K runs, and the verdict says so among its reasons;
- K = 1 is one run judged against the mean, also said (`--runs 1`). A run directory whose plan
  measured 1 run of a mean of N without `--runs 1` (a bare log, or an older run) is never
  `reproduced`: a run within the band is `incomplete`, with the reason and no in-band reason;
- plan.json records `runs` (claimed, measured, accepted), so `reproduce measure RUN_DIR` judges
  the run directory again the same way.

Pure apart from `accepted_in` and `measured_in`, which read a run directory's plan.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors import BadInput
from launcher.records import jsonread
from launcher.records.rundir import Files

if TYPE_CHECKING:
    from launcher.inputs.recipe import Recipe
    from launcher.judge.verdict import Verdict


def claimed_runs(recipe: Recipe) -> int:
    """result.runs, 1 when the recipe does not say."""
    runs = recipe.claim.runs
    return runs if runs is not None and runs > 0 else 1


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
    return runs


def measured_runs(recipe: Recipe, accepted: int | None) -> int:
    """K: the runs a reproduction measures, --runs when given, else the claim's N."""
    return accepted if accepted else claimed_runs(recipe)


def runs_for_plan(recipe: Recipe, accepted: int | None) -> dict[str, Any]:
    """plan.json's `runs`: what the claim summarises, what this run measures, what was accepted."""
    return {
        "claimed": claimed_runs(recipe),
        "measured": measured_runs(recipe, accepted),
        "accepted": accepted,
    }


def header_line(recipe: Recipe, accepted: int | None) -> str | None:
    """The dry run's and the cost header's line, or None when the claim is one run."""
    claimed = claimed_runs(recipe)
    if claimed <= 1:
        return None
    k = measured_runs(recipe, accepted)
    text = f"runs      the claim is a mean of {claimed} runs (result.runs); this run measures {k}"
    if k == claimed:
        return text + " on one node, each kept and judged, the verdict on their mean"
    if k == 1:
        return text + ": one run judged against the mean, as --runs 1 asks (the verdict says so)"
    return text + f" and judges their mean, as --runs {k} asks (the verdict says so)"


def claim_lines(recipe: Recipe, accepted: int | None) -> list[str]:
    """What the recipe's fields change about this run and its verdict (result.runs, patches),
    shown with the claim before anything is paid for: the dry run's and the cost gate's header
    (lines without '# ')."""
    from launcher.inputs import patches

    runs = header_line(recipe, accepted)
    return ([runs] if runs else []) + patches.header_lines(recipe.patches)


def _plan_runs(run_dir: Path) -> dict[str, Any]:
    try:
        plan = jsonread.load_file(Path(run_dir) / Files.PLAN)  # bounded: a run dir is anyone's
    except jsonread.NodeJSONError:
        return {}
    runs = plan.get("runs") if isinstance(plan, dict) else None
    return runs if isinstance(runs, dict) else {}


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def accepted_in(run_dir: Path) -> int | None:
    """The --runs a run was started with (plan.json's `runs.accepted`), None when not given."""
    return _count(_plan_runs(run_dir).get("accepted"))


def measured_in(run_dir: Path) -> int:
    """The runs a run directory's node script measured (plan.json's `runs.measured`), 1 when it
    does not say (a run made before K measured runs existed measured one)."""
    return _count(_plan_runs(run_dir).get("measured")) or 1


def apply(verdict: Verdict, recipe: Recipe, accepted: int | None) -> Verdict:
    """The verdict of ONE measured run with the claim's runs taken into account (see the
    module's promise); a mean of K > 1 runs is judged by launcher/judge/aggregate.py."""
    claimed = claimed_runs(recipe)
    if claimed <= 1:
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
