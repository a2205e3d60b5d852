"""`reproduce run RECIPE` (also `reproduce RECIPE`): the plan printed (--dry-run), checked with
the cloud (--check), or run.

The runner reports what happens through a Reporter; `ConsoleReporter` (launcher/commands/
console.py) is the one a person sees: the cost before anything is paid for (and the question,
at a terminal), stage starts and ends, transfers, training steps and the verdict on stderr, and
the question after Ctrl-C when there is a terminal to ask on. Without a terminal the run is
unattended: a node lost for longer than the reconnect window is cancelled and released, since
nobody is there to reattach, and a paid launch needs --yes or --max-usd (launcher/cost/costgate.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from launcher.commands import options as o
from launcher.commands.options import output_file
from launcher.commands.output import fail, has_terminal
from launcher.errors import BadInput, ReproduceError

if TYPE_CHECKING:
    from launcher.runner.prelaunch import Prepared, RunOptions, StartCheck


def run_cmd(
    recipe: Path = typer.Argument(..., help="Recipe file (OpenRecipes YAML, schema_version 1)."),
    cluster: o.Cluster = "local",
    dry_run: o.DryRun = False,
    check: bool = typer.Option(
        False,
        "--check",
        help="aws: send the launch's calls with DryRun=True (needs credentials); "
        "nothing is created.",
    ),
    script_out: Path | None = typer.Option(
        None,
        "--script-out",
        help="Also write the node script alone to this file.",
        callback=output_file,
    ),
    run_id: str | None = typer.Option(
        None, "--run-id", help="Run id (default: UTC timestamp + random suffix)."
    ),
    skip_preflight: bool = typer.Option(
        False, "--skip-preflight", help="Do not run the GPU preflight before training."
    ),
    instance_id: str | None = typer.Option(
        None, "--instance-id", help="aws: target this existing instance (never terminated)."
    ),
    price_per_hour: o.PricePerHour = None,
    keep: bool = typer.Option(
        False,
        "--keep",
        help="aws: keep the instance after the run (prints its cost per hour and how to end it).",
    ),
    max_usd: o.MaxUsd = None,
    max_hours: o.MaxHours = None,
    on_interrupt: o.Interrupt = o.OnInterrupt.ask,
    runs_dir: o.RunsDir = None,
    yes: o.Yes = False,
    runs: o.Runs = None,
) -> None:
    """Reproduce RECIPE on a cluster (also: `reproduce RECIPE ...`): provision, check, train,
    measure, judge, release."""
    from launcher.runner.prelaunch import RunOptions

    options = RunOptions(
        cluster=cluster,
        run_id=run_id,
        skip_preflight=skip_preflight,
        instance_id=instance_id,
        price_per_hour=price_per_hour,
        keep=keep,
        max_usd=max_usd,
        max_hours=max_hours,
        on_interrupt=on_interrupt.value,
        runs_dir=runs_dir,
        yes=yes,
        runs=runs,
    )
    try:
        code = run_command(recipe, options, dry_run=dry_run, check=check, script_out=script_out)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def run_command(
    recipe: Path,
    options: RunOptions,
    *,
    dry_run: bool = False,
    check: bool = False,
    script_out: Path | None = None,
) -> int:
    """The Plan printed (--dry-run), checked with the cloud (--check), or run; the exit code."""
    from launcher.runner.prelaunch import check_before_start, dry_run_text, prepare, write_script

    prepared = prepare(recipe, options)
    start = check_before_start(prepared, options)  # what the real run checks: BadInput here too
    if script_out is not None:
        write_script(prepared.plan, script_out)
    if dry_run:
        sys.stdout.write(dry_run_text(prepared, start.refusals, max_usd=options.max_usd))
        sys.stdout.flush()
        for why in start.refusals:
            print(f"warning: a real run would not start: {why}", file=sys.stderr)
        return 0
    if check:
        return _check(prepared)
    return run_prepared(prepared, options, start=start)


def run_prepared(
    prepared: Prepared, options: RunOptions, reporter: Any = None, start: StartCheck | None = None
) -> int:
    """A real run with its progress on the console; the exit code (failures raise). `start`:
    the checks before the start already made (check_before_start runs once a run)."""
    from launcher.commands.console import ConsoleReporter
    from launcher.runner.outcome import exit_code_of
    from launcher.runner.runner import Runner

    console = reporter or ConsoleReporter()
    runner = Runner(console, on_interrupt=options.on_interrupt, unattended=not has_terminal())
    try:
        return exit_code_of(runner.run(prepared, options, start))
    finally:
        _close(console)


def _check(prepared: Prepared) -> int:
    """`--check`: would the cloud accept the launch (DryRun=True)? Nothing is created."""
    if prepared.profile.kind != "aws":
        raise BadInput(
            f"--check asks AWS about a launch; --cluster {prepared.profile.name} is of kind "
            f"{prepared.profile.kind}. Use --dry-run to see what would run."
        )
    from launcher.clusters.aws.cluster import check

    for line in check(
        prepared.recipe, prepared.profile, prepared.plan.run_id, owner=prepared.owner
    ):
        print(line)
    return 0


def _close(reporter: Any) -> None:
    close = getattr(reporter, "close", None)
    if callable(close):
        try:
            close()
        except (OSError, ValueError):
            pass
