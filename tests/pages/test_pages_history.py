"""The history page of a recipe and the page of a night: trends of tokens/s, MFU and $ / 1M
across runs, regressions marked where launcher/records/history.py's rules find them, links to each run's
report.html.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.history import T0, history_rows
from support.page_read import assert_self_contained, parse
from support.pages import SLUG, make_run
from support.paths import SEED

from launcher.pages import (
    render_history_page,
    render_nightly_page,
    write_history_page,
    write_nightly_page,
    write_run_page,
)
from launcher.pages.history_page import assess_each
from launcher.records.history import History, RunRow, check_regression
from launcher.runner.nightly import RecipeRun, nightly


def test_each_run_is_assessed_against_the_runs_before_it_as_history_does():
    rows = history_rows()
    judged = assess_each(rows)
    assert [a.regression for a in judged] == [i == 10 for i in range(12)]
    assert [a.suspect for a in judged] == [i == 9 for i in range(12)]
    assert not judged[5].judged  # the failed run
    # the last one is exactly what `reproduce history` assesses
    assert judged[-1].to_dict() == check_regression(rows[-1], rows[:-1]).to_dict()


def test_history_page_marks_the_regression_and_draws_three_trends():
    rows = history_rows()
    html = render_history_page(SLUG, rows)
    assert_self_contained(html)
    c = parse(html)
    text = "".join(c.text)
    for label in ("tokens/s per GPU across runs", "MFU across runs", "$ / 1M tokens across runs"):
        assert label in html
    regressions = [d for tag, d in c.attrs if tag == "tr" and d.get("class") == "regression"]
    assert len(regressions) == 1
    assert text.count("regression") >= 4  # a ring per chart (3) and the table's badge
    shown = {d["data-run"]: t for d, t in _run_figures(html)}
    assert shown[rows[9].run_id] == "6,512.00" and shown[rows[5].run_id] == "—"
    # the latest run is within its trend: said at the top
    assert any(d.get("data-regression") == "no" for _, d in c.attrs)
    assert "median" in text and "good runs" in text


def _run_figures(html: str) -> list[tuple[dict, str]]:
    import re

    return [
        ({"data-run": m.group(1)}, m.group(2))
        for m in re.finditer(
            r'<span data-run="([^"]+)" data-figure="tokens_per_s_per_gpu">([^<]*)</span>', html
        )
    ]


def test_history_page_of_a_latest_regression_and_of_no_runs():
    rows = history_rows()[:11]
    html = render_history_page(SLUG, rows)
    c = parse(html)
    assert any(d.get("data-regression") == "yes" for _, d in c.attrs)
    assert "below the recipe's claim" in "".join(c.text)
    empty = render_history_page(SLUG, [])
    assert "No run of this recipe is recorded" in empty


def test_history_page_links_each_run_to_its_report(tmp_path):
    runs = []
    for i, step in enumerate((18.96, 18.99, 18.93, 19.9)):
        rd = make_run(tmp_path, f"2026102{i}T094500Z-{i:06x}", step_time_s=step)
        write_run_page(rd)
        runs.append(rd)
    with History(tmp_path / "history.sqlite") as hist:
        for rd in runs:
            hist.record(rd)
        rows = hist.runs(SLUG)
    out = write_history_page(tmp_path / "pages" / "history.html", SLUG, rows)
    html = out.read_text()
    hrefs = {d["href"] for tag, d in parse(html).attrs if tag == "a" and d.get("href")}
    assert len(hrefs) == 4  # every run (the latest one twice: at the top and in the table)
    for href in hrefs:
        assert (out.parent / href).resolve().is_file()
    assert "slower" in html


class FakeRunner:
    """Runs nothing: leaves the run directory a run with these step times would leave."""

    def __init__(self, root: Path, plan: dict[str, object]) -> None:
        self.root, self.plan = root, plan

    def __call__(self, recipe: Path, options, *, held=None) -> RecipeRun:
        what = self.plan[recipe.stem]
        if isinstance(what, str):  # refused before any run directory
            return RecipeRun(recipe, 2, None, what)
        rd = make_run(
            self.root,
            options.run_id,
            slug=f"m/h200/{recipe.stem}",
            runs_root=options.runs_dir,
            **what,
        )
        write_run_page(rd)
        code = 0 if "step_time_s" not in what else 1
        return RecipeRun(recipe, code, rd, None)


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    root = tmp_path / "recipes" / "m" / "h200"
    root.mkdir(parents=True)
    for name in ("a", "b", "c"):
        (root / f"{name}.yaml").write_bytes(SEED.read_bytes())
    return tmp_path / "recipes"


def test_nightly_page_shows_every_recipe_with_its_outcome(tmp_path, recipes):
    runs_dir = tmp_path / "runs"
    plan = {"a": {}, "b": {"step_time_s": 19.9}, "c": "recipe invalid: 1 problem"}
    stamp = time.time()
    result = nightly(
        [recipes],
        "local",
        runs_dir=runs_dir,
        runner=FakeRunner(tmp_path, plan),
        now=stamp,
    )
    path = write_nightly_page(
        runs_dir,
        result.entries,
        cluster="local",
        stamp=stamp,
        exit_code=result.exit_code,
        history_path=runs_dir / "history.sqlite",
    )
    assert path.name == f"nightly-{time.strftime('%Y-%m-%d', time.gmtime(stamp))}.html"
    html = path.read_text()
    assert_self_contained(html)
    c = parse(html)
    outcomes = [d["data-outcome"] for _, d in c.attrs if d.get("data-outcome")]
    assert outcomes == [e.outcome for e in result.entries]
    assert {"reproduced", "suspect", "invalid"} <= set(outcomes)  # b: a first miss
    hrefs = {d["href"] for tag, d in c.attrs if tag == "a" and d.get("href", "").endswith(".html")}
    assert len(hrefs) == 2 and all((path.parent / h).is_file() for h in hrefs)
    text = "".join(c.text)
    assert "recipe invalid: 1 problem" in text
    assert any(d.get("data-exit-code") == str(result.exit_code) for _, d in c.attrs)


def test_nightly_page_renders_from_plain_values():
    rows = history_rows()
    judged = assess_each(rows)

    class Entry:
        def __init__(self, r: RunRow, a) -> None:
            self.recipe = Path("recipes/x.yaml")
            self.run = RecipeRun(self.recipe, 0, None, None)
            self.row, self.assessment = r, a
            self.outcome = "regression" if a.regression else "reproduced"

    html = render_nightly_page(
        [Entry(rows[10], judged[10]), Entry(rows[11], judged[11])],
        cluster="aws-p5en",
        stamp=T0,
        exit_code=1,
        histories={SLUG: rows},
    )
    assert "1 regression(s)" in html and html.count("<svg") >= 2
