"""The pages in a real headless Chromium (Debian's `chromium`): each loads with no console error,
no exception and no request for anything but itself; the figures read from the DOM equal
result.yaml's; nothing overflows the window; and a screenshot of each page is kept. The last test
opens the pages as the real commands write them: a local run that reproduced, one that failed,
one cancelled with `reproduce cancel`, `reproduce history --html` and `reproduce nightly`.

Screenshots go to $REPRODUCE_TEST_ARTIFACTS/pages/, else <$REPRODUCE_TEST_LOG_DIR or
/var/log/reproduce-tests>/artifacts/pages/ (next to the apt and pip logs tests/run.sh keeps); the
directory is printed at the end of the module. Chromium missing is a FAILURE unless
REPRODUCE_TEST_NO_BROWSER=1 is set (tests/run.sh installs it).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from support.browser import Browser, artifacts_dir, chromium_path
from support.history import history_rows
from support.page_read import assert_shown_figures_match
from support.pages import SLUG, make_run, set_verdict

from launcher.pages import (
    NodeGroupView,
    render_nightly_page,
    write_history_page,
    write_run_page,
)
from launcher.pages.history_page import assess_each
from launcher.records.history import History
from launcher.runner.nightly import RecipeRun

FIGURES_JS = (
    "JSON.stringify(Object.fromEntries([...document.querySelectorAll("
    "'[data-figure]:not([data-run])')].map(e => [e.dataset.figure, e.textContent.trim()])))"
)
LAYOUT_JS = """JSON.stringify({
  overflow: document.documentElement.scrollWidth - window.innerWidth,
  title: document.title,
  status: (document.querySelector('[data-status]') || {dataset: {}}).dataset.status,
  svgs: [...document.querySelectorAll('svg')].length,
  emptySvgs: [...document.querySelectorAll('svg')]
    .filter(s => s.getBoundingClientRect().width < 1 || s.getBoundingClientRect().height < 1)
    .filter(s => s.closest('details') === null || s.closest('details').open).length,
  rings: [...document.querySelectorAll('circle[r="8"]')].length,
  regressionRows: [...document.querySelectorAll('tr.regression')].length,
  font: getComputedStyle(document.body).fontFamily,
})"""


@pytest.fixture(scope="module")
def browser():
    if os.environ.get("REPRODUCE_TEST_NO_BROWSER") == "1":
        pytest.skip("REPRODUCE_TEST_NO_BROWSER=1: browser tests skipped on request")
    if chromium_path() is None:
        pytest.fail(
            "chromium is not installed (tests/run.sh installs Debian's chromium); "
            "set REPRODUCE_TEST_NO_BROWSER=1 to skip the browser tests"
        )
    with Browser() as b:
        yield b


@pytest.fixture(scope="module")
def shots(request, tmp_path_factory):
    """Where screenshots go; the directory and the files are printed when the module ends."""
    where = artifacts_dir(tmp_path_factory.getbasetemp() / "artifacts") / "pages"
    where.mkdir(parents=True, exist_ok=True)
    kept: list[Path] = []
    yield where, kept
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None and kept:
        with capture.global_and_fixture_disabled():  # printed even when output is captured
            reporter.write_line(f"\npage screenshots ({len(kept)}) in {where}:")
            for path in kept:
                reporter.write_line(f"  {path.name}")


def load(browser: Browser, page: Path, shots, name: str, *, width: int = 1280) -> dict:
    """Open a page; assert it is clean; keep its screenshot; return its layout facts."""
    assert page.is_file(), page
    loaded = browser.open(page.resolve().as_uri(), width=width)
    assert loaded.problems() == [], loaded.problems()
    assert loaded.foreign_requests() == [], loaded.foreign_requests()
    facts = json.loads(browser.evaluate(LAYOUT_JS))
    where, kept = shots
    kept.append(browser.screenshot(where / f"{name}.png"))
    assert facts["title"]
    assert facts["overflow"] <= 0, (
        f"{name}: the page is {facts['overflow']} px wider than the window"
    )
    assert facts["emptySvgs"] == 0
    return facts


@pytest.mark.parametrize(
    ("name", "standin", "status"),
    [
        ("reproduced", {}, "reproduced"),
        ("slower", {"step_time_s": 19.9}, "slower"),
        ("unstable", {"step_times": ",".join(["18.96", "24.0"] * 10)}, "unstable"),
        ("incomplete", {"cut_at": 12}, "incomplete"),
        ("failed", {"nan_at": 12}, "failed"),
    ],
)
def test_run_page_in_chromium_shows_result_yaml(browser, shots, tmp_path, name, standin, status):
    rd = make_run(tmp_path, **standin)
    assert json.loads((rd / "verdict.json").read_text())["status"] == status
    facts = load(browser, write_run_page(rd), shots, f"run-{name}")
    assert facts["status"] == status
    assert facts["svgs"] >= 3  # step time, loss, the stage bar
    assert_shown_figures_match(json.loads(browser.evaluate(FIGURES_JS)), rd)


def test_run_page_with_convergence_mismatch_and_a_narrow_window(browser, shots, tmp_path):
    ref = make_run(tmp_path, "20261020T000000Z-ref000")
    rd = make_run(tmp_path, reference=ref, stack_differs="nccl")
    set_verdict(
        rd,
        "mismatch",
        reasons=["the log's global batch 64 differs from workload.global_batch 128"],
        mismatches=[{"field": "workload.global_batch", "recipe": 128, "log": 64}],
    )
    page = write_run_page(rd)
    facts = load(browser, page, shots, "run-mismatch")
    assert facts["status"] == "mismatch"
    assert_shown_figures_match(json.loads(browser.evaluate(FIGURES_JS)), rd)
    assert browser.evaluate("document.querySelector('[data-convergence]').textContent") == "pass"
    load(browser, page, shots, "run-mismatch-narrow", width=420)


def test_run_page_of_a_run_that_never_trained(browser, shots, tmp_path):
    rd = make_run(tmp_path, measure=False, state="failed", failed_stage="preflight-gpu")
    facts = load(browser, write_run_page(rd), shots, "run-not-measured")
    assert facts["status"] == "failed"
    shown = json.loads(browser.evaluate(FIGURES_JS))
    assert shown["tokens_per_s_per_gpu"] == "—"  # nothing measured, nothing made up


def test_history_page_in_chromium(browser, shots, tmp_path):
    runs = []
    # two slow runs in a row (5: suspect, 6: the regression)
    for i, step in enumerate((18.96, 18.99, 18.93, 19.02, 18.95, 19.9, 19.9)):
        rd = make_run(tmp_path, f"2026102{i}T094500Z-{i:06x}", step_time_s=step)
        write_run_page(rd)
        runs.append(rd)
    with History(tmp_path / "history.sqlite") as hist:
        for rd in runs:
            hist.record(rd)
        rows = hist.runs(SLUG)
    page = write_history_page(tmp_path / "history.html", SLUG, rows)
    facts = load(browser, page, shots, "history-measured")
    shown = browser.evaluate(
        "[...document.querySelectorAll('[data-run]')].map(e => e.textContent.trim())"
    )
    assert sorted(shown) == sorted(f"{r.tokens_per_s_per_gpu:,.2f}" for r in rows)
    assert facts["regressionRows"] == sum(a.regression for a in assess_each(rows)) == 1


def test_history_and_nightly_pages_of_a_long_history(browser, shots, tmp_path):
    rows = history_rows()
    page = tmp_path / "history-long.html"
    write_history_page(page, SLUG, rows, claims={"mfu": 0.1276, "usd_per_million_tokens": 0.32})
    facts = load(browser, page, shots, "history-long")
    assert facts["rings"] == 3  # the one regression, in each of the three charts
    assert facts["regressionRows"] == 1

    judged = assess_each(rows)

    class Entry:
        def __init__(self, i: int, outcome: str, error: str | None = None) -> None:
            self.recipe = Path(f"recipes/{i}.yaml")
            self.run = RecipeRun(self.recipe, 0 if outcome == "reproduced" else 1, None, error)
            self.row, self.assessment, self.outcome = rows[i], judged[i], outcome

    nightly = tmp_path / "nightly.html"
    nightly.write_text(
        render_nightly_page(
            [Entry(11, "reproduced"), Entry(10, "regression"), Entry(5, "infra", "no capacity")],
            cluster="aws-p5en",
            stamp=time.time(),
            exit_code=1,
            histories={SLUG: rows},
            groups=[
                NodeGroupView(
                    label="aws p5en.48xlarge x1",
                    run_ids=[rows[11].run_id, rows[10].run_id],
                    lines=[
                        "node group aws p5en.48xlarge x1: 2 recipe(s) on one node",
                        "  acquired once in 312 s (held by runs/a); released once in 41 s",
                    ],
                    held_gpu_hours=3.5,
                    shared_gpu_hours=0.9,
                    own={rows[11].run_id: 1.4, rows[10].run_id: 1.2},
                )
            ],
        )
    )
    facts = load(browser, nightly, shots, "nightly")
    assert facts["regressionRows"] == 1
    outcomes = browser.evaluate(
        "[...document.querySelectorAll('[data-outcome]')].map(e => e.dataset.outcome)"
    )
    assert outcomes == ["reproduced", "regression", "infra"]
    node = browser.evaluate(
        "(() => { const g = document.querySelector('[data-node-group]');"
        " return {label: g.dataset.nodeGroup, runs: g.querySelectorAll('ol li a').length,"
        " visible: g.getBoundingClientRect().height > 0}; })()"
    )
    assert node == {"label": "aws p5en.48xlarge x1", "runs": 2, "visible": True}


def test_the_harness_sees_console_errors_exceptions_and_requests(browser, tmp_path):
    """The checks above would catch a broken page: this one has each fault once."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!doctype html><title>bad</title>"
        '<img src="http://192.0.2.1/x.png">'
        "<script>console.error('an error'); undefined_function();</script>"
    )
    loaded = browser.open(bad.resolve().as_uri())
    problems = "\n".join(loaded.problems())
    assert "console.error: an error" in problems
    assert "undefined_function" in problems
    assert loaded.foreign_requests() == ["http://192.0.2.1/x.png"]
    with pytest.raises(Exception, match="only file:// and 127.0.0.1"):
        browser.open("https://example.com/")


