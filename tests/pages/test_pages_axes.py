"""The history and nightly pages read right: time axes with the date and time (readable for many
runs a day), MFU in percent on an axis from 0 through the claim (a 0.03% gap looks like one),
failed and incomplete runs as marks and never as figures, and the night's start, end, cost and
GPU-hours."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from support.history import T0, history_rows, row
from support.pages import SLUG

from launcher.pages import render_history_page, render_nightly_page
from launcher.pages.history_page import assess_each, time_ticks
from launcher.records.history import RunRow
from launcher.runner.nightly import RecipeRun


def _svg(html: str, title: str) -> str:
    start = html.index(f'aria-label="{title}"')
    return html[start : html.index("</svg>", start)]


def _x_labels(svg: str) -> list[str]:
    return re.findall(r'text-anchor="middle">([^<]+)</text>', svg)


def _same_day(n: int) -> list[RunRow]:
    """n runs of one UTC day, 20 minutes apart."""
    return [dataclasses.replace(row(i, 6910.0 + i, "reproduced"), started_at=T0 + i * 1200)
            for i in range(n)]  # fmt: skip


def test_many_runs_of_one_day_get_distinct_time_labels():
    rows = _same_day(12)
    ticks, label = time_ticks(rows)
    assert len({text for _, text in ticks}) == 12 and label.startswith("run (UTC time, 20")
    svg = _svg(render_history_page(SLUG, rows), "tokens/s per GPU across runs")
    shown = [t for t in _x_labels(svg) if re.fullmatch(r"\d\d:\d\d", t)]
    assert len(shown) >= 6 and len(set(shown)) == len(shown)  # never twelve "12-01"
    several_days = history_rows()
    ticks, label = time_ticks(several_days)
    assert label == "run (UTC date and time)"
    assert all(re.fullmatch(r"\d\d-\d\d \d\d:\d\d", text) for _, text in ticks)


def _mfu_points(html: str) -> dict[str, float]:
    svg = _svg(html, "MFU across runs")
    return {x: float(cy) for x, cy in re.findall(
        r'data-series="mfu" data-x="([^"]+)" data-y="[^"]+" cx="[^"]+" cy="([^"]+)"', svg)}  # fmt: skip


def test_mfu_is_percent_from_zero_through_the_claim():
    rows = _same_day(2)
    rows[0] = dataclasses.replace(rows[0], mfu=0.12757)
    rows[1] = dataclasses.replace(rows[1], mfu=0.12760)  # 0.03% apart (relative: 0.02%)
    html = render_history_page(SLUG, rows, claims={"mfu": 0.1276})
    svg = _svg(html, "MFU across runs")
    assert 'data-y="12.757' in svg and 'data-y="12.76' in svg  # percent, as the report shows
    ticks = re.findall(r'text-anchor="end">([^<]+)</text>', svg)
    assert float(ticks[0]) == 0 and float(ticks[-1]) >= 10  # from 0 (the claim's line: below)
    points = _mfu_points(html)
    assert abs(points["0"] - points["1"]) < 1.0  # a tiny gap looks tiny
    assert "the card&#x27;s claim: 12.76%" in svg or "the card's claim: 12.76%" in svg
    assert "12.76%" in html  # the table too


def test_failed_and_incomplete_runs_are_marks_not_figures():
    rows = _same_day(4)
    rows[1] = dataclasses.replace(rows[1], verdict="incomplete", tokens_per_s_per_gpu=3000.0)
    rows[2] = dataclasses.replace(rows[2], verdict="failed", state="failed",
                                  tokens_per_s_per_gpu=10.0)  # fmt: skip
    svg = _svg(render_history_page(SLUG, rows), "tokens/s per GPU across runs")
    marks = re.findall(r'<g data-series="tokens_per_s_per_gpu" data-x="(\d)" data-y=""', svg)
    assert marks == ["1", "2"]
    assert 'data-y="3000' not in svg and 'data-y="10.0' not in svg
    assert "no figure (incomplete)" in svg and "no figure (failed)" in svg


def test_the_nightly_page_says_its_start_end_cost_and_gpu_hours():
    rows = history_rows()
    judged = assess_each(rows)

    class Entry:
        def __init__(self, r: RunRow, a) -> None:
            self.recipe = Path("recipes/x.yaml")
            self.run = RecipeRun(self.recipe, 0, None, None)
            self.row, self.assessment = r, a
            self.outcome = "reproduced"

    entries = [Entry(rows[0], judged[0]), Entry(rows[1], judged[1]), Entry(rows[2], judged[2])]
    html = render_nightly_page(
        entries, cluster="aws", stamp=T0 + 5400, exit_code=0, started=T0,
        costs={rows[0].run_id: 10.5, rows[1].run_id: 2.25, rows[2].run_id: None},
    )  # fmt: skip
    assert f'data-started="{T0}"' in html and f'data-ended="{T0 + 5400}"' in html
    assert "started 2026-09-21 14:13:20 UTC" in html and "ended 2026-09-21 15:43:20 UTC" in html
    assert 'data-gpu-hours="3.9000"' in html and "3.90 GPU-hours" in html
    assert 'data-total-usd="12.7500"' in html and "$12.75 in all (1 run(s) without" in html
