"""A mean of K measured runs: the runs' figures aggregated, and the verdict on the mean.

Why its own module: a claim that is a mean of N runs (`result.runs`) is reproduced by a mean,
not by one run (launcher/plan/claimruns.py). Each measured run is first measured and judged
alone, by exactly the rules of one run (launcher/judge/measure.py, verdict.py, the evidence
gate). Then, pure, no I/O (docs/measurement.md, "A mean of several runs"):

- fail closed: a run failed, mismatch, unreadable or incomplete, or a run that never ran (the
  loop stops at the first failure), makes the whole that status, in that order of precedence,
  naming each such run; no mean is stated as the reproduction's figure;
- otherwise the figure is the mean (AGGREGATION says how each figure aggregates), judged by the
  same verdict rules and tolerance as one run; a run that was unstable alone makes the whole
  unstable;
- the verdict says how many runs were measured, and, when fewer than the claim's N (--runs K),
  that the mean is of fewer runs than the claim's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from launcher.judge.verdict import JUDGED, Tolerance, Verdict, judge

if TYPE_CHECKING:
    from launcher.inputs.recipe import Recipe
    from launcher.judge.measure import Result

# A run among K that is not judged makes the whole this status: the first of these it has.
FAIL_ORDER = ("failed", "mismatch", "unreadable", "incomplete")
AGGREGATION = {
    "tokens_per_s_per_gpu": "arithmetic mean of the runs' figures (each over its own window)",
    "mfu": "from the mean tokens/s per GPU, the recipe's formula (= the mean of the runs' MFU)",
    "usd_per_million_tokens": "from the mean tokens/s per GPU at the run's price (one price "
    "for every run: not the mean of the runs' $ figures, which would over-weight a slow run)",
    "step_time_cv_percent": "mean of the runs' step-time CVs, each within its own window (what "
    "the recipe's CV limit is about); the run-to-run spread is spread.cv_percent",
    "gpu_hours": "the whole reproduction: GPUs x node acquired to released, so the shared setup "
    "once plus every run's training; each run's own train stage is in each[].gpu_hours",
    "noise_band_percent": "2 x spread.cv_percent / sqrt(K): a difference inside it is noise",
}


@dataclass(frozen=True)
class Run:
    """One measured run, measured and judged alone."""

    index: int  # 1..K, in the order they ran
    result: Result
    verdict: Verdict
    where: str  # its sub-directory of the run directory (measured/<k>)


def _mean(values: Sequence[float | None]) -> float | None:
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None
    return statistics.fmean(v for v in values if v is not None)


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """min, max, population stdev and CV (percent) of the runs' tokens/s per GPU."""
    if not values:
        return {"min": None, "max": None, "stdev": None, "cv_percent": None}
    mean = statistics.fmean(values)
    std = statistics.pstdev(values) if len(values) > 1 else 0.0
    return {
        "min": min(values),
        "max": max(values),
        "stdev": std,
        "cv_percent": 100.0 * std / mean if mean else None,
    }


def _each(run: Run) -> dict[str, Any]:
    r = run.result
    return {
        "run": run.index,
        "dir": run.where,
        "status": run.verdict.status,
        "difference_percent": run.verdict.difference_percent,
        "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
        "step_time_cv_percent": r.step_time_cv_percent,
        "mfu": r.mfu,
        "usd_per_million_tokens": r.usd_per_million_tokens,
        "gpu_hours": r.gpu_hours,
        "reasons": list(run.verdict.reasons[:3]),
        "error": run.verdict.error,
    }


def _summary(
    runs: Sequence[Run], expected: int, claimed: int, accepted: int | None, whole: bool
) -> dict[str, Any]:
    tps = [r.result.tokens_per_s_per_gpu for r in runs]
    finite = [t for t in tps if t is not None and math.isfinite(t)]
    return {
        "claimed": claimed,
        "measured": expected,
        "ran": len(runs),
        "accepted": accepted,
        "judged_on_mean": whole,
        "each": [_each(r) for r in runs],
        "spread": spread(finite) if whole else spread([]),
        "aggregation": AGGREGATION,
    }


def _runs_reason(expected: int, claimed: int) -> str:
    if expected < claimed:
        return (
            f"the claim is a mean of {claimed} runs (result.runs); this is the mean of "
            f"{expected} measured runs, fewer, as --runs {expected} asked"
        )
    return f"judged on the mean of {expected} measured runs (result.runs {claimed})"


