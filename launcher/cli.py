"""The `reproduce` command line. Thin: parse arguments, call one function, map errors to exit codes.

Heavy libraries (boto3, paramiko, ray, matplotlib) are imported inside the commands that use
them, so `reproduce ... --dry-run` starts fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from launcher.errors import ReproduceError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Reproduce a published GPU training recipe and judge whether its numbers hold.",
    pretty_exceptions_enable=False,
)


def _fail(err: ReproduceError) -> "typer.Exit":
    print(f"error: {err}", file=sys.stderr)
    return typer.Exit(err.exit_code)


# --- commands are added below; keep each body a call into a module, imports lazy ---


def main() -> None:
    """Console entry point: one clear paragraph and the documented exit code on any known failure."""
    try:
        app()
    except ReproduceError as err:  # raised outside a command body (rare)
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
