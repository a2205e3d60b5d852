"""A CPU cgroup that holds a process tree to a fraction of one core: the load test's busy machine
(tests/e2e/test_load_e2e.py).

Why a cgroup rather than spinners: a spinner makes the launcher's processes wait by burning a core
that the suite's other worker then loses too (about a tenth of the whole suite's CPU, measured:
docs/testing.md, "The load test"). A CFS bandwidth limit makes them wait without burning anything:
the tree runs for its quota, then is stopped until the next period, over and over, so its reads
return late and in bursts and its signals land whenever the kernel lets it run, while the node's
containers (in dockerd's cgroups, not this one) write at full speed. That is the busy launcher the
load test is about, made harder, and it costs the rest of the suite nothing.

Both cgroup versions: v1 (a `cpu` hierarchy: cpu.cfs_quota_us) and v2 (cpu.max, with the cpu
controller enabled for the root's children). Neither writable is a failure naming both paths:
dockerd, which every end-to-end test needs, needs writable cgroups too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PERIOD_US = 100_000
V1 = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CpuLimit:
    """A cgroup made for one test; `join()` moves the calling process into it (for preexec_fn:
    every process it starts afterwards is held too)."""

    path: Path
    fraction: float

    def join(self) -> None:
        (self.path / "cgroup.procs").write_text(f"{os.getpid()}\n")

    def members(self) -> list[int]:
        text = (self.path / "cgroup.procs").read_text()
        return [int(word) for word in text.split()]

    def throttled(self) -> tuple[int, float]:
        """How many periods the tree was stopped in, and for how many seconds in all."""
        stat = dict(
            line.split() for line in (self.path / "cpu.stat").read_text().splitlines() if line
        )
        if "throttled_usec" in stat:  # v2
            return int(stat["nr_throttled"]), int(stat["throttled_usec"]) / 1e6
        return int(stat["nr_throttled"]), int(stat["throttled_time"]) / 1e9


def _make(name: str, fraction: float) -> CpuLimit:
    quota = max(1000, int(PERIOD_US * fraction))
    if (V1 / "cpu.cfs_quota_us").exists():
        path = V1 / name
        path.mkdir()
        (path / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
        (path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        return CpuLimit(path, fraction)
    if "cpu" in (V2 / "cgroup.controllers").read_text().split():
        with contextlib.suppress(OSError):  # already enabled, or enabled by whoever owns the root
            (V2 / "cgroup.subtree_control").write_text("+cpu\n")
        path = V2 / name
        path.mkdir()
        (path / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
        return CpuLimit(path, fraction)
    raise FileNotFoundError("no cpu controller")


@contextlib.contextmanager
def cpu_limited(fraction: float) -> Iterator[CpuLimit]:
    """A fresh cgroup holding its members to `fraction` of one core; removed at the end, after
    any member still in it is killed (a test's leftovers never stay throttled on the machine)."""
    name = f"reproduce-load-{os.getpid()}-{time.monotonic_ns()}"
    try:
        limit = _make(name, fraction)
    except OSError as exc:
        raise AssertionError(
            f"the load test needs a writable CPU cgroup ({V1}/cpu.cfs_quota_us for cgroup v1, or "
            f"{V2}/cgroup.controllers listing cpu for v2), as dockerd does: {exc}"
        ) from exc
    try:
        yield limit
    finally:
        for _ in range(50):
            pids = limit.members()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        limit.path.rmdir()
