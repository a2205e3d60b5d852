"""`reproduce RECIPE` (run, --dry-run, --check), `reproduce attach` and `reproduce cancel`.

The runner reports what happens through a Reporter; `ConsoleReporter` is the one a person sees:
stage starts and ends, training steps and the verdict on stderr, each with the time since start,
and the question after Ctrl-C when there is a terminal to ask on. Without a terminal the run is
unattended: a node lost for longer than the reconnect window is cancelled and released, since
nobody is there to reattach.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from launcher.errors import BadInput
from launcher.reproduction import (
    Options,
    Prepared,
    check_before_start,
    dry_run_text,
    prepare,
    write_script,
)

INTERRUPT_QUESTION = (
    "\ninterrupted: [c]ancel the run on the node, or [d]etach and leave it running? [c/d] "
)


class ConsoleReporter:
    """The runner's events on stderr (rich), so a long run shows where it is."""

    def __init__(self, console: Any = None) -> None:
        if console is None:
            from rich.console import Console

            console = Console(stderr=True, highlight=False)
        self.console = console
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        """A closed terminal (EIO after SIGHUP) or a closed pipe drops the line, nothing more."""
        elapsed = time.monotonic() - self.started
        try:
            self.console.print(
                f"[{elapsed:7.1f}s] {text}", markup=False, highlight=False, soft_wrap=True
            )
        except (OSError, ValueError):
            return

    def stage(self, name: str, event: str, status: str) -> None:
        self.say(f"stage {name} started" if event == "start" else f"stage {name} {status}")

    def step(self, done: int, total: int | None) -> None:
        self.say(f"train step {done}" + (f" of {total}" if total else ""))

    def warn(self, text: str) -> None:
        try:
            print(text, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            return

    def choose(self) -> str:
        """Ask on the terminal; without one (or on a second Ctrl-C) the run is cancelled."""
        if not sys.stdin or not sys.stdin.isatty():
            return "cancel"
        try:
            answer = input(INTERRUPT_QUESTION)
        except (KeyboardInterrupt, EOFError):
            return "cancel"
        return "detach" if answer.strip().lower().startswith("d") else "cancel"


def run_command(
    recipe: Path,
    options: Options,
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
        sys.stdout.write(dry_run_text(prepared, start.refusals))
        sys.stdout.flush()
        for why in start.refusals:
            print(f"warning: a real run would not start: {why}", file=sys.stderr)
        return 0
    if check:
        return _check(prepared)
    return run_prepared(prepared, options)


def run_prepared(prepared: Prepared, options: Options, reporter: Any = None) -> int:
    """A real run with its progress on the console; the exit code (failures raise)."""
    from launcher.runner.outcome import exit_code_of
    from launcher.runner.runner import Runner

    runner = Runner(
        reporter or ConsoleReporter(),
        on_interrupt=options.on_interrupt,
        unattended=not has_terminal(),
    )
    return exit_code_of(runner.run(prepared, options))


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
    from launcher.runner.outcome import exit_code_of
    from launcher.runner.runner import Runner

    runner = Runner(ConsoleReporter(), on_interrupt=on_interrupt, unattended=not has_terminal())
    return exit_code_of(runner.attach(run, runs_dir))


def cancel_command(run: str, runs_dir: Path | None) -> int:
    """Stop a run on its node and release what it acquired."""
    from launcher.runner.runner import Runner

    Runner(ConsoleReporter()).cancel(run, runs_dir)
    return 0
