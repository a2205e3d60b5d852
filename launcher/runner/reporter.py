"""How the runner tells whoever started it what is happening, without printing anything itself.

The command layer (launcher/commands/run.py) passes a Reporter that renders these events on the
console; tests and unattended callers pass nothing and get `QuietReporter`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from launcher.cost.costgate import CostGate
    from launcher.plan.protocol import Progress

INTERRUPT_CHOICES = ("ask", "cancel", "detach")


class Reporter(Protocol):
    """Events of one run, in the order they happen."""

    def say(self, text: str) -> None:
        """A progress line: acquiring, started, reconnecting, cancelling, the verdict, ..."""

    def stage(self, name: str, event: str, status: str) -> None:
        """A stage of the node script started (`event` "start") or ended with `status`."""

    def step(self, done: int, total: int | None) -> None:
        """Training reached `done` optimizer steps (of `total`, when the recipe says)."""

    def step_time(self, step: int, seconds: float) -> None:
        """miles measured optimizer step `step` (0-based) at `seconds`: the current speed."""

    def progress(self, progress: Progress) -> None:
        """A long stage's transfer moved on (a node's `##reproduce progress` line)."""

    def cost(self, gate: CostGate) -> None:
        """Before anything is paid for: the plan's header, its cost and its worst case."""

    def confirm(self, question: str) -> bool:
        """Ask the person at the terminal a yes/no question; False when nobody can answer."""

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

    def step_time(self, step: int, seconds: float) -> None:
        return None

    def progress(self, progress: Progress) -> None:
        return None

    def cost(self, gate: CostGate) -> None:
        return None

    def confirm(self, question: str) -> bool:
        return False

    def warn(self, text: str) -> None:
        return None

    def choose(self) -> str:
        return "cancel"


class FailSafeReporter:
    """Another reporter whose failures are dropped: a report is never worth a failed cancel.

    After SIGHUP (the terminal closed) every write to it raises EIO; the cancel and the release
    that follow must still run to the end, and a question that cannot be asked is answered
    "cancel" (after Ctrl-C) or "no" (the cost gate). A reporter written before an event existed
    (a test's, another tool's) simply does not get it.
    """

    def __init__(self, inner: Reporter) -> None:
        self.inner = inner

    def _call(self, name: str, *args: object) -> Any:
        method: Callable[..., Any] | None = getattr(self.inner, name, None)
        if method is None:
            return None
        try:
            return method(*args)
        except (OSError, ValueError):  # EIO/EPIPE on a closed terminal, a closed file
            return None

    def say(self, text: str) -> None:
        self._call("say", text)

    def stage(self, name: str, event: str, status: str) -> None:
        self._call("stage", name, event, status)

    def step(self, done: int, total: int | None) -> None:
        self._call("step", done, total)

    def step_time(self, step: int, seconds: float) -> None:
        self._call("step_time", step, seconds)

    def progress(self, progress: Progress) -> None:
        self._call("progress", progress)

    def cost(self, gate: CostGate) -> None:
        self._call("cost", gate)

    def confirm(self, question: str) -> bool:
        return self._call("confirm", question) is True

    def warn(self, text: str) -> None:
        self._call("warn", text)

    def choose(self) -> str:
        answer = self._call("choose")
        return answer if isinstance(answer, str) else "cancel"
