"""Quoting what a node, a container or a tool printed inside one of our messages: bounded, always.

The promise: an error message, a hint or a status detail quotes at most `MAX_LINES` lines of
someone else's output, each at most `MAX_LINE_CHARS` characters (a longer line is cut in the
middle and says how much was left out), with control characters replaced (the bytes reach the
user's terminal). A log file is read from its last `TAIL_BYTES` only: a 96 MiB last line
costs 64 KiB of reading and a few hundred characters of message, never 100 million. Every excerpt
quoted in a message goes through `excerpt_lines` (text) or `log_tail` (a file).

And one rule for every character of someone else's text that reaches a person: `printable`. An
ESC starts a terminal's control sequence (it can retitle the window, move the cursor, hide what
follows), a NUL or a C1 byte is read by some terminals as one, and a bidi override (U+202E) turns
the rest of a line around in a terminal and in a page alike, so a log line or a report field
could show something other than what it says. Each such character is shown as its escape
(`\x1b`, `\u202e`) instead: the person sees that it was there and what it was. The pages'
`esc` (launcher/pages/html.py), `clip` here, the parser's quoted lines and the CLI's messages and
tables use it; tests/pages/test_printable.py runs every such character through a run's pages and
its terminal output.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import BinaryIO

MAX_LINES = 8
MAX_LINE_CHARS = 300
TAIL_BYTES = 64 * 1024


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, keep: str = "") -> str:
    """TEXT with every character that is not printable shown as its escape: C0 and C1 controls,
    DEL, the bidi controls and every other format character (U+202A-U+202E, U+2066-U+2069,
    U+200E...), line and paragraph separators, lone surrogates (str.isprintable's rule: Unicode's
    "Other" and "Separator" classes but the space). KEEP names those let through as they are
    ("\n" for text shown as several lines)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else _escape(c) for c in text)


def clip(line: str, width: int = MAX_LINE_CHARS) -> str:
    """LINE made printable, at most about WIDTH characters: the head and the tail kept (where an
    error usually says what it is and where it ended), the middle counted."""
    line = printable(line)
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


class NotRegular(OSError):
    """A path that is there but is no regular file (a FIFO, a device, a directory, a link)."""


def open_regular(path: Path, *, follow: bool = False) -> BinaryIO:
    """PATH opened for reading in chunks, when it is a regular file: the open never blocks (a
    FIFO would wait for a writer for ever), the check is made on the open descriptor (a path
    swapped after a check cannot slip through), and with FOLLOW=False never through a symlink
    (a file of a directory someone else wrote). OSError otherwise (FileNotFoundError when it is
    missing, NotRegular when it is something else). The one open of a stream someone else
    wrote: a log of the run directory or the node, a file of a bundle."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | (0 if follow else os.O_NOFOLLOW))
    except OSError as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise NotRegular(err.errno, f"not a regular file ({err.strerror})", str(path)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(0, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def sha256_of(path: Path, *, follow: bool = False) -> str:
    """The sha256 of a regular file, read in chunks (a log may be gigabytes); OSError as
    open_regular."""
    digest = hashlib.sha256()
    with open_regular(path, follow=follow) as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def log_tail(path: Path, lines: int = MAX_LINES, width: int = MAX_LINE_CHARS) -> list[str]:
    """The last lines of the file at PATH, read from its last TAIL_BYTES; [] when unreadable."""
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - TAIL_BYTES))
            data = fh.read(TAIL_BYTES)
    except OSError:
        return []
    return excerpt_lines(data, lines, width, cut_before=size > TAIL_BYTES)
