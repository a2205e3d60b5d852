"""A stage marker's time that is not a finite number is no time: the timeline keeps None.

The recipe's code prints into the same log as node.sh's markers, so a marker's `t=` is input
from the node like any other line (docs/architecture.md, "Numbers are finite").
"""

from __future__ import annotations

import pytest

from launcher.plan.protocol import parse_marker
from launcher.records.rundir import Timeline


@pytest.mark.parametrize("t", ["inf", "-inf", "nan", "Infinity", "1e999", "soon"])
def test_a_marker_time_that_is_not_finite_is_kept_as_unknown(t):
    timeline = Timeline()
    for line in (
        b"##reproduce stage=ray event=start t=100.5",
        f"##reproduce stage=train event=start t={t}".encode(),
        f"##reproduce stage=train event=end status=ok t={t}".encode(),
    ):
        marker = parse_marker(line)
        assert marker is not None
        timeline.on_marker(marker)
    ray, train = timeline.stages
    assert ray.start == 100.5
    assert train.name == "train" and train.start is None and train.end is None
    assert train.status == "ok"


def test_a_flood_of_stage_markers_keeps_the_timeline_bounded():
    """Any process of the node can print markers; 20,000 of them, each starting earlier than the
    one before (the worst case of the insertion in start order), keep MAX_STAGES stages and the
    real ones, and the ends of the dropped ones are dropped too (found 2026-12-04: a flood of
    4,000 took the launcher 209 s, the budget unchecked meanwhile)."""
    from launcher.records.rundir import MAX_STAGES

    timeline = Timeline()
    timeline.on_marker({"stage": "train", "event": "start", "t": "5000000"})
    for n in range(20_000):
        timeline.on_marker({"stage": f"x{n}", "event": "start", "t": str(4_000_000 - n)})
        timeline.on_marker({"stage": f"x{n}", "event": "end", "status": "ok", "t": "1"})
    timeline.on_marker({"stage": "train", "event": "end", "status": "ok", "t": "5000100"})
    assert len(timeline.stages) == MAX_STAGES
    train = next(s for s in timeline.stages if s.name == "train")
    assert train.end == 5000100.0 and train.status == "ok"


def test_timeline_writes_are_throttled_and_the_last_change_is_written():
    from launcher.runner.nodes import Throttled

    writes: list[int] = []
    throttled = Throttled(lambda: writes.append(1), every_s=3600)
    for _ in range(10_000):
        throttled.due(changed=True)
    assert writes == [1]  # the first at once, the rest wait for the interval
    throttled.last = float("-inf")  # the interval passed
    throttled.due()  # the follow loop: what changed since is written
    throttled.due()
    assert writes == [1, 1]
