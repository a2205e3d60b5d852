"""`reproduce attach RUN`: follow a run in progress again, to its end and its verdict."""

from __future__ import annotations

from pathlib import Path

import typer

from launcher.commands import options as o
from launcher.commands.output import fail, has_terminal
from launcher.errors import BadInput, ReproduceError


def attach_cmd(
    run: o.RunArg,
    runs_dir: o.RunsDir = None,
    on_interrupt: o.Interrupt = o.OnInterrupt.ask,
) -> None:
    """Reattach to a run in progress: continue collecting its log where it stopped, then measure."""
    try:
        code = attach_command(run, runs_dir, on_interrupt.value)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def attach_command(run: str, runs_dir: Path | None, on_interrupt: str) -> int:
    """Follow a run in progress again to its end; the exit code a run ending so would have had."""
    from launcher.commands.console import ConsoleReporter
    from launcher.records.rundir import RunDir
    from launcher.runner.outcome import exit_code_of
    from launcher.runner.runner import Runner

    console = ConsoleReporter()
    try:  # the cost so far counts from the run's acquisition, at its recorded price
        rd = RunDir.find(run, runs_dir)
        console.resume(rd.record(), rd.timeline().acquired_at)
    except BadInput:
        pass  # attach itself says what is wrong with the reference
    runner = Runner(console, on_interrupt=on_interrupt, unattended=not has_terminal())
    try:
        return exit_code_of(runner.attach(run, runs_dir))
    finally:
        console.close()
