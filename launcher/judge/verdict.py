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
from typing import TYPE_CHECKING, Any

from launcher.errors import BadInput
from launcher.inputs.recipe import FIGURES
from launcher.judge.failures import FROZEN_LOSS_STEPS
from launcher.judge.split import failed_after_note

if TYPE_CHECKING:
    from launcher.inputs.recipe import Recipe
    from launcher.judge.assurance import Assurance
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


@dataclass(frozen=True)
class Tolerance:
    """Verdict thresholds (percent). Defaults: docs/measurement.md."""

    slower_percent: float = DEFAULT_TOLERANCE_PERCENT  # below the claim by more: "slower"
    faster_percent: float = DEFAULT_TOLERANCE_PERCENT  # above the claim by more: "faster"
    cv_factor: float = 2.0  # CV above cv_factor x the recipe's CV ...
    cv_floor_percent: float = 2.0  # ... and above this: "unstable"

    def __post_init__(self) -> None:
        # a NaN bound is never crossed and an infinite one always holds: either judges any run
        # "reproduced" (docs/architecture.md, "Numbers are finite")
        for name, value in self.to_dict().items():
            if not (isinstance(value, (int, float)) and 0 <= value < math.inf):
                raise BadInput(f"tolerance {name} must be a finite number >= 0, got {value}.")

    def to_dict(self) -> dict[str, Any]:
        return {
            "slower_percent": self.slower_percent,
            "faster_percent": self.faster_percent,
            "cv_factor": self.cv_factor,
            "cv_floor_percent": self.cv_floor_percent,
        }


# The policy that judges a run: the rules of launcher/judge/measure.py and of this module, as one
# named, versioned policy. Every verdict.json and result.yaml records it (docs/measurement.md,
# "The policy"), an attestation records it in measure.json and `reproduce verify` re-measures
# only under the same one (docs/attestation.md). Bump the version whenever a rule or default
# changes a figure or a status for the same inputs, so two verdicts are comparable exactly when
# their policies are. v2: the fail-closed rules (an error that ended training, a frozen
# loss, a skipped optimizer step, half-read lines; a run with no step is incomplete, not failed).
# v3: a claim that is a mean of N runs is judged on the mean of K measured runs, fail closed
# (launcher/judge/aggregate.py, the last rule). v4: the evidence gate holds the window's claimed
# step times to the host's clock (launcher/judge/evidence.py, check 6). v5: and a window whose
# GPUs the host saw idle is a mismatch (check 7: the GPUs at work). v6: positive proof: the
# model's identity from the listing (launcher/judge/identity.py), a log without the listing and
# owed host evidence missing fail closed, an MFU above the chip's peak is a mismatch, an exception
# the run recovered from in the same process is a note, and every verdict carries its assurance
# level (launcher/judge/assurance.py).
POLICY_NAME = "reproduce-verdict"
POLICY_VERSION = 6
POLICY_RULES = (
    "unreadable: nothing in the log is miles', or no step carries a step time it knows",
    "failed: the log shows training failing (NaN/inf loss, grad norm or step time, a loss frozen "
    f"for {FROZEN_LOSS_STEPS} steps, a skipped optimizer step, an error after which no step "
    "came, a failed stage, no window step with a step time)",
    "mismatch: the log is not evidence of this recipe (its arguments or its model, by the "
    "parameter counts of the architecture it printed, disagree with the recipe, or it prints no "
    "arguments listing), disagrees with itself or with the host's clock, the host saw a GPU of "
    "the recipe idle during the window, evidence the host owes (its clock, its GPU samples, for "
    "a run launched with them on) is missing or cut short, a figure is impossible (MFU above the "
    "chip's peak), or it holds metric lines the parser only half understood",
    "incomplete: window steps missing, the run ended early or was cut, or a process-ending error "
    "mid-run after which the trainer started again (an exception recovered from in the same "
    "process is a note: the step times judge it)",
    "unstable: step-time CV above max(cv_factor x the recipe's CV, cv_floor_percent)",
    "slower / faster / reproduced: tokens/s per GPU over the window against the claim, "
    "outside or inside the tolerance",
    "a mean of K measured runs (result.runs): each run is judged alone by the rules above; a run "
    "failed, mismatch, unreadable or incomplete, or one that never ran, makes the whole that "
    "status (in that order), naming the run; a run unstable, or the runs' mean CV above the limit, "
    "makes it unstable; else the mean of the runs' tokens/s per GPU is judged against the claim. "
    "K < N runs (--runs K) is judged on their mean and the reasons say so",
    "assurance: every verdict says how strong its evidence is: host-verified (the host's clock "
    "and GPU samples held the window), log-only (the log alone), cluster-vouched (a cluster ran "
    "the launcher's checks as its own job); a mean of K runs takes its weakest run's",
)


def policy(tolerance: Tolerance | None = None) -> dict[str, Any]:
    """The policy a verdict was judged under, as recorded beside it; options that differ from
    the policy's defaults are listed under `overridden`."""
    tolerance = tolerance if tolerance is not None else Tolerance()
    default = Tolerance().to_dict()
    given = tolerance.to_dict()
    return {
        "name": POLICY_NAME,
        "version": POLICY_VERSION,
        "tolerance": given,
        "overridden": sorted(k for k in given if given[k] != default[k]),
        "frozen_loss_steps": FROZEN_LOSS_STEPS,
        "window": "the recipe's result.window, every step of it required",
        "noise_band": "2 x step-time CV / sqrt(window steps), percent; of a mean of K runs: "
        "2 x the CV of the runs' tokens/s per GPU / sqrt(K)",
        "rules": list(POLICY_RULES),
    }


