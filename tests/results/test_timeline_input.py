"""`measure LOG --timeline FILE`: the timeline is a file a user names, read as one (a regular
file, capped, JSON numbers), and its times must make sense before they become GPU-hours.

Found 2026-12-04: `--timeline /dev/zero` (or a FIFO) never returned; `NaN` printed "GPU-hours
nan"; a released_at before acquired_at gave -0.022 GPU-hours, and the run was still judged.
"""

from __future__ import annotations

import json
import os

import pytest
from support.cli import SEED, completed_here
from support.paths import REPO

LOG = REPO / "tests" / "data" / "logs" / "miles-v0.1.0.log"


def measure(timeline: str):
    return completed_here(
        "measure", str(LOG), "--recipe", str(SEED), "--timeline", timeline, "--json", cwd=REPO
    )


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "nan", "infinity", "deep"])
def test_a_timeline_that_is_not_one_is_refused_at_once(tmp_path, kind):
    path = tmp_path / "timeline.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = "/dev/zero"
    elif kind == "directory":
        path = tmp_path
    elif kind == "nan":
        path.write_text('{"acquired_at": NaN, "released_at": 10, "stages": []}')
    elif kind == "infinity":
        path.write_text('{"acquired_at": 0, "released_at": Infinity, "stages": []}')
    else:
        path.write_text("[" * 100_000 + "]" * 100_000)
    res = measure(str(path))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert str(path) in res.stderr


def test_a_release_before_the_acquisition_gives_no_gpu_hours(tmp_path):
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps({"acquired_at": 1000.0, "released_at": 900.0, "stages": []}))
    res = measure(str(path))
    out = json.loads(res.stdout)
    assert out["gpu_hours"] is None  # was -0.022
    text = completed_here(
        "measure", str(LOG), "--recipe", str(SEED), "--timeline", str(path), cwd=REPO
    ).stdout
    assert "released_at is before its acquired_at: no GPU-hours" in text
