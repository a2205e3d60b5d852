"""`reproduce ssh RUN [-- COMMAND]`: a shell on a node the run holds, by its pinned host key."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import typer

from launcher.commands import options as o
from launcher.commands.output import fail
from launcher.errors import BadInput, ReproduceError


def ssh_cmd(
    run: o.RunArg,
    command: list[str] | None = typer.Argument(
        None, help="A command to run there instead of a shell (after --)."
    ),
    node: o.Node = 0,
    runs_dir: o.RunsDir = None,
) -> None:
    """A shell (or `-- COMMAND`) on a node the run holds, trusting only the host key the run pinned."""  # noqa: E501 - typer shows its line breaks

    try:
        code = ssh_command(run, runs_dir, node=node, remote=command)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def ssh_command(
    ref: str, runs_dir: Path | None, *, node: int = 0, remote: list[str] | None = None
) -> int:
    """Replace this process with ssh to node K of the run (its pinned host key only)."""
    from launcher.records.rundir import RunDir
    from launcher.runner import runshell

    rd = RunDir.find(ref, runs_dir)
    argv = runshell.shell_argv(rd, node, list(remote or []))
    if shutil.which(argv[0]) is None:
        raise BadInput(f"`reproduce ssh` runs {argv[0]} here, which is not installed.")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)  # noqa: S606 - the system ssh, its argv built here: no shell
    return 0  # not reached: exec replaced the process
