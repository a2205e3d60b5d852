"""How the runner tells whoever started it what is happening, without printing anything itself.

The command layer (launcher/commands/run.py) passes a Reporter that renders these events on the
console; tests and unattended callers pass nothing and get `QuietReporter`.
"""

from __future__ import annotations

from typing import Protocol

INTERRUPT_CHOICES = ("ask", "cancel", "detach")


class Reporter(Protocol):
    """Events of one run, in the order they happen."""

    def say(self, text: str) -> None:
        """A progress line: acquiring, started, reconnecting, cancelling, the verdict, ..."""

    def stage(self, name: str, event: str, status: str) -> None:
        """A stage of the node script started (`event` "start") or ended with `status`."""

    def step(self, done: int, total: int | None) -> None:
        """Training reached `done` optimizer steps (of `total`, when the recipe says)."""

    def warn(self, text: str) -> None:
        """Something the user must see even when nothing else is shown (teardown in progress)."""

    def choose(self) -> str:
        """After Ctrl-C with --on-interrupt ask: "cancel" or "detach" (ask the user if one can)."""


class QuietReporter:
    """Shows nothing; an interrupt cancels (there is nobody to ask)."""

    def say(self, text: str) -> None:
        return None

    def stage(self, name: str, event: str, status: str) -> None:
        return None

    def step(self, done: int, total: int | None) -> None:
        return None

    def warn(self, text: str) -> None:
        return None

    def choose(self) -> str:
        return "cancel"


class FailSafeReporter:
    """Another reporter whose failures are dropped: a report is never worth a failed cancel.

    After SIGHUP (the terminal closed) every write to it raises EIO; the cancel and the release
    that follow must still run to the end, and a question that cannot be asked is answered
    "cancel".
    """

    def __init__(self, inner: Reporter) -> None:
        self.inner = inner

    def say(self, text: str) -> None:
        try:
            self.inner.say(text)
        except (OSError, ValueError):  # EIO/EPIPE on a closed terminal, a closed file
            return

    def stage(self, name: str, event: str, status: str) -> None:
        try:
            self.inner.stage(name, event, status)
        except (OSError, ValueError):
            return

    def step(self, done: int, total: int | None) -> None:
        try:
            self.inner.step(done, total)
        except (OSError, ValueError):
            return

    def warn(self, text: str) -> None:
        try:
            self.inner.warn(text)
        except (OSError, ValueError):
            return

    def choose(self) -> str:
        try:
            return self.inner.choose()
        except (OSError, ValueError):
            return "cancel"
