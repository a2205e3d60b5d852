"""`reproduce nightly`: orchestration with an injected runner, and the real run path for refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.history import DAY, T0, make_run_dir
from support.paths import REPO, SEED

from launcher.errors import BadInput
from launcher.records.history import History, index_run, runs, slug_of
from launcher.runner.nightly import RecipeRun, expand_targets, nightly

NOW = T0 + 30 * DAY


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    """recipes/m/h200/{a,b,c}.yaml: the seed with layout labels a, b, c (three recipes: a
    recipe's identity is its content)."""
    root = tmp_path / "recipes"
    (root / "m" / "h200").mkdir(parents=True)
    for name in ("c", "a", "b"):
        raw = yaml.safe_load(SEED.read_text())
        raw["layout"]["label"] = name
        (root / "m" / "h200" / f"{name}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return root


def slug(recipes: Path, name: str) -> str:
    return slug_of(str(recipes / "m" / "h200" / f"{name}.yaml"))


class FakeRunner:
    """Stands in for prepare + run_plan: writes the run directory a run with these figures would leave."""

    def __init__(self, plan: dict[str, object]) -> None:
        self.plan = plan
        self.calls: list = []

    def __call__(self, recipe: Path, options, *, held=None) -> RecipeRun:
        self.calls.append((recipe.name, options))
        what = self.plan[recipe.stem]
        if isinstance(what, BaseException):
            raise what
        if len(what) == 2:  # (exit code, message): refused before any run directory
            return RecipeRun(recipe, what[0], None, what[1])
        tps, claim, verdict, code = what
        started = NOW + len(self.calls)
        d = make_run_dir(
            options.runs_dir,
            options.run_id,
            tps=tps,
            claim=claim,
            verdict=verdict,
            slug=slug_of(str(recipe)),
            cluster="local",
            started=started,
        )
        return RecipeRun(recipe, code, d, None if code == 0 else "verdict not reproduced")


def seed_history(db: Path, runs_root: Path, slug: str, values: list[float]) -> None:
    for i, v in enumerate(values):
        index_run(
            make_run_dir(
                runs_root,
                f"2026000{i}T000000Z-old00{i}",
                tps=v,
                slug=slug,
                cluster="local",
                started=T0 + i * DAY,
            ),
            db,
        )


def test_nightly_runs_every_recipe_records_each_and_flags_the_trend_regression(recipes, tmp_path):
    runs_dir, db = tmp_path / "runs", tmp_path / "h.sqlite"
    sa, sb, sc = (slug(recipes, n) for n in "abc")
    seed_history(db, tmp_path / "old", sa, [1000.0, 1002.0, 998.0, 1001.0, 999.0])
    runner = FakeRunner(
        {
            "a": (950.0, 960.0, "reproduced", 0),  # within the claim, 5% below a steady trend
            "b": (1000.0, 1000.0, "reproduced", 0),  # first run: no trend yet
            "c": (3, "lost the connection to the node"),  # infra, no run directory
        }
    )
    lines: list[str] = []
    result = nightly(
        [recipes], "local", runs_dir=runs_dir, history=db, runner=runner, echo=lines.append, now=NOW
    )

    assert [name for name, _ in runner.calls] == ["a.yaml", "b.yaml", "c.yaml"]  # sorted, all run
    opts = [o for _, o in runner.calls]
    assert all(
        o.cluster == "local" and o.runs_dir == runs_dir and o.on_interrupt == "cancel" for o in opts
    )
    assert len({o.run_id for o in opts}) == 3

    outcomes = {e.row.slug: e.outcome for e in result.entries}
    # a first miss of the trend is suspect, not raised: the infrastructure failure decides
    assert outcomes == {sa: "suspect", sb: "reproduced", sc: "infra"}
    assert result.exit_code == 3
    a = result.entries[0].assessment
    assert a.trend_regression and not a.claim_regression and a.trend.median == 1000.0
    assert a.suspect and not a.regression
    assert "not enough history" in result.entries[1].assessment.trend.skipped

    # every recipe is in the history, the infra failure too, with its reason
    assert len(runs(sa, db=db)) == 6
    (c_row,) = runs(sc, db=db)
    assert (
        c_row.state == "failed" and c_row.verdict is None and "lost the connection" in c_row.detail
    )
    assert c_row.cluster_name == "local"

    summary = (runs_dir / "nightly-2026-10-21.md").read_text()
    assert result.summary_path == runs_dir / "nightly-2026-10-21.md"
    # every verdict with its assurance level (docs/measurement.md, "Assurance levels")
    assert (
        f"| {sa} | suspect | reproduced (host-verified) | 950.00 | -1.04% | -5.00% | suspect |"
        in summary
    )
    assert (
        f"| {sb} | reproduced | reproduced (host-verified) | 1,000.00 | +0.00% | n/a | no |"
        in summary
    )
    assert f"| {sc} | infra | - | - | - | - | n/a |" in summary
    assert "lost the connection to the node" in summary and "exit code 3" in summary

    # the next night misses again: two misses in a row are a regression, which outranks infra
    again = nightly(
        [recipes],
        "local",
        runs_dir=runs_dir,
        history=db,
        runner=runner,
        echo=lines.append,
        now=NOW + 86400,
    )
    outcomes = {e.row.slug: e.outcome for e in again.entries}
    assert outcomes[sa] == "regression" and again.exit_code == 1
    assert len(runs(sa, db=db)) == 7
    printed = "\n".join(lines)
    assert "regression" in printed and sc in printed and "exit 1" in printed


@pytest.mark.parametrize(
    "plan, code",
    [
        ({"a": (1000.0, 1000.0, "reproduced", 0), "b": (1010.0, 1000.0, "reproduced", 0)}, 0),
        ({"a": (1000.0, 1000.0, "reproduced", 0), "b": (3, "node never came up")}, 3),
        # a first slower run is a suspect miss, but its verdict is not reproduced: 1 (the
        # README's promise) outranks the infrastructure failure's 3
        ({"a": (700.0, 1000.0, "slower", 1), "b": (3, "node never came up")}, 1),
        ({"a": (700.0, 1000.0, "slower", 1), "b": (1000.0, 1000.0, "reproduced", 0)}, 1),
        ({"a": (1000.0, 1000.0, "incomplete", 1), "b": (1000.0, 1000.0, "reproduced", 0)}, 1),
        ({"a": (2, "invalid recipe"), "b": (1000.0, 1000.0, "reproduced", 0)}, 1),
        ({"a": RuntimeError("boom"), "b": (1000.0, 1000.0, "reproduced", 0)}, 3),
    ],
)
def test_exit_code_precedence(recipes, tmp_path, plan, code):
    (recipes / "m" / "h200" / "c.yaml").unlink()
    result = nightly(
        [recipes],
        "local",
        runs_dir=tmp_path / "runs",
        history=tmp_path / "h.sqlite",
        runner=FakeRunner(plan),
        echo=lambda _: None,
        now=NOW,
    )
    assert result.exit_code == code
    assert len(result.entries) == 2  # whatever happened to a, b ran


def test_a_crashing_runner_is_recorded_and_the_next_recipe_still_runs(recipes, tmp_path):
    runner = FakeRunner(
        {
            "a": RuntimeError("boom"),
            "b": (1000.0, 1000.0, "reproduced", 0),
            "c": (1000.0, 1000.0, "reproduced", 0),
        }
    )
    result = nightly(
        [recipes],
        "local",
        runs_dir=tmp_path / "runs",
        history=tmp_path / "h.sqlite",
        runner=runner,
        echo=lambda _: None,
        now=NOW,
    )
    assert [e.outcome for e in result.entries] == ["error", "reproduced", "reproduced"]
    (row,) = runs(slug(recipes, "a"), db=tmp_path / "h.sqlite")
    assert "RuntimeError: boom" in row.detail


def test_ctrl_c_stops_the_nightly_but_the_summary_is_written(recipes, tmp_path):
    runner = FakeRunner(
        {
            "a": (1000.0, 1000.0, "reproduced", 0),
            "b": KeyboardInterrupt(),
            "c": (1000.0, 1000.0, "reproduced", 0),
        }
    )
    result = nightly(
        [recipes],
        "local",
        runs_dir=tmp_path / "runs",
        history=tmp_path / "h.sqlite",
        runner=runner,
        echo=lambda _: None,
        now=NOW,
    )
    assert result.exit_code == 130 and len(runner.calls) == 2
    assert "interrupted" in result.summary_path.read_text()


def test_targets_expand_sorted_and_a_missing_target_or_cluster_is_bad_input(recipes, tmp_path):
    single = recipes / "m" / "h200" / "b.yaml"
    assert [p.name for p in expand_targets([single, recipes])] == [
        "b.yaml",
        "a.yaml",
        "b.yaml",
        "c.yaml",
    ]
    with pytest.raises(BadInput, match="does not exist"):
        expand_targets([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match="no \\*.yaml"):
        expand_targets([tmp_path / "empty"])
    with pytest.raises(BadInput):
        nightly(
            [recipes],
            "no-such-profile",
            runs_dir=tmp_path / "runs",
            history=tmp_path / "h.sqlite",
            runner=FakeRunner({}),
            echo=lambda _: None,
        )


def test_real_path_invalid_recipe_is_recorded_failed_and_the_next_recipe_still_goes_through(
    recipes, tmp_path
):
    """The default runner (prepare + run_plan): an invalid recipe fails validation (exit 2), the next
    one is prepared and refused by the budget guard before anything is launched (--max-hours)."""
    bad = recipes / "m" / "h200" / "a.yaml"
    bad.write_text(bad.read_text().replace("schema_version: 1", "schema_version: 7"))
    (recipes / "m" / "h200" / "c.yaml").unlink()
    db, runs_dir = tmp_path / "h.sqlite", tmp_path / "runs"
    result = nightly(
        [recipes],
        "local",
        runs_dir=runs_dir,
        history=db,
        max_hours=0.0001,
        echo=lambda _: None,
        now=NOW,
    )
    a, b = slug(recipes, "a"), slug(recipes, "b")  # an invalid recipe's content still names it
    assert [(e.row.slug, e.run.code, e.outcome) for e in result.entries] == [
        (a, 2, "invalid"),
        (b, 2, "invalid"),
    ]
    assert "schema_version" in result.entries[0].run.error
    assert (
        "--max-hours" in result.entries[1].run.error
        and "nothing was launched" in result.entries[1].run.error
    )
    with History(db) as hist:
        assert hist.slugs() == sorted([a, b])
        assert all(r.state == "failed" for s in hist.slugs() for r in hist.runs(s))
    assert not any(
        p.name != "history.sqlite" and p.suffix not in (".md", ".html") for p in runs_dir.iterdir()
    )  # no run dirs
    assert result.exit_code == 1


def test_cli_nightly_exit_code_and_summary(recipes, tmp_path):
    bad = recipes / "m" / "h200" / "a.yaml"
    bad.write_text("model: [unclosed\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher",
            "nightly",
            str(bad),
            "--cluster",
            "local",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--history",
            str(tmp_path / "h.sqlite"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "m/h200/a" in proc.stdout and "invalid" in proc.stdout
    assert list((tmp_path / "runs").glob("nightly-*.md"))
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "nightly", str(tmp_path / "nope"), "--cluster", "local"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    )


def test_a_locked_history_is_reported_and_the_nightly_still_runs_and_summarises(
    recipes, tmp_path, monkeypatch
):
    import sqlite3

    from launcher.records import history as history_module

    monkeypatch.setattr(history_module, "BUSY_TIMEOUT_S", 0.2)
    db = tmp_path / "h.sqlite"
    History(db).close()
    holder = sqlite3.connect(db)
    holder.execute("BEGIN EXCLUSIVE")  # a person importing runs holds the database
    lines: list[str] = []
    try:
        result = nightly(
            [recipes],
            "local",
            runs_dir=tmp_path / "runs",
            history=db,
            runner=FakeRunner(
                {
                    "a": (1000.0, 1000.0, "reproduced", 0),
                    "b": (1000.0, 1000.0, "reproduced", 0),
                    "c": (1000.0, 1000.0, "reproduced", 0),
                }
            ),
            echo=lines.append,
            now=NOW,
        )
    finally:
        holder.rollback()
        holder.close()
    assert [e.outcome for e in result.entries] == ["reproduced"] * 3  # every recipe ran
    assert result.exit_code == 3 and "locked by another process" in (result.history_error or "")
    summary = result.summary_path.read_text()
    assert "History not used" in summary and "locked" in summary
    assert any("history not used" in line for line in lines)


def test_a_damaged_history_refuses_the_nightly_before_the_first_recipe(recipes, tmp_path):
    from support.history import damage

    db = damage(tmp_path / "h.sqlite")
    runner = FakeRunner(dict.fromkeys("abc", (1000.0, 1000.0, "reproduced", 0)))
    with pytest.raises(BadInput, match="is damaged"):
        nightly([recipes], "local", runs_dir=tmp_path / "runs", history=db, runner=runner)
    assert runner.calls == []  # nothing was paid for
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "nightly", str(recipes), "--cluster", "local",
         "--history", str(db), "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "is damaged" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("run.json"))