def judge_mean(
    runs: Sequence[Run],
    recipe: Recipe,
    *,
    expected: int,
    claimed: int,
    accepted: int | None = None,
    tolerance: Tolerance | None = None,
    gpu_hours: tuple[float | None, str, dict[str, float]] | None = None,
    stages: tuple[list[str], list[str]] = ([], []),
) -> tuple[Result, Verdict]:
    """The reproduction's Result (the mean, or no figure) and its Verdict, from K judged runs.

    `expected`: K, the runs the node script was to measure (fewer in `runs`: the loop stopped);
    `claimed`: the claim's N; `gpu_hours`: (hours, note, by stage) of the whole reproduction;
    `stages`: its timeline's failed stages (launcher/judge/split.py, failed_stages), read as a
    run judged alone reads them."""
    if not runs:
        raise ValueError("a mean of measured runs needs at least one run")
    tolerance = tolerance if tolerance is not None else Tolerance()
    blockers = [r for r in runs if r.verdict.status not in JUDGED]
    missing = list(range(len(runs) + 1, expected + 1))
    whole = not blockers and not missing
    summary = _summary(runs, expected, claimed, accepted, whole)
    hours, hours_note, by_stage = gpu_hours if gpu_hours else (None, "no run timeline", {})
    note = f"the figures are the mean of {len(runs)} measured runs (measured/1..{len(runs)})"
    deciding, after = stages
    if not whole:
        return _failed_whole(
            runs, blockers, missing, expected, claimed, summary, (hours, hours_note, by_stage)
        )
    results = [r.result for r in runs]
    mean_tps = _mean([r.tokens_per_s_per_gpu for r in results])
    first = results[0]
    usd = None
    if mean_tps and first.usd_per_million_tokens is not None and first.tokens_per_s_per_gpu:
        usd = first.usd_per_million_tokens * first.tokens_per_s_per_gpu / mean_tps
    between = summary["spread"]["cv_percent"]
    mean = replace(
        first,
        tokens_per_s_per_gpu=mean_tps,
        step_time_cv_percent=_mean([r.step_time_cv_percent for r in results]),
        mfu=_mean([r.mfu for r in results]),
        megatron_mfu=_mean([r.megatron_mfu for r in results]),
        usd_per_million_tokens=usd,
        mean_step_time_s=_mean([r.mean_step_time_s for r in results]),
        std_step_time_s=_mean([r.std_step_time_s for r in results]),
        noise_band_percent=(2.0 * between / math.sqrt(len(runs)) if between is not None else None),
        gpu_hours=hours,
        gpu_hours_source=hours_note,
        gpu_hours_by_stage=by_stage,
        window_gpu_hours=sum(r.window_gpu_hours or 0.0 for r in results),
        notes=[note, *first.notes],
        failed_stages=list(deciding),
        failed_after_training=list(after),
        measured=results[-1].measured or first.measured,  # the date of the last run
        runs=len(runs),
        run_summary=summary,
    )
    verdict = judge(mean, recipe, tolerance=tolerance)
    reasons = [r for r in verdict.reasons if not r.startswith("noise band of this run")]
    if mean.noise_band_percent is not None:
        reasons.append(
            f"noise band of the mean: +-{mean.noise_band_percent:.2f}% (2 x the CV of the "
            f"{len(runs)} runs' tokens/s per GPU, {between:.2f}%, / sqrt {len(runs)})"
        )
    unstable = [r for r in runs if r.verdict.status == "unstable"]
    if unstable and verdict.status in JUDGED:
        verdict.status = "unstable"
        reasons += [
            f"measured run {r.index} of {expected} ({r.where}) is unstable: "
            + next((x for x in r.verdict.reasons if "step-time CV" in x), "see its verdict")
            for r in unstable
        ]
    reasons += [_run_line(r, expected) for r in runs]
    verdict.reasons = [_runs_reason(expected, claimed), *reasons]
    verdict.runs = summary
    return mean, verdict


def _run_line(run: Run, expected: int) -> str:
    tps = run.result.tokens_per_s_per_gpu
    diff = run.verdict.difference_percent
    figure = f"{tps:.2f} tokens/s per GPU" if tps is not None else "no figure"
    shown = f" ({diff:+.2f}%)" if diff is not None else ""
    return f"run {run.index} of {expected} ({run.where}): {figure}{shown}, {run.verdict.status}"


def _failed_whole(
    runs: Sequence[Run],
    blockers: Sequence[Run],
    missing: Sequence[int],
    expected: int,
    claimed: int,
    summary: dict[str, Any],
    gpu_hours: tuple[float | None, str, dict[str, float]],
) -> tuple[Result, Verdict]:
    """A run failed, was not whole or never ran: the whole takes the worst status, no figure."""
    statuses = {r.verdict.status for r in blockers} | ({"incomplete"} if missing else set())
    status = next(s for s in FAIL_ORDER if s in statuses)
    reasons = [
        f"measured run {r.index} of {expected} ({r.where}) is {r.verdict.status}: "
        + ("; ".join(r.verdict.reasons[:2]) or "see its verdict")
        for r in blockers
    ]
    if missing:
        after = f" (the runs stopped after run {blockers[-1].index})" if blockers else ""
        reasons.append(
            f"measured run(s) {', '.join(map(str, missing))} of {expected} never ran{after}"
        )
    reasons.append(
        f"a mean of {expected} runs is judged only when every run is whole (fail closed): "
        "no figure is the reproduction's"
    )
    reasons += [_run_line(r, expected) for r in runs if r not in blockers]
    base = (blockers[0] if blockers else runs[-1]).result
    hours, note, by_stage = gpu_hours
    result = replace(
        base,
        tokens_per_s_per_gpu=None,
        step_time_cv_percent=None,
        mfu=None,
        megatron_mfu=None,
        usd_per_million_tokens=None,
        noise_band_percent=None,
        gpu_hours=hours,
        gpu_hours_source=note,
        gpu_hours_by_stage=by_stage,
        runs=len(runs),
        run_summary=summary,
    )
    first = (blockers[0] if blockers else runs[0]).verdict
    measured = dict.fromkeys(first.measured)
    measured.update(gpu_hours=hours, window=first.measured.get("window"))
    verdict = Verdict(
        status,
        None,
        [_runs_reason(expected, claimed), *reasons],
        dict(first.claimed),
        measured,
        first.tolerance,
        None,
        first.error if blockers else None,
        runs=summary,
    )
    return result, verdict
