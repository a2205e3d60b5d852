"""The runner's follower over any execution, and a reporter that keeps what the console is told:
for tests that drive the real log reading (tests/runner/)."""

from __future__ import annotations

from pathlib import Path

from launcher.plan.protocol import Progress
from launcher.records.rundir import Timeline
from launcher.runner.reporter import QuietReporter
from launcher.runner.stream import Follower


class Seen(QuietReporter):
    """What the console is told: the steps, their speeds, the progress lines."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.speeds: list[tuple[int, float]] = []
        self.progress_seen: list[Progress] = []

    def step(self, done: int, total: int | None) -> None:
        self.steps.append(done)

    def step_time(self, step: int, seconds: float) -> None:
        self.speeds.append((step, seconds))

    def progress(self, progress: Progress) -> None:
        self.progress_seen.append(progress)


def follower(execution: object, logs: Path, reporter: Seen | None = None) -> Follower:
    return Follower(
        execution,  # type: ignore[arg-type]
        logs,
        timeline=Timeline(),
        reporter=reporter or Seen(),
        poll_s=0.01,
        reconnect_s=5,
    )
