"""Property tests: logs built from a model of a run (tests/support/log_shapes.py's `Run`: every
version's shape, steps, times, losses, NaNs, skipped optimizer steps, errors, replayed steps,
missing keys, noise lines, a critic's steps), drawn at random, against the verdict's promises
(docs/measurement.md, "Fail closed" and "One gate"):

- never `reproduced` without every window step's evidence (judged on the model, not the parser);
- never `failed` for a log that shows no failure;
- `measure` and `compare` never disagree about readability or conflicts, and `compare` never
  passes a log the gate does not pass.

Bounded (max_examples, no deadline on a loaded 2-core machine) and without a database in the
repository (database=None), so they run in CI in well under a minute.
"""

from __future__ import annotations

import contextlib
import io
import math
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from support.log_shapes import FIXTURES, Run, losses_of, render, times_of
from support.measure import seed_recipe
from support.properties import examples

from launcher.commands.compare import run_compare
from launcher.errors import BadInput
from launcher.judge.failures import FROZEN_LOSS_STEPS
from launcher.judge.parse.shapes import SHAPES
from launcher.results.evaluate import measure_path, read_log

# Hypothesis keeps a cache of constants under ./.hypothesis even without an example database:
# point it at a temporary directory, so nothing is written into the repository.
WINDOW = range(5, 20)
STEPS_PER_RUN = 20
SETTINGS = examples(40)


FAULTS = (
    "steps",  # another number of steps (fewer: ended early; more: not this recipe's run)
    "times",  # arbitrary step times (noise, an unstable run)
    "losses",  # arbitrary losses: repeats (a frozen loss), NaN
    "nan_grad",
    "skip",  # miles' valid_step=false from a step on
    "error",  # an OOM, a CUDA error, an exception, an NCCL abort or the kernel's kill, before
    # a step or during it
    "startup",  # a warning logged with its traceback at start-up; training goes on
    "recovered",  # a retried call's traceback after a step; training goes on
    "restart",  # the trainer killed after a step and started again
    "replay",  # a step printed again, with its loss or another
    "no_perf",  # a step's train perf line missing
    "no_step_time",  # a perf dict with neither a step time nor its parts
)


@st.composite
def runs(draw: st.DrawFn) -> Run:
    """A run that went well, in any shape, with noise lines and a critic or not, and then none,
    one or a few faults of FAULTS."""
    run = Run(
        shape=draw(st.sampled_from([s.name for s in SHAPES])),
        print_args=draw(st.booleans()),
        critic=draw(st.booleans()),
        noise=draw(st.integers(0, 2)),
        step_time_key=draw(st.none() | st.just("perf/iteration_time")),
    )
    for fault in draw(st.lists(st.sampled_from(FAULTS), max_size=3, unique=True)):
        n = run.steps
        step = st.integers(0, n - 1)
        if fault == "steps":
            run.steps = n = draw(st.integers(1, 22))
            run.times, run.losses = times_of(run)[:n], losses_of(run)[:n]
            run.times += [19.0] * (n - len(run.times))
            run.losses += [0.5 + 0.01 * k for k in range(n - len(run.losses))]
        elif fault == "times":
            run.times = draw(st.lists(st.floats(5.0, 40.0), min_size=n, max_size=n))
        elif fault == "losses":
            loss = st.floats(0.05, 5.0) | st.just(1.0) | st.just(math.nan)
            run.losses = draw(st.lists(loss, min_size=n, max_size=n))
        elif fault == "nan_grad":
            run.nan_grad_from = draw(step)
        elif fault == "skip":
            run.skip_from = draw(step)
        elif fault == "error":
            run.error_at = draw(step)
            run.error = draw(st.sampled_from(["oom", "illegal", "exception", "nccl", "killed"]))
            run.error_mid_step = draw(st.booleans())
        elif fault == "startup":
            run.startup_traceback = True
        elif fault == "recovered":
            run.recovered_after = draw(step)
        elif fault == "restart":
            run.restart_after = draw(step)
        elif fault == "replay":
            s = draw(step)
            run.replay = {s: draw(st.sampled_from([losses_of(run)[s], 0.123456]))}
        elif fault == "no_perf":
            run.no_perf = draw(st.sets(step, min_size=1, max_size=3))
        elif fault == "no_step_time":
            run.no_step_time = draw(st.sets(step, min_size=1, max_size=3) | st.just(set(range(n))))
    for name in ("nan_grad_from", "skip_from", "error_at", "recovered_after", "restart_after"):
        if (getattr(run, name) or 0) >= run.steps:
            setattr(run, name, None)
    run.replay = {s: v for s, v in run.replay.items() if s < run.steps}
    run.no_perf = {s for s in run.no_perf if s < run.steps}
    run.no_step_time = {s for s in run.no_step_time if s < run.steps}
    return run


def ran(run: Run) -> int:
    """How many steps the log holds whole (a step the error cut holds its loss, no time)."""
    return run.steps if run.error_at is None else min(run.steps, run.error_at)


