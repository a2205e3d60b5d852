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


# --- measurement, verdict and report (issue 3): `measure`, `compare` ---


@app.command("measure")
def measure_cmd(
    log: Path = typer.Argument(..., help="miles log file, or a run directory (its artifacts are written)"),
    recipe: Path = typer.Option(..., "--recipe", help="the recipe whose claim is judged"),
    json_out: bool = typer.Option(False, "--json", help="print exactly one JSON object on stdout"),
    price_per_hour: Optional[float] = typer.Option(None, "--price-per-hour", help="override the $/h price"),
    region: Optional[str] = typer.Option(None, "--region", help="price region (default us-east-1)"),
    timeline: Optional[Path] = typer.Option(None, "--timeline", help="timeline.json for GPU-hours (log file only)"),
    slower: float = typer.Option(3.0, "--tolerance-slower", help="percent below the claim still 'reproduced'"),
    faster: float = typer.Option(3.0, "--tolerance-faster", help="percent above the claim still 'reproduced'"),
) -> None:
    """Measure a miles log against the recipe's claim. Exit 0 reproduced, 1 otherwise, 2 bad input."""
    try:
        from launcher.measure_cli import run_measure

        code = run_measure(log, recipe, json_out=json_out, price_per_hour=price_per_hour, region=region,
                           timeline=timeline, slower=slower, faster=faster)
    except ReproduceError as err:
        raise _fail(err)
    raise typer.Exit(code)


@app.command("compare")
def compare_cmd(
    candidate: Path = typer.Argument(..., help="candidate run directory or log"),
    reference: Path = typer.Argument(..., help="reference run directory or log"),
    json_out: bool = typer.Option(False, "--json", help="print exactly one JSON object on stdout"),
) -> None:
    """Loss-curve convergence check of CANDIDATE against REFERENCE. Exit 0 pass, 1 fail, 2 bad input."""
    try:
        from launcher.measure_cli import run_compare

        code = run_compare(candidate, reference, json_out=json_out)
    except ReproduceError as err:
        raise _fail(err)
    raise typer.Exit(code)


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
