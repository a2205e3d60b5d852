"""What the log shows of training that failed, stopped or was only half understood.

Why one module: the verdict may say `failed` only when the log shows training failing, and must
never say `reproduced` for a run whose training stopped or whose log the parser only half
understood (docs/measurement.md, "Fail closed"). These rules read the parsed steps and the
parser's counters and return sentences naming the step and the line; launcher/judge/measure.py keeps
them in the Result and launcher/judge/verdict.py turns them into the status. Pure: no I/O.

- failed: a NaN or infinite loss or grad norm; a loss frozen (the same value) for
  FROZEN_LOSS_STEPS consecutive steps; an optimizer step miles skipped (`ft op=train_step ...
  valid_step=false`); a failure line (an exception's traceback, an OOM, a CUDA error, an NCCL
  watchdog timeout, a fatal abort, the shell's `Killed`: launcher/judge/parse/shapes.py, SIGNALS)
  after which no step was logged: training stopped there, and the LAST such line is the one that
  stopped it, whatever was printed and survived before.
- incomplete: a process-ending failure in the measured window after which the run went on (an
  OOM, a CUDA error, an NCCL abort, a fatal error, `Killed`: the trainer died and was started
  again, so the window is not one undisturbed run).
- a note only: an exception (its traceback) in the window that the run went on from in the same
  process (a retried read: "retry 1 succeeded"). Its presence proves nothing: whether it
  disturbed the window is for the step times to say (the CV limit, the stamps' and the host's
  clock checks, every window step's time), which judge the run as they judge any other.
- a note only: a failure line the run went on from before its window (a warning logged with its
  traceback at start-up, a retry, a process restarted before the window), and one printed after
  the recipe's last step had finished (shutdown).
- half read (the verdict's `mismatch`): metric lines that did not parse, a train perf dict with
  no step time this parser knows, a step time that is not train wait + train.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.judge.parse.records import ParseStats, SignalGroup, StepRecord

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


def find_failures(
    recs: Mapping[int, StepRecord],
    stats: ParseStats | None,
    steps_expected: int | None,
    window_start: int | None = None,
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
    if steps and steps[0] > 0:  # stated, not judged: the window's own steps may all be there
        out.notes.append(
            f"the log's first step is {steps[0]}: steps 0-{steps[0] - 1} are not in it (a run "
            "resumed from a checkpoint, or a log cut at its head)"
        )
    if stats is None:
        return out
    if stats.skipped_optimizer_steps:
        line = next((s["line"] for s in stats.signals if s["kind"] == "skipped optimizer step"), "")
        rollouts = sorted(set(stats.skipped_rollouts))
        out.failed.append(
            f"miles skipped {stats.skipped_optimizer_steps} optimizer step(s) (valid_step=false"
            f"{', rollout(s) ' + _steps(rollouts) if rollouts else ''}): {line!r}"
        )
    _errors(out, recs, steps, stats, steps_expected, window_start)
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
    window_start: int | None,
) -> None:
    """The failure lines, by the step each follows. The last group decides how training ended:
    with no step logged after it, training stopped there (failed), unless the recipe's last step
    had finished (a note: shutdown). Every earlier group is one the run went on from: before the
    window (or before step 0) a note, since the measured steps came after it; in the window, the
    window is not one undisturbed run (incomplete)."""
    groups = stats.signal_groups
    if not groups:
        return
    last = steps[-1] if steps else -1
    final = steps_expected - 1 if steps_expected is not None else None
    more = f" ({stats.signal_lines} failure line(s) in all)" if stats.signal_lines > 1 else ""
    end = groups[-1]
    recovered = groups[:-1] if end["after_step"] >= last else groups
    if end["after_step"] >= last:
        at = end["after_step"]
        what = _what(end, recs)
        finished = final is not None and at >= final and _finished(recs.get(final))
        if finished:
            out.notes.append(f"after the recipe's last step, the log shows {what}{more}")
        else:
            out.failed.append(f"training stopped with {what}{more}")
            out.error = end["line"]
    start = window_start if window_start is not None else 0
    before = [g for g in recovered if g["after_step"] + 1 < start]
    inside = [g for g in recovered if g["after_step"] + 1 >= start and g["kind"] != "exception"]
    handled = [g for g in recovered if g["after_step"] + 1 >= start and g["kind"] == "exception"]
    if handled:
        out.notes.append(
            f"{_what(handled[0], recs)}"
            + (f" (and {len(handled) - 1} more such group(s))" if len(handled) > 1 else "")
            + "; the run went on in the same process: an exception it recovered from is judged "
            "by the window's step times, not by its presence"
        )
    if before:
        out.notes.append(
            f"{_what(before[0], recs)}"
            + (f" (and {len(before) - 1} more such group(s))" if len(before) > 1 else "")
            + f"; the run went on: its measured steps (from step {start}) came after it"
        )
    if inside:
        out.incomplete.append(
            f"{_what(inside[0], recs)}; the run went on to step {last}, so its steps are not one "
            f"undisturbed run{more}"
        )
        if out.error is None:
            out.error = inside[0]["line"]


def _finished(rec: StepRecord | None) -> bool:
    """A step finished when its step time was logged (the train perf line comes at its end)."""
    return rec is not None and rec.step_time is not None


def _what(group: SignalGroup, recs: Mapping[int, StepRecord]) -> str:
    at = group["after_step"]
    if at < 0:
        where = "before step 0"
    elif _finished(recs.get(at)):
        where = f"after step {at}"
    else:
        where = f"during step {at} (its step time was never logged)"
    return f"{group['kind']} {where}: {group['line']!r}"


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
