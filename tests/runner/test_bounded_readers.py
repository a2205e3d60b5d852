"""`status` and `logs --stage` read the node's log in bounded bytes, memory and time, whatever it
holds (launcher/runner/runlogs.py).

- `status` of a detached run whose node's log grew by 1.5 GiB (a sparse file: no disk is spent)
  runs under a 1 GiB address-space limit and still shows the node's last step; it read at most
  the scan, the tail and its probes (before: the whole new log joined in memory, a MemoryError).
- `logs --stage` over a line of 64 MiB fed in 1 MiB pieces holds at most a marker's length of it
  between pieces and passes the line on whole (before: the held part grew to the whole line and
  was copied again for every piece: quadratic).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.paths import REPO

from launcher.plan.markers import MAX_MARKER_LINE
from launcher.records.rundir import Files, RunDir
from launcher.runner import runlogs
from launcher.runner.runlogs import StageFilter

NONCE = "ab" * 16
STEP = "(MegatronTrainRayActor pid=1) [2026-12-07 10:00:00.000 actor] model.py:1 - step {k}: {{'train/loss': 1.0}}\n"


def _detached(tmp_path: Path, grown: int) -> tuple[RunDir, Path]:
    """A detached local run: the run directory's copy holds the start of node.log (the train
    stage open, 3 steps); the node's node.log holds that, `grown` bytes of nothing (a hole), and
    then steps up to 41."""
    rd = RunDir.create(tmp_path / "runs", "test/bounded", "20261207T100000Z-bounded")
    node = tmp_path / "node"
    node.mkdir()
    head = (
        f"##reproduce nonce={NONCE}\n"
        f"##reproduce stage=preflight event=start t=100.0 n={NONCE}\n"
        f"##reproduce stage=preflight event=end status=ok t=101.0 n={NONCE}\n"
        "##reproduce stage=ray event=start t=102.0\n"
        "##reproduce stage=ray event=end status=ok t=103.0\n"
        "##reproduce stage=train event=start t=104.0\n"
        + "".join(STEP.format(k=k) for k in range(3))
    ).encode()
    (rd.logs / "node.log").write_bytes(head)
    rd.write_json(
        Files.TIMELINE,
        {
            "acquired_at": 99.0,
            "stages": [
                {"name": "preflight", "start": 100.0, "end": 101.0, "status": "ok"},
                {"name": "ray", "start": 102.0, "end": 103.0, "status": "ok"},
                {"name": "train", "start": 104.0, "end": None, "status": "running"},
            ],
        },
    )
    rd.update_record(
        cluster={"kind": "local"},
        nodes=[{"name": "local", "host": "localhost"}],
        node_run_dir=str(node),
        container="reproduce-bounded",
    )
    rd.set_status("detached")
    with open(node / "node.log", "wb") as fh:
        fh.write(head)
        fh.seek(len(head) + grown)  # a hole: reads as zeros, costs no disk
        fh.write(b"\n" + "".join(STEP.format(k=k) for k in range(3, 42)).encode())
    return rd, node


def _limited(megabytes: int) -> Any:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (megabytes << 20, megabytes << 20))

    return limit


def test_status_of_a_run_whose_node_log_grew_by_gigabytes_reads_a_bounded_tail(tmp_path):
    rd, _ = _detached(tmp_path, grown=3 << 29)  # 1.5 GiB
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "status", rd.run_id, "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        preexec_fn=_limited(1024),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["progress_from"] == "node" and data["step"] == 42 and data["stage"] == "train"
    text = subprocess.run(
        [sys.executable, "-m", "launcher", "status", rd.run_id],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        preexec_fn=_limited(1024),
    )
    assert "bytes between not read" in text.stdout, text.stdout + text.stderr


def test_status_reads_at_most_the_scan_the_tail_and_its_probes(tmp_path, monkeypatch):
    """The bytes asked of the node, counted at the node protocol's read (the real local
    transport underneath): the scan, the tail and one byte per probe, whatever the size."""
    rd, _ = _detached(tmp_path, grown=3 << 29)
    asked: list[int] = []
    real = runlogs.open_execution

    class Counting:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def read_log(self, offset: int, max_bytes: int) -> bytes:
            data: bytes = self.inner.read_log(offset, max_bytes)
            asked.append(len(data))
            return data

        def close(self) -> None:
            self.inner.close()

    monkeypatch.setattr(runlogs, "open_execution", lambda rd, i: Counting(real(rd, i)))
    got = runlogs.node_progress(rd)
    assert got.step == 42 and got.stage == "train" and got.skipped > 1 << 30
    assert sum(asked) <= runlogs.SCAN_BYTES + 2 * runlogs.TAIL_BYTES + 200
    assert len(asked) < 200


def test_status_of_a_small_growth_reads_it_all_and_its_markers(tmp_path):
    """Under the scan: every new byte read, the stage markers in it counted (train ended and
    the next stage began on the node)."""
    rd, node = _detached(tmp_path, grown=10)
    with open(node / "node.log", "ab") as fh:
        fh.write(b"##reproduce stage=train event=end status=ok t=200.0\n")
        fh.write(f"##reproduce stage=push event=start t=201.0 n={NONCE}\n".encode())
    got = runlogs.node_progress(rd)
    assert got.step == 42 and got.stage == "push" and got.skipped == 0


def test_a_stage_filter_holds_at_most_a_marker_of_a_long_line():
    line = b"y" * (64 << 20) + b"\n"
    data = b"##reproduce stage=train event=start t=1\n" + line + b"after\n"
    filt = StageFilter("train")
    out = []
    for at in range(0, len(data), 1 << 20):
        out.append(filt.feed(data[at : at + (1 << 20)]))
        assert len(filt._partial) <= MAX_MARKER_LINE
    out.append(filt.finish())
    assert b"".join(out) == line + b"after\n"