# --- the pages as the real paths make them: a run (done, failed, cancelled), history, nightly ----


@pytest.fixture(scope="module")
def real_paths(test_image, container_run_args, tmp_path_factory):
    """`reproduce RECIPE --cluster <local profile>` three times (reproduced, failed in training,
    cancelled with `reproduce cancel`), `reproduce nightly` (the recipe again and an invalid one),
    then `reproduce history --html`: every page written by the command a user runs."""
    from support.helpers import cli, start_cli, wait_for
    from support.plan_env import write_profile, write_recipe

    base = tmp_path_factory.mktemp("real-pages")
    profile = write_profile(base, {"kind": "local"}, container_run_args)
    runs = base / "runs"
    common = ["--cluster", str(profile), "--runs-dir", str(runs), "--on-interrupt", "cancel"]

    def run_dir_of(recipe: Path) -> Path:
        from launcher.inputs.recipe import load_recipe

        (found,) = [p.parent for p in (runs / load_recipe(recipe).slug).glob("*/run.json")]
        return found

    good = write_recipe(base, test_image)
    done = cli(str(good), *common, timeout=400)
    assert done.returncode == 0, done.stderr
    broken = write_recipe(
        base, test_image, run_prefix="echo the recipe broke >&2; exit 3", name="b"
    )
    failed = cli(str(broken), *common, timeout=400)
    assert failed.returncode in (1, 3), failed.stderr
    slow = write_recipe(base, test_image, run_prefix="echo waiting; sleep 300", name="slow")
    proc = start_cli(str(slow), *common)
    try:
        wait_for(lambda: _train_started(runs, slow), 300, what="the slow run's training")
        assert cli("cancel", str(run_dir_of(slow))).returncode == 0
        proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    invalid = base / "recipes" / "invalid.yaml"
    invalid.write_text("schema_version: 1\nmodel: nothing else\n")
    night = cli("nightly", str(good), str(invalid), "--cluster", str(profile), "--runs-dir",
                str(runs), timeout=600)  # fmt: skip
    assert night.returncode == 1, night.stdout + night.stderr  # the invalid recipe
    history = cli("history", str(good), "--runs-dir", str(runs), "--html", str(base / "h.html"))
    assert history.returncode == 0 and "history page:" in history.stdout, history.stderr
    (nightly_page,) = runs.glob("nightly-*.html")
    return {
        "done": _first_run(runs, good),
        "failed": run_dir_of(broken),
        "cancelled": run_dir_of(slow),
        "history": base / "h.html",
        "nightly": nightly_page,
    }


