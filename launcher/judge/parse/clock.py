"""The host's clock in a log: the lines scripts/host_clock.py writes between the training
container's lines, read back, and which of them count.

Why: every step time the verdict reads otherwise comes from the container (miles' perf/step_time
and its logging stamps), which can print step lines claiming fast steps at a slower real pace.
On the node, node.sh pipes the container's output through host_clock.py, which writes

    ##reproduce clock t=<host epoch seconds.nanoseconds> n=<node.sh's nonce>

before a line that begins to arrive CLOCK_GAP_S or more after the last clock line. So each line
of the log began to arrive within CLOCK_GAP_S after the last clock line before it (its arrival
bound, StepRecord.arrived), and the evidence gate holds the claimed step times to the host's
spans (launcher/judge/evidence.py, check 6; docs/measurement.md).

A clock line counts only when it carries the run's nonce (the one node.sh prints first in
node.log and never gives the container: launcher/plan/protocol.py, MarkerGate), stands alone on
its line, is exactly the form above, and does not go back in time; anything else that looks like
one (the container's forgery, an older log, one embedded in another line) is counted, never
used. A log read without a nonce (a file given to `measure`, a run of an older launcher) has no
host clock. Pure: no I/O.
"""

from __future__ import annotations

import re

# The clock line's first words: the node protocol's MARKER (launcher/plan/protocol.py) and
# `clock` (tests/judge/test_host_clock.py holds the two equal).
CLOCK = "##reproduce clock "
CLOCK_BYTES = CLOCK.encode()
# host_clock.py writes a clock line before any line that begins this long or longer after the
# last one (node.sh passes it as --gap): the resolution of each arrival bound.
CLOCK_GAP_S = 0.5
_LINE = re.compile(r"##reproduce clock t=([0-9]{1,12})\.([0-9]{9}) n=([0-9a-f]{32})\n?")


class HostClock:
    """The clock lines of one log, in the order the parser meets them: `t` is the last trusted
    one's host time (None before the first)."""

    __slots__ = ("nonce", "t", "lines", "refused")

    def __init__(self, nonce: str | None) -> None:
        self.nonce = nonce
        self.t: float | None = None
        self.lines = 0  # clock lines that counted
        self.refused = 0  # lines that began like one and did not count

    def line(self, text: str) -> None:
        """One log line that begins with CLOCK (with or without its newline)."""
        m = _LINE.fullmatch(text)
        if m is None or self.nonce is None or m.group(3) != self.nonce:
            self.refused += 1
            return
        t = int(m.group(1)) + int(m.group(2)) / 1e9
        if self.t is not None and t < self.t:  # the host's clock never goes back (host_clock.py)
            self.refused += 1
            return
        self.t = t
        self.lines += 1
