"""Small helpers for execution tests: start the runner in a process, wait for node-side facts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def wait_for(
    predicate: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition"
) -> None:
    """Poll `predicate` until it holds. A file it reads that does not exist yet (a run's
    train.log before the runner made it) is "not yet", not a failure: on a busy machine the first
    poll can come before the file (a full run failed so once, on the multi-node Ctrl-C test)."""
    deadline = time.monotonic() + timeout_s
    while not _holds(predicate):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def _holds(predicate: Callable[[], bool]) -> bool:
    try:
        return predicate()
    except FileNotFoundError:
        return False


def start_driver(spec: dict, workdir: Path) -> subprocess.Popen:
    """The launcher in its own process (its own process group, so signals reach only it)."""
    path = workdir / "spec.json"
    path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    return subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "support" / "drive.py"), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        text=True,
        # A test run started in the background (`cmd &`) inherits SIGINT ignored, and Python then
        # installs no KeyboardInterrupt handler: give the CLI the default a terminal would.
        preexec_fn=_default_sigint,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`reproduce ARGS` as a user runs it (stdin not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=_cli_env(),
        timeout=timeout,
    )


def start_cli(*args: str) -> subprocess.Popen:
    """`reproduce ARGS` left running in its own process group (so a test can Ctrl-C or kill it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "launcher", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=_cli_env(),
        start_new_session=True,
        text=True,
    )


def group_alive(sid: int) -> bool:
    """Is a process of the run's session (sid = pgid = wrapper pid) still running (zombies aside)?"""
    out = subprocess.run(
        ["ps", "-s", str(sid), "-o", "stat="], capture_output=True, text=True
    ).stdout.split()
    return any(not stat.startswith("Z") for stat in out)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes on this host (containers' included) that contain `text`."""
    out = subprocess.run(
        ["ps", "-ww", "-eo", "pid=,stat=,args="], capture_output=True, text=True
    ).stdout
    found = []
    for line in out.splitlines():
        pid, stat, args = (line.split(None, 2) + ["", ""])[:3]
        if text in args and int(pid) != os.getpid() and not stat.startswith("Z"):
            found.append(line.strip())
    return found


def processes_with_env(name: str, value: str) -> list[str]:
    """Live processes on this host (containers' included) whose environment has name=value.

    A run's containers get RUN_ID (-e RUN_ID), and every process started in them inherits it:
    Ray's daemons and workers too, whose command lines name nothing of the run.
    """
    want = f"{name}={value}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if want not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if state != "Z":
            found.append(f"{proc.name} {args.strip()}")
    return found


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


def assert_log_collected(run_dir: Path | str) -> None:
    """The run's collected logs/node.log is each node's node.log byte for byte (issue 22): not a
    byte lost, doubled or changed between the node and the run directory, whatever the load.

    Every node of these tests is this machine (the local host, a loopback sshd, moto's instances
    reached on a loopback sshd), so the node's copy is read where the run left it: NODE_RUN_DIR,
    or node K's own work_dir (launcher.runner.nodes.place_of), never removed by the run.
    """
    from launcher.clusters.base import Node
    from launcher.records.rundir import RunDir
    from launcher.runner.nodes import place_of

    rd = RunDir(Path(run_dir))
    record = rd.record()
    nodes = record.get("nodes") or ([record["node"]] if record.get("node") else [])
    assert nodes, f"{rd.path}: the run never reached a node, so no log was collected"
    for index, node in enumerate(nodes):
        place = place_of(
            Node(**node),
            index,
            len(nodes),
            record["run_id"],
            record["node_run_dir"],
            record["container"],
        )
        theirs_path = Path(place.node_run_dir) / "node.log"
        ours_path = rd.logs / ("node.log" if index == 0 else f"node-{index}/node.log")
        theirs, ours = theirs_path.read_bytes(), ours_path.read_bytes()
        if ours == theirs:
            continue
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
        at = min(len(ours), len(theirs)) if at is None else at
        raise AssertionError(
            f"node {index}: {ours_path} ({len(ours)} bytes) differs from the node's {theirs_path} "
            f"({len(theirs)} bytes) from byte {at}: ours {ours[at : at + 80]!r}, "
            f"the node's {theirs[at : at + 80]!r}"
        )
