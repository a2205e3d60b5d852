"""`reproduce cancel RUN`: stop a run on its node and release what it acquired."""

from __future__ import annotations

from pathlib import Path

import typer

from launcher.commands import options as o
from launcher.commands.output import fail
from launcher.errors import ReproduceError


def cancel_cmd(
    run: o.RunArg,
    runs_dir: o.RunsDir = None,
) -> None:
    """Stop a run on its node: its processes and its container (with Ray inside); nothing else."""
    try:
        code = cancel_command(run, runs_dir)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def cancel_command(run: str, runs_dir: Path | None) -> int:
    """Stop a run on its node and release what it acquired."""
    from launcher.commands.console import ConsoleReporter
    from launcher.runner.runner import Runner

    Runner(ConsoleReporter()).cancel(run, runs_dir)
    return 0
