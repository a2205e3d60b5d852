"""Small helpers for execution tests: start the runner in a process, wait for node-side facts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def start_driver(spec: dict, workdir: Path) -> subprocess.Popen:
    """The launcher in its own process (its own process group, so signals reach only it)."""
    path = workdir / "spec.json"
    path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    return subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "infra" / "drive.py"), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        text=True,
    )


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`reproduce ARGS` as a user runs it (stdin not a terminal)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
        timeout=timeout,
    )


def group_alive(sid: int) -> bool:
    """Is a process of the run's session (sid = pgid = wrapper pid) still running (zombies aside)?"""
    out = subprocess.run(["ps", "-s", str(sid), "-o", "stat="], capture_output=True, text=True).stdout.split()
    return any(not stat.startswith("Z") for stat in out)


def slow_script_body(lines: int = 60, delay_s: float = 0.05) -> str:
    """A train stage printing numbered lines (some long, some without newline flush) over time."""
    return f"""_mark preflight start; echo "preflight says hello"; _mark preflight end ok
_mark train start
for i in $(seq 1 {lines}); do
  echo "train line $i $(head -c 300 /dev/zero | tr '\\0' x)"
  printf 'partial-%s' "$i"; sleep {delay_s}; printf ' done\\n'
done
_mark train end ok
echo '{{"ok": true}}' > "$NODE_RUN_DIR/preflight.json"
"""