def _first_run(runs: Path, recipe: Path) -> Path:
    from launcher.inputs.recipe import load_recipe

    return sorted(p.parent for p in (runs / load_recipe(recipe).slug).glob("*/run.json"))[0]


def _train_started(runs: Path, recipe: Path) -> bool:
    from launcher.inputs.recipe import load_recipe

    for p in (runs / load_recipe(recipe).slug).glob("*/timeline.json"):
        stages = json.loads(p.read_text()).get("stages", [])
        if any(s["name"] == "train" for s in stages):
            return True
    return False


@pytest.mark.docker
def test_the_real_paths_write_every_page_and_each_loads_clean(browser, shots, real_paths):
    done = real_paths["done"]
    facts = load(browser, done / "report.html", shots, "real-run-reproduced")
    assert facts["status"] == "reproduced"
    assert_shown_figures_match(json.loads(browser.evaluate(FIGURES_JS)), done)

    facts = load(browser, real_paths["failed"] / "report.html", shots, "real-run-failed")
    assert facts["status"] in ("failed", "incomplete")

    cancelled = real_paths["cancelled"]
    assert json.loads((cancelled / "status.json").read_text())["state"] == "cancelled"
    facts = load(browser, cancelled / "report.html", shots, "real-run-cancelled")
    assert facts["status"] == "cancelled"

    facts = load(browser, real_paths["history"], shots, "real-history")
    shown = browser.evaluate(
        "[...document.querySelectorAll('[data-run]')].map(e => e.textContent.trim())"
    )
    assert len(shown) >= 2  # the first run and the nightly's run of the same recipe

    load(browser, real_paths["nightly"], shots, "real-nightly")
    outcomes = browser.evaluate(
        "[...document.querySelectorAll('[data-outcome]')].map(e => e.dataset.outcome)"
    )
    assert sorted(outcomes) == ["invalid", "reproduced"]
