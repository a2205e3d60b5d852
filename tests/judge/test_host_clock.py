"""The host's clock against the claimed step times (docs/measurement.md, the evidence gate, check
6), played as the adversary: a container that prints its step lines at one pace and claims
another, and one that forges the host's clock lines.

- The property: over logs drawn from the model of a run (tests/support/log_shapes.py, `Run` with
  `clock`, `pace` and `forged`), the gate finds the host clock disagreeing exactly when the
  model's host span over the window and the claimed step times disagree beyond the tolerance
  (STEP_TIME_TOLERANCE plus the clock's resolution at both ends), and such a run is never passed.
- Forged clock lines (no nonce, another nonce, one inside a line, one going back in time) never
  count, whatever they say; a log read without the run's nonce has no host clock.
- The file reader's fast path and the line reader read the host's clock alike.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.log_shapes import (
    FORGERIES,
    HOST_START,
    NONCE,
    Run,
    clock_line,
    host_times,
    render,
    times_of,
)
from support.measure import seed_recipe
from support.properties import PASSING, examples

from launcher.judge.evidence import NO_HOST_CLOCK, STEP_TIME_TOLERANCE
from launcher.judge.measure import measure
from launcher.judge.parse.clock import CLOCK, CLOCK_GAP_S, HostClock
from launcher.judge.parse.miles import parse_lines
from launcher.judge.parse.reader import iter_file_lines
from launcher.judge.parse.records import ParseStats
from launcher.judge.verdict import judge
from launcher.plan.protocol import MARKER
from launcher.results.evaluate import parse_log

WINDOW = (5, 19)
SETTINGS = examples(40)


def judged(run: Run, nonce: str | None = NONCE):
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        log.write_text(render(run))
        records, stats = parse_log(log, nonce)
    result = measure(records, seed_recipe(), parse_stats=stats)
    return result, judge(result, seed_recipe()), stats


def model_disagrees(run: Run) -> bool:
    """The model's own answer: the host's span over the window against the claimed times."""
    first, last = WINDOW
    host = host_times(run)
    span = host[last] - host[first]
    claimed = sum(times_of(run)[first + 1 : last + 1])
    return abs(span - claimed) > STEP_TIME_TOLERANCE * claimed + 2 * CLOCK_GAP_S


@st.composite
def paced_runs(draw: st.DrawFn) -> Run:
    """A whole run in any shape whose lines reach the host at a pace of its own: the claimed one,
    one slower or faster by a factor (near the tolerance's edges too), or each step its own; the
    container forging the host's clock lines or not."""
    run = Run(
        shape=draw(st.sampled_from(["miles-v0.1.0", "step-time-logging", "step-time-print"])),
        clock=True,
        times=draw(st.lists(st.floats(5.0, 40.0), min_size=20, max_size=20)),
        forged=draw(st.none() | st.sampled_from(FORGERIES)),
    )
    claimed = [t + (40.0 if s == 0 else 0.0) for s, t in enumerate(run.times)]
    how = draw(st.sampled_from(["claimed", "factor", "each"]))
    if how == "factor":
        edge = st.sampled_from([0.9, 0.94, 0.96, 1.04, 1.06, 1.1])
        factor = draw(st.floats(0.2, 3.0) | edge)
        run.pace = [t * factor for t in claimed]
    elif how == "each":
        run.pace = draw(st.lists(st.floats(0.6, 60.0), min_size=20, max_size=20))
    return run


@SETTINGS
@given(paced_runs())
def test_the_gate_fails_exactly_when_the_host_and_the_claims_disagree(run):
    result, verdict, stats = judged(run)
    found = [d for d in result.evidence.disagreements if d.check == "host clock"]
    assert bool(found) == model_disagrees(run), (run, result.evidence.cross)
    assert any(c.startswith("the host's clock:") for c in result.evidence.checked)
    assert stats.clock_lines >= 20 and NO_HOST_CLOCK not in result.evidence.not_checked
    if run.forged:  # every forgery at a line's start seen, none counted (inside a line: a line)
        assert stats.clock_refused == (0 if run.forged == "mid-line" else 20)
    if found:
        assert verdict.status == "mismatch" and verdict.status not in PASSING
        assert verdict.difference_percent is None
        (d,) = found
        assert f"{d.recipe:.3f}" in d.detail and f"{d.evidence:.3f}" in d.detail  # both numbers
    else:
        assert verdict.status == "reproduced" or verdict.status in PASSING, verdict.reasons


def test_a_container_that_claims_fast_steps_at_a_slow_pace_is_a_mismatch_naming_both():
    run = Run(clock=True)
    run.pace = [
        t * 1.5 for t in [t + (40.0 if s == 0 else 0.0) for s, t in enumerate(times_of(run))]
    ]
    result, verdict, _ = judged(run)
    assert verdict.status == "mismatch", verdict.reasons
    text = "\n".join(verdict.reasons)
    assert "host clock: steps 5 to 19 arrived" in text and "perf/step_time adds up to" in text
    claimed = sum(times_of(run)[6:20])
    assert result.evidence.cross["host_clock_claimed_s"] == pytest.approx(claimed)
    assert result.evidence.cross["host_clock_span_s"] == pytest.approx(1.5 * claimed, rel=1e-6)


def test_the_same_run_at_its_claimed_pace_passes_the_check():
    result, verdict, _ = judged(Run(clock=True))
    assert verdict.status == "reproduced", verdict.reasons
    assert not [d for d in result.evidence.disagreements if d.check == "host clock"]


@pytest.mark.parametrize("forged", FORGERIES)
def test_forged_clock_lines_never_count_even_where_they_tell_the_claimed_story(forged):
    """The container prints clock lines that match its claims; the host's say 1.5x slower."""
    run = Run(clock=True, forged=forged)
    run.pace = [1.5 * (t + (40.0 if s == 0 else 0.0)) for s, t in enumerate(times_of(run))]
    result, verdict, stats = judged(run)
    assert stats.clock_refused == (0 if forged == "mid-line" else run.steps)
    assert verdict.status == "mismatch"
    if forged == "backwards":  # it carries the nonce: only the host's line before betrays it
        return
    # and without the host's: the forgeries alone are no clock at all
    alone = Run(forged=forged)
    result, verdict, stats = judged(alone)
    assert stats.clock_lines == 0 and NO_HOST_CLOCK in result.evidence.not_checked
    assert verdict.status == "reproduced"


def test_a_log_read_without_its_runs_nonce_has_no_host_clock():
    """A log measured apart from its run directory (`measure FILE`), or a run of an older
    launcher: its clock lines are not known to be the host's."""
    run = Run(clock=True)
    run.pace = [2 * t for t in times_of(run)]  # would disagree, if the clock were known
    result, verdict, stats = judged(run, nonce=None)
    assert stats.clock_lines == 0 and stats.clock_refused > 0
    assert NO_HOST_CLOCK in result.evidence.not_checked
    assert f"not checked: {NO_HOST_CLOCK}" in verdict.reasons and verdict.status == "reproduced"


@pytest.mark.parametrize(
    "line",
    [
        clock_line(HOST_START + 10, None),
        clock_line(HOST_START + 10, "f" * 32),
        clock_line(HOST_START + 10) + " ",  # a word more
        " " + clock_line(HOST_START + 10),  # not at the line's start
        "x" + clock_line(HOST_START + 10),
        clock_line(HOST_START + 10).replace(" n=", "  n="),
        clock_line(HOST_START + 10).upper().replace("##REPRODUCE CLOCK", "##reproduce clock"),
        clock_line(HOST_START + 10) + "\r",
        f"{CLOCK}t=1e9 n={NONCE}",
        f"{CLOCK}t={'9' * 40}.000000000 n={NONCE}",
        clock_line(HOST_START - 1),  # before the last one: backwards
    ],
)
def test_a_clock_line_counts_only_whole_with_the_nonce_and_never_going_back(line):
    clock = HostClock(NONCE)
    clock.line(clock_line(HOST_START))
    clock.line(line)
    assert (clock.lines, clock.refused, clock.t) == (1, 1, pytest.approx(HOST_START))


def test_the_clock_line_is_a_line_of_the_node_protocol():
    assert CLOCK == f"{MARKER} clock "


@pytest.mark.parametrize("forged", [None, *FORGERIES])
def test_the_fast_path_and_the_line_reader_read_the_clock_alike(tmp_path, forged):
    run = Run(clock=True, forged=forged, noise=1)
    run.pace = [0.3 if s % 3 else 25.0 for s in range(run.steps)]  # some steps under the gap
    log = tmp_path / "train.log"
    log.write_text(render(run))
    fast_stats, slow_stats = ParseStats(), ParseStats()
    fast, _ = parse_log(log, NONCE)
    fast_stats = parse_log(log, NONCE)[1]
    slow = list(parse_lines(iter_file_lines(log), slow_stats, NONCE))
    assert [r.to_dict() for r in fast] == [r.to_dict() for r in slow]
    assert fast_stats.to_dict() == slow_stats.to_dict()
    arrived = [r.arrived for r in fast]
    assert all(a is not None for a in arrived) and arrived == sorted(arrived)
    host = host_times(run)
    assert all(h - CLOCK_GAP_S < a <= h + 1e-6 for a, h in zip(arrived, host, strict=True))


def test_the_paced_runs_are_drawn_on_both_sides():
    seen: set[bool] = set()

    @settings(max_examples=40, deadline=None, database=None, derandomize=True)
    @given(paced_runs())
    def probe(run):
        seen.add(model_disagrees(run))

    probe()
    assert seen == {True, False}
