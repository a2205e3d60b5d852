"""The commands' one door for their text output (docs/architecture.md, "Its text, shown").

Why a module of its own: every command body prints through it, and the CLI's declarations
(cli_ops.py) import those bodies, so it imports nothing of the commands' own.
"""

from __future__ import annotations

import sys

from launcher.excerpt import printable


def say(text: str = "", *, err: bool = False, end: str = "\n") -> None:
    """One piece of a command's text output (stdout, or stderr with ERR), made printable
    (launcher/excerpt.py): the commands that show what a run left (measure, compare, history,
    runs, status, nightly) print a log's lines, a run's detail and reasons, arguments a log
    printed, read from files anyone could have written; an ESC or a bidi override in them must not
    reach the terminal as itself. Line breaks are the text's structure and pass. JSON needs no
    such door: json.dumps writes every control character as its escape."""
    print(printable(text, keep="\n"), end=end, file=sys.stderr if err else sys.stdout)