@dataclass
class Verdict:
    status: str
    difference_percent: float | None  # signed: (measured - claimed) / claimed x 100
    reasons: list[str] = field(default_factory=list)
    claimed: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)
    tolerance: Tolerance = field(default_factory=Tolerance)
    noise_band_percent: float | None = None
    error: str | None = None  # the log line of the error that ended training, when there is one
    # a mean of K runs: each run's status and figure (judge/aggregate.py)
    runs: dict[str, Any] | None = None
    # how strong the evidence is (launcher/judge/assurance.py): set where the run's kind is known
    assurance: Assurance | None = None

    @property
    def policy(self) -> dict[str, Any]:
        return policy(self.tolerance)

    @property
    def reproduced(self) -> bool:
        return self.status == "reproduced"

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "difference_percent": self.difference_percent,
            "reasons": list(self.reasons),
            "claimed": self.claimed,
            "measured": self.measured,
            "tolerance": self.tolerance.to_dict(),
            "policy": self.policy,
            "noise_band_percent": self.noise_band_percent,
            "error": self.error,
            **({"runs": self.runs} if self.runs is not None else {}),
            "assurance": self.assurance.to_dict() if self.assurance is not None else None,
        }


def _rel(measured: float | None, claimed: float | None) -> float | None:
    """The signed difference in percent, or None where there is none to state (a figure missing
    or not finite: NaN or inf would make any difference look "within" the tolerance)."""
    if measured is None or claimed is None or claimed == 0:
        return None
    if not (math.isfinite(measured) and math.isfinite(claimed)):
        return None
    return 100.0 * (measured - claimed) / claimed


def judge(result: Result, recipe: Recipe, *, tolerance: Tolerance | None = None) -> Verdict:
    """The verdict: one status of STATUSES, the signed difference, and every reason."""
    tolerance = tolerance if tolerance is not None else Tolerance()
    claim = recipe.claim
    claimed_tps = claim.tokens_per_s_per_gpu
    if claimed_tps is None or not 0 < claimed_tps < math.inf:
        raise BadInput(
            "recipe has no positive, finite result.tokens_per_s_per_gpu to judge against."
        )
    claimed_cv = claim.step_time_cv_percent

    claimed: dict[str, Any] = {k: claim.figure(k) for k in FIGURES}
    claimed["window"] = list(claim.window) if claim.window is not None else None
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
    if result.steps_parsed == 0:  # shown as a failure only where the log shows one (below)
        incomplete.append("no training step found in the log: the run ended before its first")
    if result.nan_loss_steps:
        failed.append(f"NaN/inf loss at step(s) {_steps(result.nan_loss_steps)}")
    if result.nan_step_time_steps:
        failed.append(f"NaN/inf step time at step(s) {_steps(result.nan_step_time_steps)}")
    if result.failed_stages:
        failed.append(f"run stage(s) failed: {', '.join(result.failed_stages)}")
    if result.steps_parsed and not result.window_steps_present:
        incomplete.append("no step of the window has a step time")
    findings = result.findings
    failed += findings.failed
    incomplete += findings.incomplete

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

    mismatch = [d.detail for d in result.evidence.disagreements] + findings.half_read
    mismatch += _impossible(result)
    not_checked = [f"not checked: {n}" for n in result.evidence.not_checked]
    not_checked += [f"note: {n}" for n in findings.notes]
    if result.failed_after_training:
        not_checked.append(f"note: {failed_after_note(result.failed_after_training)}")
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
    if failed or mismatch or incomplete:
        # Training failed, stopped, or the figure is of another run: no difference from the
        # claim is stated, and no in-band reason is listed.
        diff = None
    noise = result.noise_band_percent
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
        else:  # diff and both bounds are finite here (_rel, Tolerance): truly within
            reasons.append(f"{against}, within -{slower:g}% / +{faster:g}%")
        if noise is not None:
            reasons.append(
                f"noise band of this run: +-{noise:.2f}% (2 x step-time CV / sqrt of "
                f"{len(result.window_steps_present)} steps); a difference inside it is noise"
            )

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
        status = "incomplete"
        reasons.append("no throughput could be computed")
    else:
        status = "reproduced"
    error = findings.error if status in ("failed", "incomplete") else None
    return Verdict(status, diff, reasons + not_checked, claimed, measured, tolerance, noise, error)


def _impossible(result: Result) -> list[str]:
    """Figures no GPU can give (an MFU above the chip's peak, by either count): the log's step
    times or tokens are not this run's work, so no speed verdict stands on them."""
    out = []
    for name, mfu in (("6 x N", result.mfu), ("Megatron's count", result.megatron_mfu)):
        if mfu is not None and math.isfinite(mfu) and mfu > 1.0:
            out.append(
                f"impossible figure: MFU {mfu:.4f} by {name} is above the GPU's peak (1.0): no "
                "run computes faster than its chip, so these step times or tokens are not the "
                "work of this recipe on these GPUs"
            )
    return out


def _steps(steps: list[int], limit: int = 12) -> str:
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f", ... ({len(steps)} in all)" if len(steps) > limit else "")
