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
controller enabled for the root's children). Where neither can be made (a v2 namespace whose root
holds processes cannot hand the cpu controller down), `spinning()` is the fallback the load test
takes: the old load, one busy process pinned to the last core, said in the test's output.
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
        path, limits = V1 / name, {"cpu.cfs_period_us": PERIOD_US, "cpu.cfs_quota_us": quota}
    elif "cpu" in (V2 / "cgroup.controllers").read_text().split():
        with contextlib.suppress(OSError):  # already enabled, or enabled by whoever owns the root
            (V2 / "cgroup.subtree_control").write_text("+cpu\n")
        path, limits = V2 / name, {"cpu.max": f"{quota} {PERIOD_US}"}
    else:
        raise FileNotFoundError("no cpu controller")
    path.mkdir()
    try:
        for file, value in limits.items():
            (path / file).write_text(f"{value}\n")
    except OSError:
        path.rmdir()  # a cgroup without its limit is never left behind
        raise
    return CpuLimit(path, fraction)


@contextlib.contextmanager
def cpu_limited(fraction: float) -> Iterator[CpuLimit]:
    """A fresh cgroup holding its members to `fraction` of one core; removed at the end, after
    any member still in it is killed (a test's leftovers never stay throttled on the machine)."""
    name = f"reproduce-load-{os.getpid()}-{time.monotonic_ns()}"
    limit = _make(name, fraction)  # OSError: no cgroup here (the caller falls back)
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


def cgroup_error() -> str | None:
    """Why no CPU cgroup can be made here, or None when one can (made and removed at once)."""
    try:
        with cpu_limited(0.5):
            return None
    except OSError as exc:
        return f"no writable CPU cgroup ({V1}/cpu.cfs_quota_us, or cpu in {V2}): {exc}"


@contextlib.contextmanager
def spinning() -> Iterator[None]:
    """One process spinning on the last core for as long as the block runs (the fallback load)."""
    import subprocess
    import sys

    core = sorted(os.sched_getaffinity(0))[-1]
    code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        yield
    finally:
        proc.kill()
        proc.wait()
