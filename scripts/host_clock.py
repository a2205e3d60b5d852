#!/usr/bin/env python3
"""Pass the training container's output on unchanged, with the host's clock written between lines.

Why: every step time the verdict reads is the container's own word (miles' perf/step_time and its
logging stamps), and a container can print step lines claiming fast steps at a slower real pace.
node.sh pipes the container's output through this program, on the host, where the container
cannot reach: before passing on a line that begins to arrive at least GAP seconds after the last
clock line, it writes

    ##reproduce clock t=<host epoch seconds.nanoseconds> n=<node.sh's nonce>

so every line of the log lies within GAP of the clock line before it (docs/measurement.md, "The
evidence gate": the host clock check). The nonce comes in this program's own environment
(REPRODUCE_CLOCK_NONCE, set on its command line by node.sh from a variable it never exports), so
the container, which never sees it, cannot print a clock line that counts.

What it promises:
- every byte read is written, in order, unchanged; a clock line is only ever inserted where a
  line begins (never inside a line), so a partial or binary line passes as it came;
- nothing is held back: each read is written before the next read, so it buffers at most one
  read (64 KiB), whatever the length of a line;
- t never goes backwards: the epoch at start plus the monotonic clock's progress since (a wall
  clock stepped back by NTP would otherwise let a later line seem earlier);
- TERM, INT and HUP are ignored: the cancel's TERM reaches the container through docker, whose
  last words (its stage's end marker) must still pass; the program ends when its input does
  (docker's output closed), never before. A broken output is not its concern: it then reads on
  to the end, so docker is never blocked by it, and exits 1.

Usage: host_clock.py [--gap SECONDS]   (python 3.8+, the standard library only; stdin -> stdout)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

PREFIX = b"##reproduce clock"
NONCE_ENV = "REPRODUCE_CLOCK_NONCE"
_READ = 1 << 16


class Clock:
    """Host epoch seconds that never go backwards: the epoch read once, then monotonic time."""

    def __init__(self) -> None:
        self._epoch_ns = time.time_ns()
        self._mono_ns = time.monotonic_ns()

    def now_ns(self) -> int:
        return self._epoch_ns + (time.monotonic_ns() - self._mono_ns)


def clock_line(t_ns: int, nonce: str) -> bytes:
    """The clock line for host time t_ns (the format launcher/judge/parse/clock.py reads)."""
    return PREFIX + b" t=%d.%09d n=%s\n" % (t_ns // 10**9, t_ns % 10**9, nonce.encode())


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def stamp(src: int, dst: int, nonce: str, gap_s: float, clock: Clock) -> int:
    """Copy src to dst until EOF, inserting a clock line before a line that begins to arrive
    gap_s or more after the last clock line. Returns the exit status (0, or 1: dst broke)."""
    gap_ns = int(gap_s * 1e9)
    last_ns: int | None = None
    at_line_start = True
    broken = False
    while True:
        try:
            data = os.read(src, _READ)
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue
        if not data:
            return 1 if broken else 0
        if broken:
            continue  # drain: docker must never block on a full pipe
        now = clock.now_ns()
        due = last_ns is None or now - last_ns >= gap_ns
        out = data
        if due:
            # The first place a line begins in this read: its start, or after its first newline.
            cut = 0 if at_line_start else data.find(b"\n") + 1
            if at_line_start or 0 < cut < len(data):
                out = data[:cut] + clock_line(now, nonce) + data[cut:]
                last_ns = now
        at_line_start = data.endswith(b"\n")
        try:
            _write_all(dst, out)
        except OSError:
            broken = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gap", type=float, default=0.5, help="seconds between clock lines, at least"
    )
    args = parser.parse_args(argv)
    nonce = os.environ.get(NONCE_ENV, "")
    if not (args.gap > 0) or not nonce or not all(c in "0123456789abcdef" for c in nonce):
        print(f"host_clock.py: needs --gap > 0 and a hex nonce in {NONCE_ENV}", file=sys.stderr)
        # the output must still pass: copy it unstamped rather than lose the run's log
        while True:
            data = os.read(0, _READ)
            if not data:
                return 2
            _write_all(1, data)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    return stamp(0, 1, nonce, args.gap, Clock())


if __name__ == "__main__":
    sys.exit(main())
