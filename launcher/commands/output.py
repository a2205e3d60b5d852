"""The commands' one door for their text output (docs/architecture.md, "Its text, shown"), and the
few pieces every command's body shares: the error and its exit code, whether a person is at the
terminal, and the y/N question.

Why a module of its own: every command module imports it, so it imports nothing of theirs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import typer

from launcher.errors import ReproduceError
from launcher.excerpt import printable

Say = Callable[[str], Any]


def say(text: str = "", *, err: bool = False, end: str = "\n") -> None:
    """One piece of a command's text output (stdout, or stderr with ERR), made printable
    (launcher/excerpt.py): the commands that show what a run left (measure, compare, history,
    runs, status, nightly) print a log's lines, a run's detail and reasons, arguments a log
    printed, read from files anyone could have written; an ESC or a bidi override in them must not
    reach the terminal as itself. Line breaks are the text's structure and pass. JSON needs no
    such door: json.dumps writes every control character as its escape."""
    print(printable(text, keep="\n"), end=end, file=sys.stderr if err else sys.stdout)


def fail(err: ReproduceError, json_out: bool = False) -> typer.Exit:
    """The error on stderr; with --json also one JSON object on stdout (its `error` field), so a
    script reading stdout always gets an object."""
    try:
        if json_out:
            print(error_object(err, err.exit_code), flush=True)
        # the message may quote the node, a log or a stranger's bundle: shown printable
        text = printable(f"error: {err}" if err.exit_code else str(err), keep="\n")
        print(text, file=sys.stderr)
    except OSError:  # the terminal is gone (SIGHUP, EIO): the exit code still tells
        pass
    return typer.Exit(err.exit_code)


def error_object(err: object, exit_code: int) -> str:
    """The one JSON object a `--json` command prints when it fails."""
    return json.dumps({"error": str(err), "exit_code": exit_code})


def has_terminal() -> bool:
    """Someone at a terminal who could reattach to a run the launcher lost (stdin and stderr)."""
    try:
        return bool(sys.stdin and sys.stdin.isatty() and sys.stderr and sys.stderr.isatty())
    except (OSError, ValueError):
        return False


def ask(question: str) -> bool:
    """y/yes goes on (buys, ends); anything else, an end of input or Ctrl-C is a no (the
    launch's rule)."""
    try:
        sys.stderr.write(question)
        sys.stderr.flush()
        return sys.stdin.readline().strip().lower() in ("y", "yes")
    except (KeyboardInterrupt, OSError):
        return False
