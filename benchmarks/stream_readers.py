"""What `logs --stage` and `status` cost on a hostile log: time, peak memory, bytes read.

    .venv/bin/python benchmarks/stream_readers.py [MiB of the long line] [GiB of new node log]

1. `logs --stage train` over one line of N MiB arriving 1 MiB at a time (runlogs.StageFilter).
2. `status` of a detached local run whose node's log grew by G GiB (a sparse file: no disk),
   runlogs.node_progress: its time and the bytes it asked of the node.
Peak memory: this process's maxrss after each (the first is measured first).
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _rss_mib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10


def long_line(mib: int) -> None:
    from launcher.runner.runlogs import StageFilter

    filt = StageFilter("train")
    filt.feed(b"##reproduce stage=train event=start t=1\n")
    chunk, shown = b"y" * (1 << 20), 0
    t0 = time.perf_counter()
    for _ in range(mib):
        shown += len(filt.feed(chunk))
    shown += len(filt.feed(b"\n"))
    took = time.perf_counter() - t0
    print(f"logs --stage, one {mib} MiB line: {took:.2f} s, {shown >> 20} MiB shown, "
          f"maxrss {_rss_mib()} MiB")  # fmt: skip


def status(gib: float) -> None:
    os.environ.setdefault("REPRODUCE_HOME", tempfile.mkdtemp())
    from launcher.records.rundir import RunDir
    from launcher.runner import runlogs

    tmp = Path(tempfile.mkdtemp())
    rd = RunDir.create(tmp / "runs", "bench/status", "20261207T100000Z-bench")
    node = tmp / "node"
    node.mkdir()
    head = b"##reproduce stage=train event=start t=1\n"
    (rd.logs / "node.log").write_bytes(head)
    rd.update_record(cluster={"kind": "local"}, nodes=[{"name": "local", "host": "localhost"}],
                     node_run_dir=str(node), container="reproduce-bench")  # fmt: skip
    rd.set_status("detached")
    with open(node / "node.log", "wb") as fh:
        fh.write(head)
        fh.seek(len(head) + int(gib * (1 << 30)))
        fh.write(b"\n(actor) model.py:1 - step 41: {'train/loss': 1.0}\n")
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

    runlogs.open_execution = lambda rd, i: Counting(real(rd, i))  # type: ignore[assignment]
    t0 = time.perf_counter()
    got = runlogs.node_progress(rd)
    took = time.perf_counter() - t0
    print(f"status, {gib:g} GiB of new node log: {took:.2f} s, step {got.step}, "
          f"{sum(asked) >> 20} MiB read in {len(asked)} reads, maxrss {_rss_mib()} MiB")  # fmt: skip


def main() -> None:
    long_line(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
    status(float(sys.argv[2]) if len(sys.argv) > 2 else 1.5)


if __name__ == "__main__":
    main()
