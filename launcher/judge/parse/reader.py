"""The file reader: a miles log parsed straight from its file, at the speed of reading it.

Why a reader of its own: `measure`, `verify` and the run's verdict parse whole logs (gigabytes for
a long run), and a log where nearly every line is a metric line is the worst case. The reader
reads 4 MiB binary chunks, finds the lines that matter with `bytes.find` (C speed; the rare
shapes, a dict without a marker, an arguments listing and failure lines, by one cached position
per needle) and hands each marker line to the parser's fast path (MilesLogParser.fast: bytes,
payload templates), decoding only the lines it declines for the line-by-line reader
(MilesLogParser.candidate, the reference). Same records and counters as
parse_lines(iter_file_lines(path)) on every log (tests/judge/test_parse_equivalence.py); memory is
one chunk plus the pending records, whatever the file's size (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from launcher.judge.parse.clock import CLOCK_BYTES
from launcher.judge.parse.lines import ARGS_BEGIN, BARE, REPEATED_BYTES_RE, wanted
from launcher.judge.parse.miles import (
    FIRST_LINES,
    MilesLogParser,
    count_repeated,
    note_first,
)
from launcher.judge.parse.records import ParseResult, ParseStats, StepRecord
from launcher.judge.parse.shapes import SignalScan

_CHUNK = 4 << 20  # bytes read at a time by parse_path
_MAX_LINE = 64 << 20  # a "line" longer than this (binary garbage, no newline) is dropped, counted
_UNMARKED, _LISTING = BARE.encode(), ARGS_BEGIN.encode()


def iter_file_lines(path: Path) -> Iterator[str]:
    """Lines of a log file as text, split at `\\n` only (as parse_path splits them: a lone `\\r`,
    a progress bar's redraw, stays inside its line); undecodable bytes become U+FFFD."""
    with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
        yield from fh


def parse_path(
    path: str | Path, stats: ParseStats | None = None, nonce: str | None = None
) -> Iterator[StepRecord]:
    """parse_lines for a file, faster: read in 4 MiB binary chunks, find the candidates with
    bytes.find (C speed) and decode only their lines (and those of an open dict or listing).
    Same records and counters as parse_lines(iter_file_lines(path), nonce=nonce) for
    `\\n`-separated logs; memory is one chunk plus the pending records, whatever the file's size.
    `nonce`: the run's, whose host clock lines count (launcher/judge/parse/clock.py).
    """
    parser = MilesLogParser(stats, nonce)
    stats = parser.stats
    candidate, continuation, fast = parser.candidate, parser.continuation, parser.fast
    lines = noted = 0
    carry = b""
    with open(path, "rb") as fh:
        while True:
            data = fh.read(_CHUNK)
            if not data:
                break
            buf = carry + data if carry else data
            # Hold back the last line (complete or not): only at EOF is it known to be the last.
            cut = buf.rfind(b"\n", 0, len(buf) - 1) + 1
            if cut == 0:
                carry = buf
                if len(carry) > _MAX_LINE:
                    lines += 1
                    stats.unparseable += b": {" in carry
                    carry = b""
                continue
            carry = buf[cut:]  # `buf` itself is searched up to `cut`: no copy of the chunk
            if noted < FIRST_LINES:
                head = buf[:cut].split(b"\n", FIRST_LINES - noted)[: FIRST_LINES - noted]
                head = head[: buf.count(b"\n", 0, cut)]
                noted += len(head)
                note_first(stats, (h.decode("utf-8", "replace") for h in head))
            lines += buf.count(b"\n", 0, cut)
            if buf.find(b"across cluster]", 0, cut) >= 0:
                for rep in REPEATED_BYTES_RE.finditer(buf, 0, cut):
                    stats.repeated += 1
                    stats.repeated_collapsed += int(rep.group(1))
            find, rfind = buf.find, buf.rfind
            # Next position of `: {` (a marker has a digit before it), of a dict logged without
            # a marker, of an arguments listing and of the host's clock; `cut` when there is none
            # left in the chunk.
            pos, unmarked, listing, clock = 0, -1, -1, -1
            signals = SignalScan(buf, cut)
            while True:
                while parser.busy and pos < cut:  # lines of an open dict or listing
                    end = find(b"\n", pos, cut)
                    released = continuation(buf[pos:end].decode("utf-8", "replace"))
                    if released:
                        yield from released
                    pos = end + 1
                if unmarked < pos:
                    unmarked = find(_UNMARKED, pos, cut)
                    unmarked = unmarked if unmarked >= 0 else cut
                if listing < pos:
                    listing = find(_LISTING, pos, cut)
                    listing = listing if listing >= 0 else cut
                if clock < pos:
                    clock = find(CLOCK_BYTES, pos, cut)
                    clock = clock if clock >= 0 else cut
                rare = min(unmarked, listing, signals.after(pos), clock)
                # The hot loop: marker candidates (`: {` after a digit) before the next rare one.
                colon = find(b": {", pos, rare)
                while colon >= 0:
                    if 48 <= buf[colon - 1] <= 57:
                        end = find(b"\n", colon, cut)
                        raw = buf[rfind(b"\n", 0, colon) + 1 : end]
                        quick = fast(raw)
                        released = (
                            quick
                            if quick is not None
                            else candidate(raw.decode("utf-8", "replace"))
                        )
                        if released:
                            yield from released
                        pos = end + 1
                        if parser.busy or pos > rare:
                            break
                        colon = find(b": {", pos, rare)
                    else:
                        colon = find(b": {", colon + 3, rare)
                else:  # no marker candidate left before `rare`
                    if rare >= cut:
                        break
                    end = find(b"\n", rare, cut)
                    text = buf[rfind(b"\n", 0, rare) + 1 : end].decode("utf-8", "replace")
                    if wanted(text):
                        released = candidate(text)
                        if released:
                            yield from released
                    else:  # as parse_lines: the host's clock, or a failure line
                        parser.other(text)
                    pos = end + 1
    if carry:
        lines += 1
        text = carry.decode("utf-8", "replace")
        if noted < FIRST_LINES:
            note_first(stats, [text])
        if b"across cluster]" in carry:
            count_repeated(stats, text)
        if parser.busy:
            yield from continuation(text, last=True)
        elif wanted(text):
            yield from candidate(text, last=True)
        else:
            parser.other(text)
    stats.lines += lines
    yield from parser.finish()


def parse_file(path: str | Path, nonce: str | None = None) -> ParseResult:
    """Parse a whole log file (streamed; only the per-step records are kept)."""
    stats = ParseStats()
    records = list(parse_path(Path(path), stats, nonce))
    return ParseResult(records=records, stats=stats)
