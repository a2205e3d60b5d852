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
    assert ray["start"] == 100.5
    assert train["name"] == "train" and train["start"] is None and train["end"] is None
    assert train["status"] == "ok"
