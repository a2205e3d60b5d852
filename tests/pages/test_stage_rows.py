"""The run page's stage table when stages ran at once: one row for the part (its wall time, the
share of the total), its stages under it with their own times, none listed again as never
ended, and a part in which a stage failed shown failed."""

from __future__ import annotations

from launcher.judge.timeline import RunTimeline
from launcher.pages.run_sections import _overlapped, stage_rows


def _timeline(image_status: str = "ok") -> dict:
    return {
        "acquired_at": 0.0,
        "released_at": 100.0,
        "stages": [
            {"name": "preflight", "start": 5.0, "end": 6.0, "status": "ok"},
            {"name": "image", "start": 5.0, "end": 40.0, "status": image_status},
            {"name": "assets", "start": 6.0, "end": 30.0, "status": "stopped"},
            {"name": "convert", "start": 41.0, "end": 50.0, "status": "ok"},
        ],
    }


def test_a_part_of_stages_that_ran_at_once_is_one_row_with_its_stages_under_it():
    rows = stage_rows(RunTimeline.of(_timeline()))
    names = [r[0] for r in rows]
    part = "parallel: preflight+image+assets"
    assert names == ["acquire", part, "convert", "between", "collect"]
    (row,) = [r for r in rows if r[0] == part]
    assert row[1] == 35.0 and row[3] == 5.0  # its wall time, from its first stage's start
    assert sum(r[1] for r in rows) == 100.0
    subs = _overlapped(RunTimeline.of(_timeline()), part, 0.0)
    assert [s[0].rsplit(" ", 1)[-1] for s in subs] == ["preflight", "image", "assets"]
    assert [s[-1] for s in subs] == ["ok", "ok", "stopped"]
    assert _overlapped(RunTimeline.of(_timeline()), "convert", 0.0) == []


def test_a_part_in_which_a_stage_failed_is_shown_failed():
    (row,) = [
        r for r in stage_rows(RunTimeline.of(_timeline("failed"))) if r[0].startswith("parallel: ")
    ]
    assert row[2] == "failed"
