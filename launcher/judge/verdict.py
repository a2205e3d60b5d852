"""Judge a measured Result against the recipe's claim.

Why the order of the checks: a figure is only worth comparing when the log could be read, the
run that produced it is whole, and the log is evidence of THIS recipe. So a log that could not be
read is "unreadable" (never "failed": nothing says training failed); a run that failed (NaN
loss, no step times, a failed stage) is "failed"; a log whose evidence disagrees with the recipe
or with itself (launcher/judge/evidence.py) is "mismatch"; a run that is incomplete (window steps
missing, ended early) is never "reproduced"; then an unstable run (step-time CV well above the
recipe's); only then is the throughput compared, with the tolerance of docs/measurement.md (-3% /
+3% by default). Only consistent evidence can be reproduced, slower, faster or unstable. Every
finding is listed in `reasons`, not only the one that decided the status, and every check that
could not run is listed too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher.errors import BadInput

if TYPE_CHECKING:
    from launcher.inputs.recipe import Recipe
    from launcher.judge.measure import Result

STATUSES = (
    "reproduced",
    "slower",
    "faster",
    "unstable",
    "incomplete",
    "mismatch",
    "failed",
    "unreadable",
)
# The statuses that judge the throughput: only consistent, whole evidence reaches them.
JUDGED = ("reproduced", "slower", "faster", "unstable")
# The throughput tolerance, percent either side of the claim: the one definition that the verdict,
# the CLI's --tolerance-* defaults and the history's regression test all read.
DEFAULT_TOLERANCE_PERCENT = 3.0
# The policy that judges a run: the rules of launcher/judge/measure.py and of this module. An
# attestation records it and `reproduce verify` re-measures only under the same one
# (docs/attestation.md).
# Bump the version whenever a rule changes a figure or a status for the same inputs.
POLICY_NAME = "reproduce-verdict"
POLICY_VERSION = 1


@dataclass(frozen=True)
class Tolerance:
    """Verdict thresholds (percent). Defaults: docs/measurement.md."""

    slower_percent: float = DEFAULT_TOLERANCE_PERCENT  # below the claim by more: "slower"
    faster_percent: float = DEFAULT_TOLERANCE_PERCENT  # above the claim by more: "faster"
    cv_factor: float = 2.0  # CV above cv_factor x the recipe's CV ...
    cv_floor_percent: float = 2.0  # ... and above this: "unstable"

    def to_dict(self) -> dict:
        return {
            "slower_percent": self.slower_percent,
            "faster_percent": self.faster_percent,
            "cv_factor": self.cv_factor,
            "cv_floor_percent": self.cv_floor_percent,
        }


@dataclass
class Verdict:
    status: str
    difference_percent: float | None  # signed: (measured - claimed) / claimed x 100
    reasons: list[str] = field(default_factory=list)
    claimed: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)
    tolerance: Tolerance = field(default_factory=Tolerance)

    @property
    def reproduced(self) -> bool:
        return self.status == "reproduced"

    def to_dict(self) -> dict:
        return {
            "status": self.status,
            "difference_percent": self.difference_percent,
            "reasons": list(self.reasons),
            "claimed": self.claimed,
            "measured": self.measured,
            "tolerance": self.tolerance.to_dict(),
        }


def _rel(measured: float | None, claimed: float | None) -> float | None:
    if measured is None or claimed in (None, 0) or not math.isfinite(measured):
        return None
    return 100.0 * (measured - claimed) / claimed


def judge(result: Result, recipe: Recipe, *, tolerance: Tolerance | None = None) -> Verdict:
    """The verdict: one status of STATUSES, the signed difference, and every reason."""
    tolerance = tolerance if tolerance is not None else Tolerance()
    claim = recipe.raw.get("result") or {}
    claimed_tps = claim.get("tokens_per_s_per_gpu")
    if not isinstance(claimed_tps, (int, float)) or claimed_tps <= 0:
        raise BadInput("recipe has no positive result.tokens_per_s_per_gpu to judge against.")
    claimed_cv = claim.get("step_time_cv_percent")

    claimed = {
        k: claim.get(k)
        for k in (
            "tokens_per_s_per_gpu",
            "step_time_cv_percent",
            "mfu",
            "usd_per_million_tokens",
            "gpu_hours",
            "window",
        )
    }
    measured = {
        "tokens_per_s_per_gpu": result.tokens_per_s_per_gpu,
        "step_time_cv_percent": result.step_time_cv_percent,
        "mfu": result.mfu,
        "usd_per_million_tokens": result.usd_per_million_tokens,
        "gpu_hours": result.gpu_hours,
        "window": list(result.window),
    }
    diff = _rel(result.tokens_per_s_per_gpu, claimed_tps)
    if result.unreadable:
        return Verdict("unreadable", None, [result.unreadable], claimed, measured, tolerance)

    failed: list[str] = []
    incomplete: list[str] = []
    if result.steps_parsed == 0:
        failed.append("no training step found in the log")
    if result.nan_loss_steps:
        failed.append(f"NaN/inf loss at step(s) {_steps(result.nan_loss_steps)}")
    if result.nan_step_time_steps:
        failed.append(f"NaN/inf step time at step(s) {_steps(result.nan_step_time_steps)}")
    if result.failed_stages:
        failed.append(f"run stage(s) failed: {', '.join(result.failed_stages)}")
    if result.steps_parsed and not result.window_steps_present:
        failed.append("no step of the window has a step time")

    if result.missing_window_steps:
        n, total = len(result.missing_window_steps), result.window[1] - result.window[0] + 1
        incomplete.append(
            f"{n} of {total} window steps missing: {_steps(result.missing_window_steps)}"
        )
    if result.no_loss_window_steps:
        incomplete.append(
            "no loss logged (no `step N:` line) for window step(s) "
            f"{_steps(result.no_loss_window_steps)}"
        )
    if result.ended_early:
        last = "no step" if result.last_step is None else f"step {result.last_step}"
        incomplete.append(
            f"run ended early: last step logged is {last}, "
            f"the recipe runs {result.steps_expected} steps"
        )
    stats = result.parse_stats or {}
    if stats.get("truncated"):
        incomplete.append("the log's last line is cut mid-record (the run was killed)")

    mismatch = [d.detail for d in result.evidence.disagreements]
    not_checked = [f"not checked: {n}" for n in result.evidence.not_checked]
    reasons = failed + mismatch + incomplete
    unstable = None
    cv = result.step_time_cv_percent
    if cv is not None:
        limit = tolerance.cv_floor_percent
        if isinstance(claimed_cv, (int, float)):
            limit = max(limit, tolerance.cv_factor * claimed_cv)
        if cv > limit:
            unstable = (
                f"step-time CV {cv:.2f}% exceeds {limit:.2f}% "
                f"(max of {tolerance.cv_factor:g} x the recipe's {claimed_cv}% "
                f"and {tolerance.cv_floor_percent:g}%)"
            )
            reasons.append(unstable)

    speed = None
    if mismatch:
        diff = None  # the figure is of another run: no difference from this claim is stated
    if diff is not None:
        against = (
            f"tokens/s per GPU {result.tokens_per_s_per_gpu:.2f} is {diff:+.2f}% "
            f"against the claimed {claimed_tps}"
        )
        slower, faster = tolerance.slower_percent, tolerance.faster_percent
        if diff < -slower:
            speed = "slower"
            reasons.append(f"{against} (tolerance -{slower:g}%)")
        elif diff > faster:
            speed = "faster"
            reasons.append(f"{against} (tolerance +{faster:g}%): faster than claimed")
        else:
            reasons.append(f"{against}, within -{slower:g}% / +{faster:g}%")

    if failed:
        status = "failed"
    elif mismatch:
        status = "mismatch"
    elif incomplete:
        status = "incomplete"
    elif unstable:
        status = "unstable"
    elif speed:
        status = speed
    elif diff is None:
        status = "failed"
        reasons.append("no throughput could be computed")
    else:
        status = "reproduced"
    return Verdict(status, diff, reasons + not_checked, claimed, measured, tolerance)


def _steps(steps: list[int], limit: int = 12) -> str:
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f", ... ({len(steps)} in all)" if len(steps) > limit else "")
