"""`reproduce RECIPE` (run, --dry-run, --check), `reproduce attach` and `reproduce cancel`.

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
from typing import Any

from launcher.commands.console import ConsoleReporter
from launcher.errors import BadInput
from launcher.runner.prelaunch import (
    Prepared,
    RunOptions,
    StartCheck,
    check_before_start,
    dry_run_text,
    prepare,
    write_script,
)


def run_command(
    recipe: Path,
    options: RunOptions,
    *,
    dry_run: bool = False,
    check: bool = False,
    script_out: Path | None = None,
) -> int:
    """The Plan printed (--dry-run), checked with the cloud (--check), or run; the exit code."""
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
    from launcher.runner.outcome import exit_code_of
    from launcher.runner.runner import Runner

    console = reporter or ConsoleReporter()
    runner = Runner(console, on_interrupt=options.on_interrupt, unattended=not has_terminal())
    try:
        return exit_code_of(runner.run(prepared, options, start))
    finally:
        _close(console)


def has_terminal() -> bool:
    """Someone at a terminal who could reattach to a run the launcher lost (stdin and stderr)."""
    try:
        return bool(sys.stdin and sys.stdin.isatty() and sys.stderr and sys.stderr.isatty())
    except (OSError, ValueError):
        return False


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


def attach_command(run: str, runs_dir: Path | None, on_interrupt: str) -> int:
    """Follow a run in progress again to its end; the exit code a run ending so would have had."""
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


def cancel_command(run: str, runs_dir: Path | None) -> int:
    """Stop a run on its node and release what it acquired."""
    from launcher.runner.runner import Runner

    Runner(ConsoleReporter()).cancel(run, runs_dir)
    return 0


def _close(reporter: Any) -> None:
    close = getattr(reporter, "close", None)
    if callable(close):
        try:
            close()
        except (OSError, ValueError):
            pass