def went_on_in_window(run: Run) -> bool:
    """A trainer killed and started again, with a window step after it (a retried call's
    traceback is not: the run went on in the same process, and the step times judge it)."""
    n = ran(run)
    k = run.restart_after
    return k is not None and k + 1 < n and k + 1 >= WINDOW.start


def errs(run: Run) -> bool:
    """Whether the model prints its error (before step error_at's lines, if it is reached)."""
    return run.error_at is not None and run.error_at < run.steps


def cut_after_a_failure(run: Run) -> bool:
    """A failure the model means to go on from (a retried call's traceback, a killed trainer)
    printed after the last step the log holds, before the recipe's last: no step shows the run
    went on, so the log ends in a failure like any other (found 2026-12-05: a one-step log ending
    in the retry's traceback). After the recipe's last step it is the note of a failure after
    training (docs/measurement.md), not a failed run."""
    last = ran(run) - 1
    return last < STEPS_PER_RUN - 1 and last in (run.recovered_after, run.restart_after)


def frozen(losses: list[float]) -> bool:
    count = 1
    for a, b in zip(losses, losses[1:], strict=False):
        count = count + 1 if a == b and math.isfinite(a) else 1
        if count >= FROZEN_LOSS_STEPS:
            return True
    return False


def shows_failure(run: Run) -> bool:
    """What the model puts in the log that says training failed."""
    n = ran(run)
    losses = losses_of(run)[:n]
    if run.skip_from is not None and run.skip_from < n:
        return True
    return (
        errs(run)
        or cut_after_a_failure(run)
        or (run.nan_grad_from is not None and run.nan_grad_from < n)
        or any(not math.isfinite(x) for x in losses)
        or any(not math.isfinite(run.replay[s]) for s in run.replay if s < n)
        or frozen(losses)
    )


def whole(run: Run) -> bool:
    """Every window step's evidence is in the log, once, with nothing that says otherwise."""
    n = ran(run)
    losses = losses_of(run)
    return (
        run.steps == STEPS_PER_RUN
        and n == STEPS_PER_RUN
        and not shows_failure(run)
        and not (run.no_step_time & {s for s in range(n) if s not in run.no_perf})  # printed
        and not (set(WINDOW) & run.no_perf)
        and all(run.replay[s] == losses[s] for s in run.replay)
        and not went_on_in_window(run)
    )


def judge(run: Run) -> tuple[str, object, int | None]:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        log.write_text(render(run))
        _, verdict = measure_path(log, seed_recipe())
        gate = read_log(log)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                code: int | None = run_compare(log, FIXTURES / "miles-v0.1.0.log")
        except BadInput:
            code = None  # exit 2
        return verdict.status, (verdict, gate), code


@SETTINGS
@given(runs())
def test_never_reproduced_without_every_window_steps_evidence(run):
    status, _, _ = judge(run)
    if status == "reproduced":
        assert whole(run), run


@SETTINGS
@given(runs())
def test_never_failed_for_a_log_that_shows_no_failure(run):
    status, (verdict, _), _ = judge(run)
    if status == "failed":
        assert shows_failure(run), (run, verdict.reasons)


@SETTINGS
@given(runs())
def test_a_log_that_ends_in_a_failure_is_failed_naming_that_failure(run):
    """The failure that ended training is the last one printed, whatever came before it."""
    if not errs(run):
        return
    status, (verdict, _), _ = judge(run)
    assert status == "failed", (run, verdict.reasons)
    assert any(r.startswith("training stopped with") for r in verdict.reasons), verdict.reasons
    assert verdict.error is not None
    if run.error in ("oom", "illegal", "nccl", "killed"):  # the specific line, not the header
        assert "Traceback" not in verdict.error, verdict.error


@SETTINGS
@given(runs())
def test_measure_and_compare_agree_about_readability_and_conflicts(run):
    status, (verdict, gate), code = judge(run)
    assert (status == "unreadable") == (gate.unreadable is not None), verdict.reasons
    if status == "unreadable":
        assert code is None  # compare: exit 2, as measure
    one_value = [r for r in verdict.reasons if "two lines give" in r or "disagreeing" in r]
    assert bool(one_value) == bool(gate.conflicts), (verdict.reasons, gate.conflicts)
    if not gate.sound:
        assert code != 0  # compare never passes what the gate does not pass
        assert status not in ("reproduced", "slower", "faster", "unstable")


def test_the_model_is_drawn_widely_enough():
    # The strategies reach every shape and both sides of each invariant (not a vacuous test).
    seen: dict[str, set] = {"shape": set(), "status": set()}

    @settings(max_examples=60, deadline=None, database=None, derandomize=True)
    @given(runs())
    def probe(run):
        seen["shape"].add(run.shape)
        seen["status"].add(judge(run)[0])

    probe()
    assert seen["shape"] == {s.name for s in SHAPES}
    assert {"reproduced", "failed", "mismatch", "incomplete"} <= seen["status"]


def test_times_of_a_drawn_run_are_the_ones_rendered():
    run = Run(steps=3, times=[10.0, 11.0, 12.0])
    assert times_of(run) == [10.0, 11.0, 12.0]
