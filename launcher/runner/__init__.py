"""Running a Plan on a cluster's nodes and following it to the end.

    protocol.py  the node side as text: wrapper, launch/poll/cancel/cleanup commands, stage markers
    staging.py   what goes to the node before the script starts, and the result files back
    stream.py    following a node: its log by byte offset into the run dir, its state polled
    signals.py   SIGTERM/SIGHUP cancel; the release of the cluster, finished through Ctrl-C
    outcome.py   how a run ended: Outcome, exit codes, a failed stage's message
    reporter.py  the events the runner reports (the command layer shows them)
    runner.py    Runner: run, execute, attach, cancel

Import from the modules themselves: this package's import stays empty, so the dry run (which
renders the stage markers of protocol.py) loads nothing else of the runner.
"""
