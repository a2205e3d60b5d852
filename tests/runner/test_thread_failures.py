"""No thread prints a traceback (launcher/runner/signals.py, `report_thread_failures`, installed
by the console entry point): a background thread that dies is one warning line, and a connection
lost inside paramiko's own threads (its read-ahead `_prefetch_thread` when a node goes away
mid-read) is left to the main thread, which reports it (found 2026-12-05: `OSError: Socket is
closed` with its traceback in the middle of the detach hint)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from support.paths import REPO

PROGRAM = textwrap.dedent(
    """
    import sys, threading
    from launcher.commands import cli

    sys.argv = ["reproduce", "--version"]
    try:
        cli.main()  # the console entry point installs the hook
    except SystemExit:
        pass
    assert threading.excepthook is not threading.__excepthook__

    # what paramiko's read-ahead thread raises when the socket goes: a frame of paramiko's file
    fake = compile("def send():\\n    raise OSError('Socket is closed')\\n",
                   "/venv/lib/site-packages/paramiko/channel.py", "exec")
    space = {}
    exec(fake, space)
    for target in (space["send"], lambda: {}["no such key"], lambda: 1 / 0):
        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
    print("main thread went on")
    """
)


def test_a_dying_thread_is_one_line_and_a_connection_lost_in_paramiko_is_the_main_threads():
    res = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert "main thread went on" in res.stdout
    assert "Traceback" not in res.stderr and "Socket is closed" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip() and "reproduce" not in line]
    assert len(lines) == 2, res.stderr
    assert "KeyError" in lines[0] and "ZeroDivisionError" in lines[1]
    assert all(line.startswith("warning: background work (Thread-") for line in lines)
