"""How long the runner's log splitter takes over one long line without a newline (a progress bar
redrawn with carriage returns, a binary dump), arriving 1 MiB at a time as the runner reads it.

    .venv/bin/python benchmarks/long_line.py [MiB]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from launcher.records.rundir import Timeline
from launcher.runner.stream import LogSplitter


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    with tempfile.TemporaryDirectory() as tmp:
        splitter = LogSplitter(Path(tmp), Timeline())
        splitter.append(b"##reproduce stage=train event=start t=1.0\n")
        chunk = b"x" * (1 << 20)
        t0 = time.perf_counter()
        for _ in range(mib):
            splitter.append(chunk)
        splitter.append(b"\n")
        splitter.close()
        print(f"{mib} MiB line: {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
