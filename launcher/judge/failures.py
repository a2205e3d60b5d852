"""What the log shows of training that failed, stopped or was only half understood.

Why one module: the verdict may say `failed` only when the log shows training failing, and must
never say `reproduced` for a run whose training stopped or whose log the parser only half
understood (docs/measurement.md, "Fail closed"). These rules read the parsed steps and the
parser's counters and return sentences naming the step and the line; launcher/judge/measure.py keeps
them in the Result and launcher/judge/verdict.py turns them into the status. Pure: no I/O.

- failed: a NaN or infinite loss or grad norm; a loss frozen (the same value) for
  FROZEN_LOSS_STEPS consecutive steps; an optimizer step miles skipped (`ft op=train_step ...
  valid_step=false`); an exception (its traceback), an OOM or a CUDA error after which no step
  was logged (training stopped there).
- incomplete: such an error after which the run went on (its window is not one undisturbed run).
- a note only: an error printed after the recipe's last step (shutdown).
- half read (the verdict's `mismatch`): metric lines that did not parse, a train perf dict with
  no step time this parser knows, a step time that is not train wait + train.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.judge.parse.records import ParseStats, StepRecord

# This many consecutive steps with one identical loss: the optimizer is not moving the model.
# A real loss is a float mean over a batch: two equal values in a row are already rare.
FROZEN_LOSS_STEPS = 5


@dataclass
class Findings:
    """Sentences for the verdict, each naming the step(s) and the line where there is one."""

    failed: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    half_read: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # the line of the error that ended training, for the report


def _steps(steps: list[int], limit: int = 8) -> str:
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f", ... ({len(steps)} in all)" if len(steps) > limit else "")


def _bad(value: float | None) -> bool:
    return value is not None and not math.isfinite(value)


def find(
    recs: Mapping[int, StepRecord], stats: ParseStats | None, steps_expected: int | None
) -> Findings:
    """Every finding of the module docstring's rules, for one log."""
    out = Findings()
    steps = sorted(recs)
    nan_grad = [s for s in steps if _bad(recs[s].grad_norm)]
    if nan_grad:
        first = recs[nan_grad[0]].grad_norm
        out.failed.append(
            f"train/grad_norm is {first!r} at step(s) {_steps(nan_grad)} (first: the `step "
            f"{nan_grad[0]}:` line): the gradients are not finite"
        )
    frozen = _frozen(recs, steps)
    if frozen is not None:
        out.failed.append(frozen)
    if stats is None:
        return out
    if stats.skipped_optimizer_steps:
        line = next((s["line"] for s in stats.signals if s["kind"] == "skipped optimizer step"), "")
        rollouts = sorted(set(stats.skipped_rollouts))
        out.failed.append(
            f"miles skipped {stats.skipped_optimizer_steps} optimizer step(s) (valid_step=false"
            f"{', rollout(s) ' + _steps(rollouts) if rollouts else ''}): {line!r}"
        )
    _errors(out, recs, steps, stats, steps_expected)
    _half_read(out, stats)
    return out


def _frozen(recs: Mapping[int, StepRecord], steps: list[int]) -> str | None:
    run: list[int] = []
    for s in steps:
        loss = recs[s].loss
        if loss is None or not math.isfinite(loss):
            run = []
            continue
        if run and run[-1] == s - 1 and recs[run[-1]].loss == loss:
            run.append(s)
        else:
            run = [s]
        if len(run) >= FROZEN_LOSS_STEPS:
            end = run[-1]
            while end + 1 in recs and recs[end + 1].loss == loss:
                end += 1
            return (
                f"train/loss is frozen at {loss!r} from step {run[0]} to step {end} "
                f"({end - run[0] + 1} steps, limit {FROZEN_LOSS_STEPS}): the model is not training"
            )
    return None


def _errors(
    out: Findings,
    recs: Mapping[int, StepRecord],
    steps: list[int],
    stats: ParseStats,
    steps_expected: int | None,
) -> None:
    errors = [s for s in stats.signals if s["kind"] != "skipped optimizer step"]
    if not errors:
        return
    last = steps[-1] if steps else -1
    final = steps_expected - 1 if steps_expected is not None else None
    # The most specific line of the first error (`torch.OutOfMemoryError: ...` over the bare
    # `Traceback` header), among the lines printed after the same step.
    first = errors[0]
    group = [e for e in errors if e["after_step"] == first["after_step"]]
    named = next((e for e in group if e["kind"] != "exception"), first)
    at = first["after_step"]
    where = "before step 0" if at < 0 else f"after step {at}"
    what = f"{named['kind']} {where}: {named['line']!r}"
    more = f" ({stats.signal_lines} failure line(s) in all)" if stats.signal_lines > 1 else ""
    if final is not None and at >= final:
        out.notes.append(f"after the recipe's last step, the log shows {what}{more}")
    elif last <= at:
        out.failed.append(f"training stopped with {what}{more}")
        out.error = named["line"]
    else:
        out.incomplete.append(
            f"{what}; the run went on to step {last}, so its steps are not one undisturbed "
            f"run{more}"
        )
        out.error = named["line"]


def _half_read(out: Findings, stats: ParseStats) -> None:
    if stats.unparseable:
        shown = "; ".join(repr(e) for e in stats.unparseable_examples[:2])
        out.half_read.append(
            f"{stats.unparseable} metric line(s) could not be read ({shown}): evidence the "
            "parser does not understand is not passed over"
        )
    if stats.no_step_time or stats.inconsistent:
        shown = "; ".join(stats.half_read_examples[:2])
        out.half_read.append(
            f"{stats.no_step_time + stats.inconsistent} train perf line(s) give no step time "
            f"this launcher can trust: {shown}"
        )
