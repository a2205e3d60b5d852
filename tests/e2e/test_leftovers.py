"""A recipe's leftovers do not reach the next recipe on the node (launcher/plan/leftovers.py,
scripts/node_leftovers.py): two real runs through the CLI in one work_dir, as a nightly lends
one node to its recipes in turn.

The first recipe's code (in its container, root, `--ipc host`) makes a System V shared memory
segment, a /dev/shm file and a file in its out/. At its end the segment is gone (its creator
was the container's), the /dev/shm file, which on a shared host cannot be told from another
user's, is named in node.log; the second run's start empties the first's out/ and says so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.helpers import cli
from support.plan_env import write_profile, write_recipe

pytestmark = pytest.mark.docker

PREFIX = (
    'python3 -c \'import ctypes, os; print("LEFT-SHMID", ctypes.CDLL(None).shmget(0, 65536, 0o1600)); '
    'open("/dev/shm/reproduce-left-%d" % os.getpid(), "w").write("x"); '
    'open(os.environ["REPRODUCE_OUT_DIR"] + "/checkpoint.bin", "wb").write(bytes(1 << 20))\'\n'
)


def _segments() -> set[str]:
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return {line.split()[1] for line in lines if line.split()}


def test_the_next_recipe_finds_no_segment_and_an_empty_out_of_the_one_before(
    test_image, container_run_args, tmp_path
):
    profile = write_profile(tmp_path, {"kind": "local"}, container_run_args)
    recipe = write_recipe(tmp_path, test_image, run_prefix=PREFIX)
    runs = tmp_path / "runs"
    first = cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), timeout=300)
    left_behind = list(Path("/dev/shm").glob("reproduce-left-*"))
    try:
        assert first.returncode == 0, first.stderr
        (node_log,) = runs.glob("**/logs/node.log")
        text = node_log.read_text()
        shmid = re.search(r"LEFT-SHMID (\d+)", text).group(1)
        assert shmid not in _segments()
        report = next(line for line in text.splitlines() if "leftovers removed=" in line)
        assert "/dev/shm/reproduce-left-" in report, report  # named, not another's to remove
        (out,) = (tmp_path / "work" / "runs").glob("*/out")
        assert (out / "checkpoint.bin").stat().st_size == 1 << 20  # kept while it is the last
        second = cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), timeout=300)
        assert second.returncode == 0, second.stderr
        assert list(out.iterdir()) == []
        logs = [p.read_text() for p in runs.glob("**/logs/node.log")]
        assert any(f"emptied the out/ of the finished run {out.parent.name}" in t for t in logs)
    finally:
        for path in [*left_behind, *Path("/dev/shm").glob("reproduce-left-*")]:
            path.unlink(missing_ok=True)
