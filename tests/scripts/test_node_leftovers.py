"""scripts/node_leftovers.py against the real kernel: what a recipe leaves for the next recipe
on a node (System V objects, /dev/shm, out/) is removed, or named and refused.

Each case that touches IPC or /dev/shm runs in an IPC namespace and a /dev/shm of its own
(`unshare --ipc --mount`, a tmpfs), so nothing of this shared machine is seen or removed; the
creator's pid is then this namespace's, as it is inside the training container. The whole run
through node.sh and the CLI is tests/e2e/test_leftovers.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO

SCRIPT = REPO / "scripts" / "node_leftovers.py"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare"
)

# made in the namespace: a segment, a semaphore set, a queue and a /dev/shm file
MAKE = """
import ctypes
libc = ctypes.CDLL(None)
print("shm", libc.shmget(0, 4096, 0o1600))
print("sem", libc.semget(0, 1, 0o1600))
print("msg", libc.msgget(0, 0o1600))
open("/dev/shm/left-behind", "w").write("x")
"""


def _in_namespace(script: str) -> subprocess.CompletedProcess:
    body = f"mount -t tmpfs tmpfs /dev/shm && {script}"
    return subprocess.run(
        ["unshare", "--ipc", "--mount", "--propagation", "private", "sh", "-c", body],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _cases(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    py, tool = sys.executable, str(SCRIPT)
    before = tmp_path / "before.json"
    make = tmp_path / "make.py"
    make.write_text(MAKE)
    script = (
        f"{py} {tool} snapshot --out {before} && {py} {make} && "
        f"{py} {tool} clean {mode} --before {before} && "
        "echo LEFT; cat /proc/sysvipc/shm /proc/sysvipc/sem /proc/sysvipc/msg | tail -n +1; "
        "ls /dev/shm"
    )
    proc = _in_namespace(script)
    assert proc.returncode == 0, proc.stderr
    return proc


def _ids(out: str) -> dict[str, str]:
    return dict(
        line.split() for line in out.splitlines() if line.split()[0] in ("shm", "sem", "msg")
    )


def test_on_a_launched_node_every_new_object_and_dev_shm_entry_goes(tmp_path):
    proc = _cases(tmp_path, "--exclusive")
    made = _ids(proc.stdout)
    left = proc.stdout.split("LEFT", 1)[1]
    assert "removed=4 kept=0" in proc.stdout
    assert all(f" {ident} " not in left for ident in made.values()), left
    assert "left-behind" not in left


def test_on_a_shared_host_only_the_container_s_own_segments_go_the_rest_is_named(tmp_path):
    """Without --exclusive: the segment its own process made (the creator's pid is seen here)
    goes; the semaphore, the queue and the file cannot be told from another user's: named."""
    proc = _cases(tmp_path, "")
    made = _ids(proc.stdout)
    report = next(line for line in proc.stdout.splitlines() if "leftovers removed=" in line)
    assert "removed=1 kept=3" in report and "/dev/shm/left-behind" in report, report
    assert f"sem:{made['sem']}" in report and f"msg:{made['msg']}" in report
    left = proc.stdout.split("LEFT", 1)[1]
    assert "left-behind" in left


def test_a_finished_run_s_out_is_emptied_and_root_s_files_are_refused(tmp_path):
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="leftovers-", dir="/tmp"))  # reachable by nobody
    top.chmod(0o755)
    try:
        _between(top / "runs")
    finally:
        shutil.rmtree(top)


def _between(runs: Path) -> None:
    own, done, going = runs / "own", runs / "done", runs / "going"
    for run in (own, done, going):
        (run / "out" / "sub").mkdir(parents=True)
        (run / "out" / "sub" / "ckpt.bin").write_bytes(b"\0" * 1000)
    (done / "exit_code").write_text("0\n")
    tool = [sys.executable, str(SCRIPT), "between", "--runs", str(runs), "--self", str(own)]
    proc = subprocess.run(tool, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "emptied the out/ of the finished run done" in proc.stdout
    assert list((done / "out").iterdir()) == []
    assert (going / "out" / "sub" / "ckpt.bin").exists()  # a run still going keeps its files
    assert (own / "out" / "sub" / "ckpt.bin").exists()
    # root's files (a container killed before its end) and a user who cannot remove them
    (done / "out" / "root.bin").write_bytes(b"x")
    for path in (runs, done, going, own):
        path.chmod(0o755)
    (done / "out").chmod(0o755)
    nobody = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *tool],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert nobody.returncode == 3, nobody.stderr
    assert "refusing to start" in nobody.stderr and "root.bin" in nobody.stderr
