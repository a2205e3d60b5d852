"""Run the real `reproduce` command as a user would: a fresh process, its exit code and output."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support.paths import REPO
from support.paths import SEED as SEED  # re-exported: the tests import it from here

FIXTURES = REPO / "tests" / "data" / "recipes"
FOUR_NODES = FIXTURES / "qwen3-30b-a3b-h200-4node.yaml"  # the multi-node fixture recipe


@dataclass
class Result:
    code: int
    out: str
    err: str


def reproduce(
    *args: str | Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
) -> Result:
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or REPO,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def reproduce_here(
    *args: str | Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    unset: tuple[str, ...] = (),
) -> Result:
    """The same command in this process: for tests of what the CLI reads, checks and prints
    (validation, dry runs, estimates), where a fresh interpreter is not what is tested and its
    start-up (about 0.2 s of CPU each) is most of the test's cost.

    It runs the console entry point (`launcher.commands.cli.main`) as `python -m launcher` would:
    argv, the environment and the working directory set for the call and restored after; stdin
    empty; stdout and stderr captured at the file-descriptor level too, so a child process's
    output is captured as a subprocess's would be; SystemExit's code is the exit code; any other
    exception is printed as Python prints an uncaught one (a traceback on stderr, code 1), so a
    test that asserts "no traceback" holds here as it does in a fresh process. The signal
    dispositions are restored too; `unset` names variables the call must not see. Whatever needs a fresh process (a run, signals, Ctrl-C, the
    start-up imports) uses `reproduce`."""
    import io
    import signal
    import tempfile
    import threading
    import traceback

    from launcher.commands import cli

    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_streams = (sys.stdin, sys.stdout, sys.stderr)
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    saved_fds = (os.dup(1), os.dup(2))
    saved_hook = threading.excepthook  # main() installs its own (runner/signals.py)
    code = 0
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        try:
            os.environ.update(env or {})
            for name in unset:
                os.environ.pop(name, None)
            os.chdir(cwd or REPO)
            sys.argv = ["reproduce", *map(str, args)]
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os.dup2(out_f.fileno(), 1)
            os.dup2(err_f.fileno(), 2)
            sys.stdin = open(os.devnull)  # noqa: SIM115 - closed below
            sys.stdout = io.TextIOWrapper(os.fdopen(os.dup(1), "wb"), encoding="utf-8")
            sys.stderr = io.TextIOWrapper(
                os.fdopen(os.dup(2), "wb"), encoding="utf-8", line_buffering=True
            )
            try:
                cli.main()
            except SystemExit as stop:
                if stop.code is None or isinstance(stop.code, int):
                    code = stop.code or 0
                else:
                    print(stop.code, file=sys.stderr)
                    code = 1
            except BaseException:  # noqa: BLE001 - an uncaught exception, as Python reports it
                traceback.print_exc()
                code = 1
        finally:
            for stream in (sys.stdin, sys.stdout, sys.stderr):
                try:
                    stream.flush()
                    stream.close()
                except (OSError, ValueError):
                    pass
            sys.stdin, sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            sys.argv = saved_argv
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
            for sig, handler in saved_signals.items():
                signal.signal(sig, handler)
            threading.excepthook = saved_hook
        out_f.seek(0)
        err_f.seek(0)
        out, err = (f.read().decode("utf-8", "replace") for f in (out_f, err_f))
    return Result(code, out, err)


def completed_here(
    *args: str | Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    unset: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """`reproduce_here` in the shape of `subprocess.run(..., text=True)`'s result, for the tests
    that read `returncode`, `stdout` and `stderr` of a command that reads files and prints
    (measure, compare, runs, history, logs without --follow, down/reap on moto): the same
    command, without the fresh interpreter that was most of such a test's CPU."""
    got = reproduce_here(*args, env=env, cwd=cwd, unset=unset)
    return subprocess.CompletedProcess(["reproduce", *map(str, args)], got.code, got.out, got.err)
