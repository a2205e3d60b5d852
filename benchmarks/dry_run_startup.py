"""Wall time of `reproduce RECIPE --cluster aws --dry-run` as a fresh process (target: median <= 0.3 s).

Usage: .venv/bin/python benchmarks/dry_run_startup.py [--runs 30] [--cluster aws]
Prints median, p90, min and max over the runs, after one untimed warm-up run (OS file cache), twice:
"cold" with REPRODUCE_NO_CACHE=1 (the schemas are checked with jsonschema every time, as on a
recipe's first run) and "warm" (a recipe and profile that passed before skip the jsonschema import).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SEED = REPO / "recipes" / "qwen3-30b-a3b" / "h200" / "attune-tp1-pp1-ep8-mt16k.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--cluster", default="aws")
    args = ap.parse_args()
    exe = Path(sys.executable).with_name("reproduce")
    cmd = [str(exe), str(SEED), "--cluster", args.cluster, "--dry-run"]
    print(f"command: reproduce {' '.join(cmd[1:])}")
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
        f"{subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    for label, extra in (("cold", {"REPRODUCE_NO_CACHE": "1"}), ("warm", {})):
        env = {**os.environ, **extra}
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
            times.append(time.perf_counter() - start)
        times.sort()
        p90 = times[int(0.9 * (len(times) - 1))]
        print(
            f"{label}: runs {len(times)}  median {statistics.median(times):.3f} s  p90 {p90:.3f} s  "
            f"min {times[0]:.3f} s  max {times[-1]:.3f} s"
        )


if __name__ == "__main__":
    main()
