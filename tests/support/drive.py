"""Run the runner in its own process (so tests can kill it, or send it Ctrl-C).

    python tests/support/drive.py SPEC.json    SPEC: {"cluster": record, "node_script", "run_dir",
                                             "run_id", "node_run_dir", "on_interrupt"?,
                                             "poll_s"?, "reconnect_s"?}
Progress goes to stderr as the CLI shows it; exits with the code the CLI would use.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launcher.clusters import from_record
from launcher.commands.console import ConsoleReporter
from launcher.errors import ReproduceError
from launcher.records.rundir import RunDir
from launcher.runner.outcome import exit_code_of
from launcher.runner.runner import Runner
from launcher.runner.signals import settle_streams
from support.nodescript import plan_running


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    plan = plan_running(spec["run_id"], spec["node_run_dir"], spec["node_script"])
    runner = Runner(
        ConsoleReporter(),
        on_interrupt=spec.get("on_interrupt", "ask"),
        poll_s=spec.get("poll_s", 0.2),
        reconnect_s=spec.get("reconnect_s", 10),
        measure=False,
    )
    try:
        outcome = runner.execute(plan, RunDir(Path(spec["run_dir"])), from_record(spec["cluster"]))
    except ReproduceError as err:
        try:
            print(f"error: {err}", file=sys.stderr)
        except OSError:  # the terminal is gone (as the CLI's own error print survives it)
            pass
        return err.exit_code
    return exit_code_of(outcome)


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        settle_streams()  # as the CLI's main: a closed terminal keeps the exit code
