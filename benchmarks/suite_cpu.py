"""CPU-seconds of each test file, everything it starts included (containers, Ray, sshd, moto).

Usage: .venv/bin/python benchmarks/suite_cpu.py [PATH ...] [--top N] [--out FILE]

Why: the suite is CPU-bound on CI's two cores (docs/testing.md), so its wall time follows the
CPU its tests spend, and `--durations` cannot say where that is: a test's wall time under three
workers is mostly the others' CPU, and much of a test's own CPU is spent outside pytest's process,
in containers (dockerd's cgroups) and daemons that no rusage of a child reaches. This runs each
test file in a pytest of its own, one after another, and reads the machine's whole CPU counter
before and after it (cgroup v2 `cpu.stat`, v1 `cpuacct.usage`, else /proc/stat), so a file is
charged for everything that ran meanwhile: keep the machine otherwise idle while it runs. Each
file's figure includes one pytest start-up and collection (about 1.5 CPU-s here), which a run
under xdist pays once per worker, not once per file. The load test's four end-to-end runs are
counted twice (they run in their own files too when the load test is not in the session).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTEST = Path(sys.executable).parent / "pytest"


def machine_cpu_s() -> float:
    """CPU-seconds this machine (its root cgroup: every process and container) has used so far."""
    v2 = Path("/sys/fs/cgroup/cpu.stat")
    if v2.exists():
        for line in v2.read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    v1 = Path("/sys/fs/cgroup/cpuacct/cpuacct.usage")
    if v1.exists():
        return int(v1.read_text()) / 1e9
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = sum(int(x) for i, x in enumerate(fields) if i not in (3, 4))  # less idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def test_files(paths: list[str]) -> list[str]:
    """The test files pytest collects under `paths` (all of tests/ by default), sorted."""
    out = subprocess.run(
        [str(PYTEST), "--collect-only", "-q", "-p", "no:cacheprovider", *paths],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    ).stdout
    return sorted({line.split("::")[0] for line in out.splitlines() if "::" in line})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", default=["tests"])
    ap.add_argument("--top", type=int, default=25, help="rows of the table (the costliest files)")
    ap.add_argument("--out", type=Path, help="also write every row (tsv: cpu_s wall_s rc file)")
    args = ap.parse_args()
    rows: list[tuple[float, float, int, str]] = []
    for path in test_files(args.paths):
        c0, t0 = machine_cpu_s(), time.monotonic()
        argv = [str(PYTEST), "-q", "-p", "no:cacheprovider", path]
        rc = subprocess.run(argv, cwd=REPO, capture_output=True, check=False).returncode
        rows.append((machine_cpu_s() - c0, time.monotonic() - t0, rc, path))
        print(f"{rows[-1][0]:7.1f} {rows[-1][1]:7.1f} {rc} {path}", file=sys.stderr, flush=True)
    if args.out:
        args.out.write_text("".join(f"{c:.1f}\t{w:.1f}\t{rc}\t{p}\n" for c, w, rc, p in rows))
    rows.sort(reverse=True)
    total_cpu = sum(r[0] for r in rows)
    print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} cores")
    print("| CPU-s | share | wall s | file |")
    print("| --- | --- | --- | --- |")
    for cpu, wall, rc, path in rows[: args.top]:
        failed = "" if rc == 0 else f" (exit {rc})"
        print(f"| {cpu:.1f} | {100 * cpu / total_cpu:.1f}% | {wall:.1f} | {path}{failed} |")
    print(f"| {total_cpu:.1f} | 100% | {sum(r[1] for r in rows):.1f} | all {len(rows)} files |")


if __name__ == "__main__":
    main()
