"""Quoting what a node, a container or a tool printed inside one of our messages: bounded, always.

The promise: an error message, a hint or a status detail quotes at most `MAX_LINES` lines of
someone else's output, each at most `MAX_LINE_CHARS` characters (a longer line is cut in the
middle and says how much was left out), with control characters replaced (the bytes reach the
user's terminal). A log file is read from its last `TAIL_BYTES` only: a 96 MiB last line (issue 19)
costs 64 KiB of reading and a few hundred characters of message, never 100 million. Every excerpt
quoted in a message goes through `excerpt_lines` (text) or `log_tail` (a file).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MAX_LINES = 8
MAX_LINE_CHARS = 300
TAIL_BYTES = 64 * 1024
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clip(line: str, width: int = MAX_LINE_CHARS) -> str:
    """LINE without control characters, at most about WIDTH characters: the head and the tail
    kept (where an error usually says what it is and where it ended), the middle counted."""
    line = _CONTROL.sub("?", line)
    if len(line) <= width:
        return line
    keep = max(width - 40, 8)
    head, tail = line[: keep * 2 // 3], line[-(keep - keep * 2 // 3) :]
    return f"{head} [... {len(line) - len(head) - len(tail)} characters left out ...] {tail}"


def excerpt_lines(
    text: str | bytes | None,
    lines: int = MAX_LINES,
    width: int = MAX_LINE_CHARS,
    *,
    cut_before: bool = False,
) -> list[str]:
    """The last LINES lines of TEXT, each clipped to WIDTH. Only TEXT's end is looked at (a huge
    text is never split whole); a line whose start lies before what was looked at (or before
    TEXT, CUT_BEFORE) begins with "[...]"."""
    if text is None:
        return []
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    window = (lines + 1) * (width * 4 + 2)
    if len(text) > window:
        text, cut_before = text[-window:], True
    text = text.rstrip()
    if not text:
        return []
    split = text.splitlines()
    out = [clip(line, width) for line in split[-lines:]]
    if cut_before and len(split) <= lines:  # the first line shown is not whole
        out[0] = "[...] " + out[0]
    return out


def excerpt(
    text: str | bytes | None,
    lines: int = MAX_LINES,
    width: int = MAX_LINE_CHARS,
    sep: str = "\n",
) -> str:
    """excerpt_lines joined by SEP ("" when there is nothing)."""
    return sep.join(excerpt_lines(text, lines, width))


def log_tail(path: Path, lines: int = MAX_LINES, width: int = MAX_LINE_CHARS) -> list[str]:
    """The last lines of the file at PATH, read from its last TAIL_BYTES; [] when unreadable."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - TAIL_BYTES))
            data = fh.read(TAIL_BYTES)
    except OSError:
        return []
    return excerpt_lines(data, lines, width, cut_before=size > TAIL_BYTES)
