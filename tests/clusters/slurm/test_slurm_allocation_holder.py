"""A nightly group's allocation ends itself when no launcher holds it any more: on the loopback
Slurm, the allocation's own script (as the launcher renders it, with a short grace) stays while
its heartbeat file is touched, and ends itself, freeing its node, once the touches stop (the
launcher killed outright, SIGKILL or its machine gone, which no release can follow). The
launcher's side: `Allocation`'s heartbeat thread touches the file until the release."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from support.helpers import wait_for
from support.slurm_runs import seed_plan

from launcher.clusters.slurm import script

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]


def _allocation(tmp_path: Path, grace_s: int) -> tuple[Path, Path]:
    """The script of a group's allocation on the loopback cluster's partition, in its directory
    on this host's "shared" work dir; the script's path and its heartbeat's."""
    plan = seed_plan(tmp_path, work_dir=str(tmp_path / "work"), partition="gpu")
    b = script.allocation_of(plan, "gres", 1.0)
    where = Path(b.run_dir)
    where.mkdir(parents=True)
    path = where / script.ALLOCATION_NAME
    path.write_text(script.render_allocation(b, grace_s=grace_s))
    return path, where / script.HOLDER_MARK


def _state(slurm, job: str) -> str:
    return slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()


def test_an_allocation_nobody_holds_ends_itself_and_one_held_stays(slurm, tmp_path):
    path, beat = _allocation(tmp_path, grace_s=3)
    beat.touch()
    job = slurm.run("sbatch", "--parsable", str(path), check=True).stdout.strip().split(";")[0]
    try:
        wait_for(lambda: _state(slurm, job) == "RUNNING", 120, "the allocation to hold its node")
        until = time.monotonic() + 8  # held for longer than its grace: it stays
        while time.monotonic() < until:
            beat.touch()
            assert _state(slurm, job) == "RUNNING"
            time.sleep(0.5)
        gone_from = time.monotonic()  # the holder stops touching, as a killed launcher does
        wait_for(lambda: _state(slurm, job) == "", 30, "the unheld allocation to end itself")
        assert time.monotonic() - gone_from < 15
    finally:
        slurm.run("scancel", job)
    out = (path.parent / f"slurm-{job}.out").read_text()
    assert f"allocation {job} ends itself" in out, out


def test_the_holder_touches_its_heartbeat_until_released(tmp_path, monkeypatch):
    from launcher.clusters.slurm.step import Allocation

    monkeypatch.setattr(script, "HOLDER_BEAT_S", 0.2)
    plan = seed_plan(tmp_path, work_dir=str(tmp_path / "work"))
    holder = Allocation(None, plan=plan, hours=1.0, holder=None)
    beat = tmp_path / "launcher-alive"
    beat.touch()
    thread = threading.Thread(target=holder._beat, args=(str(beat),), daemon=True)
    thread.start()
    try:
        first = beat.stat().st_mtime_ns
        wait_for(lambda: beat.stat().st_mtime_ns > first, 10, "a touch")
    finally:
        holder._beat_stop.set()
        thread.join(5)
    assert not thread.is_alive()
    stopped = beat.stat().st_mtime_ns
    time.sleep(0.6)
    assert beat.stat().st_mtime_ns == stopped  # released: no more touches
