"""History (SQLite) and the regression rules of docs/measurement.md, on hand-built histories and real files."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest
import yaml
from support.cli import completed_here
from support.history import DAY, SEED_FILE, SLUG, T0, damage, make_run_dir
from support.paths import REPO

from launcher.errors import BadInput
from launcher.inputs.recipe import load_recipe
from launcher.pages.report import history_report
from launcher.records.history import (
    History,
    RunRow,
    assess_history,
    check_regression,
    import_runs,
    index_run,
    runs,
    spread,
    trend_of,
)


def row(
    n: int,
    tps: float | None,
    verdict: str | None = "reproduced",
    *,
    claim: float = 1000.0,
    cluster: str = "aws",
    state: str = "done",
) -> RunRow:
    """Run n of a hand-built history: one a day, its difference vs `claim` as the verdict computes it."""
    diff = None if tps is None else 100.0 * (tps - claim) / claim
    return RunRow(
        run_id=f"r{n:03d}",
        slug=SLUG,
        cluster_name=cluster,
        started_at=T0 + n * DAY,
        state=state,
        verdict=verdict,
        difference_percent=diff,
        claimed_tokens_per_s_per_gpu=claim,
        tolerance_percent=3.0,
        tokens_per_s_per_gpu=tps,
    )


def history_of(values: list[float], **kw) -> list[RunRow]:
    return [row(i, v, **kw) for i, v in enumerate(values)]


STEADY = [1000.0, 1002.0, 998.0, 1001.0, 999.0, 1000.0, 1003.0]
NOISY = [1000.0, 1090.0, 910.0, 1080.0, 920.0, 1100.0, 900.0]


# --- the rules (pure) ---


def test_spread_is_1_4826_mad_as_percent_of_the_median():
    med, mad, pct = spread([100.0, 102.0, 98.0, 101.0, 99.0])
    assert (med, mad) == (100.0, 1.0)
    assert pct == pytest.approx(1.4826)


def test_steady_history_then_a_5_percent_drop_is_a_trend_regression():
    earlier = history_of(STEADY)
    # 950 is within the claim's tolerance (claim 960: -1.0%), so only the trend can catch it.
    first = row(7, 950.0, claim=960.0)
    once = check_regression(first, earlier)  # a first miss: suspect, not yet a regression
    assert once.judged and once.suspect and not once.regression and once.trend_regression
    assert any("suspect" in r for r in once.reasons)
    second = check_regression(
        row(8, 950.0, claim=960.0), [*earlier, first]
    )  # a second miss raises it
    assert second.judged and second.regression and not second.suspect
    assert any("missed too" in r for r in second.reasons)
    a = once
    assert a.trend.median == 1000.0
    assert a.trend.difference_percent == pytest.approx(-5.0)
    assert a.trend.threshold_percent == 3.0  # the spread (~0.15%) is below the tolerance
    assert [r for r, _ in a.trend.points] == [f"r{i:03d}" for i in range(7)]
    assert any("below the trend" in r for r in a.reasons)


def test_a_miss_after_a_good_run_is_suspect_again_and_failed_runs_between_misses_pass_over():
    earlier = history_of(STEADY)
    miss = row(7, 950.0, claim=960.0)
    good = row(8, 1000.0, claim=960.0)
    again = check_regression(row(9, 950.0, claim=960.0), [*earlier, miss, good])
    assert again.suspect and not again.regression
    failed = row(8, None, "failed", state="failed")
    raised = check_regression(row(9, 950.0, claim=960.0), [*earlier, miss, failed])
    assert raised.regression and not raised.suspect


def test_noisy_history_the_same_drop_is_within_3_mad_and_not_a_regression():
    a = check_regression(row(7, 950.0, claim=960.0), history_of(NOISY))
    assert a.judged and not a.regression and not a.trend_regression
    # MAD 90 -> spread 13.34%, threshold 40.0%: a -5% run is noise here
    assert a.trend.mad == 90.0
    assert a.trend.spread_percent == pytest.approx(100 * 1.4826 * 90 / 1000)
    assert a.trend.threshold_percent == pytest.approx(3 * 13.3434)
    assert any("within the trend" in r for r in a.reasons)


def test_fewer_than_3_good_runs_skip_the_trend_test_with_a_reason():
    a = check_regression(row(2, 500.0, claim=960.0, verdict="slower"), history_of([1000.0, 1001.0]))
    assert (
        a.trend.skipped
        and "not enough history" in a.trend.skipped
        and "2 good run" in a.trend.skipped
    )
    assert not a.trend_regression
    # the claim test still runs: -47.9% against the claim is a miss without any history (a
    # first one: suspect)
    assert a.claim_regression and a.suspect and not a.regression


def test_no_history_and_a_reproduced_run_is_not_a_regression():
    a = check_regression(row(0, 1000.0), [])
    assert not a.regression and a.judged and "not enough history" in a.trend.skipped


def test_failed_and_slower_runs_are_excluded_from_the_baseline():
    earlier = [
        row(0, 1000.0),
        row(1, 400.0, "failed", state="failed"),
        row(2, 1001.0),
        row(3, 100.0, "incomplete"),
        row(4, 900.0, "slower"),
        row(5, None, None, state="failed"),
        row(6, 999.0),
    ]
    t = trend_of(950.0, earlier)
    assert [r for r, _ in t.points] == ["r000", "r002", "r006"]
    assert t.median == 1000.0
    # with only two good runs among many failures, the trend test is skipped
    t2 = trend_of(950.0, earlier[:5])
    assert t2.skipped and "2 good run" in t2.skipped


def test_only_the_last_k_good_runs_form_the_baseline():
    earlier = history_of([2000.0] * 5 + STEADY)  # old, much faster runs are out of the window of 7
    a = check_regression(row(20, 990.0, claim=1000.0), earlier)
    assert len(a.trend.points) == 7 and a.trend.median == 1000.0 and not a.regression


def test_a_faster_run_counts_as_good_for_the_baseline():
    earlier = history_of([1100.0, 1100.0, 1100.0], verdict="faster")
    assert len(trend_of(1000.0, earlier).points) == 3


def test_a_failed_latest_run_is_not_judged_and_not_a_regression():
    a = check_regression(row(7, 10.0, "failed", state="failed"), history_of(STEADY))
    assert not a.judged and not a.regression and "not judged" in a.reasons[0]


def test_assess_history_compares_only_runs_on_the_same_cluster():
    rows = history_of(STEADY, cluster="local") + [row(10, 950.0, claim=960.0, cluster="aws")]
    a = assess_history(rows)
    assert a.trend.skipped and not a.regression


# --- the database ---


def test_record_reads_every_field_and_rerecording_replaces(tmp_path):
    db = tmp_path / "h.sqlite"
    d = make_run_dir(tmp_path / "runs", "20260101T000000Z-abc123", tps=990.5)
    r = index_run(d, db)
    assert (r.run_id, r.slug, r.recipe_sha256) == ("20260101T000000Z-abc123", SLUG, "f" * 64)
    assert (r.cluster_name, r.cluster_kind, r.state, r.verdict) == (
        "aws",
        "aws",
        "done",
        "reproduced",
    )
    assert r.tokens_per_s_per_gpu == 990.5 and r.mfu == 0.12757 and r.gpu_hours == 1.3333
    assert r.usd_per_million_tokens == 0.318 and r.step_time_cv_percent == 0.51
    assert r.difference_percent == pytest.approx(-0.95) and r.tolerance_percent == 3.0
    assert (r.started_at, r.ended_at) == (T0, T0 + 600)
    assert r.image.endswith("a" * 64)
    # the image digest verified on the node wins over the plan's
    (d / "image.json").write_text(json.dumps({"image": "ghcr.io/x/miles@sha256:" + "b" * 64}))
    (d / "verdict.json").write_text(
        (d / "verdict.json").read_text().replace('"reproduced"', '"slower"')
    )
    index_run(d, db)
    got = runs(SLUG, db=db)
    assert len(got) == 1 and got[0].verdict == "slower" and got[0].image.endswith("b" * 64)
    con = sqlite3.connect(db)
    assert con.execute("select version from schema_version").fetchall() == [(4,)]
    assert con.execute("select count(*) from runs").fetchone() == (1,)


def test_a_newer_schema_is_refused_and_a_non_database_is_bad_input(tmp_path):
    db = tmp_path / "h.sqlite"
    History(db).close()
    con = sqlite3.connect(db)
    con.execute("update schema_version set version = 99")
    con.commit()
    con.close()
    with pytest.raises(BadInput, match="schema version 99"):
        History(db)
    junk = tmp_path / "junk.sqlite"
    junk.write_text("this is not sqlite " * 100)
    with pytest.raises(BadInput, match="not a usable SQLite"):
        History(junk)


def test_record_refuses_a_directory_that_is_not_a_run(tmp_path):
    with pytest.raises(BadInput, match="not a run directory"):
        index_run(tmp_path, tmp_path / "h.sqlite")


def test_runs_are_oldest_first_and_limit_keeps_the_latest(tmp_path):
    db = tmp_path / "h.sqlite"
    for i in (3, 1, 2, 0):
        index_run(make_run_dir(tmp_path / "runs", f"run{i}", started=T0 + i * DAY), db)
    assert [r.run_id for r in runs(SLUG, db=db)] == ["run0", "run1", "run2", "run3"]
    assert [r.run_id for r in runs(SLUG, 2, db=db)] == ["run2", "run3"]


def test_import_records_finished_runs_skips_running_ones_and_is_idempotent(tmp_path):
    root, db = tmp_path / "runs", tmp_path / "h.sqlite"
    make_run_dir(root, "a", started=T0)
    make_run_dir(root, "b", started=T0 + DAY, verdict=None, state="failed")
    make_run_dir(root, "c", started=T0 + 2 * DAY, state="running", verdict=None)
    (root / "other").mkdir()
    (root / "other" / "run.json").write_text(
        "{not json"
    )  # a broken directory is skipped, not fatal
    recorded, skipped = import_runs(root, db)
    assert sorted(r.run_id for r in recorded) == ["a", "b"]
    assert any("not finished" in s for s in skipped) and any("other" in s for s in skipped)
    import_runs(root, db)
    got = runs(SLUG, db=db)
    assert [(r.run_id, r.state, r.verdict) for r in got] == [
        ("a", "done", "reproduced"),
        ("b", "failed", None),
    ]


def test_record_reads_what_measure_run_dir_really_writes(tmp_path):
    from support.measure import SEED, run_standin, seed_raw, seed_recipe, step_times_for_tps

    from launcher.results.evaluate import measure_run_dir

    run_dir = tmp_path / "runs" / SLUG / "20261021T100000Z-0a0b0c"
    assert run_standin(run_dir / "logs" / "train.log", step_time_s=step_times_for_tps(6500.0)) == 0
    (run_dir / "run.json").write_text(
        json.dumps({"run_id": run_dir.name, "slug": SLUG, "created_at": T0})
    )
    (run_dir / "status.json").write_text(json.dumps({"state": "done", "updated_at": T0 + 1}))
    (run_dir / "recipe.yaml").write_text(SEED.read_text())
    result, verdict = measure_run_dir(run_dir, seed_recipe(), write_plots=False)
    r = index_run(run_dir, tmp_path / "h.sqlite")
    assert result.tokens_per_s_per_gpu == pytest.approx(6500.0) and verdict.status == "slower"
    assert r.tokens_per_s_per_gpu == pytest.approx(result.tokens_per_s_per_gpu)
    assert r.mfu == pytest.approx(result.mfu) and r.usd_per_million_tokens == pytest.approx(
        result.usd_per_million_tokens
    )
    assert r.verdict == verdict.status and r.difference_percent == pytest.approx(
        verdict.difference_percent
    )
    assert (
        r.tolerance_percent == 3.0
        and r.claimed_tokens_per_s_per_gpu == seed_raw()["result"]["tokens_per_s_per_gpu"]
    )
    import hashlib

    assert r.recipe_sha256 == hashlib.sha256(SEED.read_bytes()).hexdigest()


# --- `reproduce history` through the real CLI ---


def cli(*args) -> subprocess.CompletedProcess:
    return completed_here(
        *map(str, args), cwd=REPO, unset=("REPRODUCE_HISTORY", "REPRODUCE_RUNS_DIR")
    )


def build_history(tmp_path: Path, values: list[float], last: float, claim: float = 960.0) -> Path:
    root = tmp_path / "runs"
    for i, v in enumerate(values + [last]):
        make_run_dir(
            root,
            f"2026010{i}T000000Z-00000{i}",
            tps=v,
            claim=claim,
            started=T0 + i * DAY,
            verdict="slower"
            if v < 0.97 * claim
            else ("faster" if v > 1.03 * claim else "reproduced"),
        )
    return root


def test_cli_history_flags_a_regression_with_exit_1_and_shows_the_trend(tmp_path):
    # two misses in a row (-5% against the claim): the second is a regression
    root = build_history(tmp_path, [1000.0, 1002.0, 998.0, 1001.0, 950.0], 950.0, claim=1000.0)
    db = tmp_path / "h.sqlite"
    proc = cli("history", "--import", root, "--history", db)
    assert proc.returncode == 0, proc.stderr
    assert "recorded 6 run(s)" in proc.stdout
    proc = cli("history", SLUG, "--history", db, "--runs-dir", tmp_path / "empty")
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "20260105T000000Z-000005" in out and "REGRESSION" in out
    assert "median 1,000.50" in out and "[1,000.0, 1,002.0, 998.0, 1,001.0]" in out
    assert "below the recipe's claim: -5.00%" in out
    proc = cli(
        "history", SLUG, "--history", db, "--json", "--limit", "2", "--runs-dir", tmp_path / "empty"
    )
    data = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert [r["run_id"] for r in data["runs"]] == [
        "20260104T000000Z-000004",
        "20260105T000000Z-000005",
    ]
    assert data["latest"]["regression"] and data["latest"]["claim_regression"]
    assert (
        data["latest"]["trend"]["median"] == 1000.5 and len(data["latest"]["trend"]["points"]) == 4
    )


def test_cli_history_exit_0_when_the_latest_holds_and_recipe_file_gives_the_slug(tmp_path):
    root = build_history(tmp_path, [1000.0, 1002.0, 998.0], 995.0, claim=1000.0)
    db = tmp_path / "h.sqlite"
    recipe = SEED_FILE
    proc = cli(
        "history",
        recipe,
        "--import",
        root,
        "--history",
        db,
        "--json",
        "--runs-dir",
        tmp_path / "empty",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # one JSON object, import included
    assert len(data["import"]["recorded"]) == 4 and data["latest"]["regression"] is False
    assert "within the trend" in data["latest"]["reasons"][0]


def test_cli_history_unknown_slug_is_bad_input_without_traceback(tmp_path):
    proc = cli(
        "history", "no/such/recipe", "--history", tmp_path / "h.sqlite", "--runs-dir", tmp_path
    )
    assert proc.returncode == 2
    assert "no runs of 'no/such/recipe'" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_history_indexes_the_recipes_own_run_directories_first(tmp_path, reproduce_home):
    """Runs made by plain `reproduce RECIPE` (never recorded) show up: <runs dir>/<slug>/ is
    indexed. The default history is the user's state directory's, and a query creates no file."""
    root = build_history(tmp_path, [1000.0, 1002.0, 998.0, 700.0], 700.0, claim=1000.0)
    proc = cli("history", SLUG, "--runs-dir", root, "--json")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert len(data["runs"]) == 5 and data["history"] == str(reproduce_home / "history.sqlite")
    assert not (reproduce_home / "history.sqlite").exists()
    assert not (root / "history.sqlite").exists()
    assert data["latest"]["claim_regression"] and data["latest"]["trend_regression"]


# ---------------------------------------------------------------------------------------------
# Recipe identity in the history: the content slug, and databases of the previous schema


_V1_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES (1);
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, slug TEXT NOT NULL, recipe_sha256 TEXT, run_dir TEXT,
    cluster_name TEXT, cluster_kind TEXT, started_at REAL, ended_at REAL, state TEXT,
    verdict TEXT, difference_percent REAL, claimed_tokens_per_s_per_gpu REAL,
    tolerance_percent REAL, tokens_per_s_per_gpu REAL, step_time_cv_percent REAL, mfu REAL,
    usd_per_million_tokens REAL, gpu_hours REAL, image TEXT, detail TEXT, recorded_at REAL NOT NULL
);
"""


def test_a_version_1_database_is_migrated_and_its_rows_still_read(tmp_path):
    """Version 1 keyed runs on the recipe's file path; after opening, they are keyed on their
    recipe's content (when the run kept its recipe.yaml) and found under the old name too."""
    old_slug = "qwen3-30b-a3b/h200/attune-tp1-pp1-ep8-mt16k"
    kept = tmp_path / "runs" / old_slug / "r1"
    kept.mkdir(parents=True)
    (kept / "recipe.yaml").write_text(SEED_FILE.read_text())
    db = tmp_path / "v1.sqlite"
    con = sqlite3.connect(db)
    con.executescript(_V1_SCHEMA)
    for run_id, run_dir, tps in (("r1", str(kept), 1000.0), ("r2", "/gone/r2", 990.0)):
        con.execute(
            "INSERT INTO runs (run_id, slug, run_dir, verdict, tokens_per_s_per_gpu, "
            "recorded_at) VALUES (?, ?, ?, 'reproduced', ?, 1.0)",
            (run_id, old_slug, run_dir, tps),
        )
    con.commit()
    con.close()
    with History(db) as hist:
        by_content = hist.runs(SLUG)
        by_old_name = hist.runs(old_slug)
    assert [r.run_id for r in by_content] == ["r1"] and by_content[0].legacy_slug == old_slug
    assert sorted(r.run_id for r in by_old_name) == ["r1", "r2"]  # the vanished run stays readable
    assert by_content[0].tokens_per_s_per_gpu == 1000.0
    con = sqlite3.connect(db)
    assert con.execute("select version from schema_version").fetchall() == [(4,)]


def test_a_version_2_database_gains_measured_runs_and_its_rows_still_read(tmp_path):
    """Version 3 keeps K (the row's figures are the mean of K measured runs); a version 2
    database is migrated on open, its rows one run each (null), a new row of K runs keeps K."""
    db = tmp_path / "v2.sqlite"
    con = sqlite3.connect(db)
    con.executescript(_V1_SCHEMA.replace("VALUES (1)", "VALUES (2)").replace(
        "recorded_at REAL NOT NULL", "recorded_at REAL NOT NULL, legacy_slug TEXT"
    ))  # fmt: skip
    con.execute(
        "INSERT INTO runs (run_id, slug, verdict, tokens_per_s_per_gpu, recorded_at) "
        "VALUES ('r1', ?, 'reproduced', 1000.0, 1.0)",
        (SLUG,),
    )
    con.commit()
    con.close()
    with History(db) as hist:
        (old,) = hist.runs(SLUG)
        assert old.measured_runs is None and old.tokens_per_s_per_gpu == 1000.0
        hist.insert(RunRow(run_id="r2", slug=SLUG, measured_runs=3, recorded_at=2.0))
        assert [r.measured_runs for r in hist.runs(SLUG)] == [None, 3]
    con = sqlite3.connect(db)
    assert con.execute("select version from schema_version").fetchall() == [(4,)]
    text = history_report(SLUG, [RunRow(run_id="r", slug=SLUG, tokens_per_s_per_gpu=6913.0,
                                        measured_runs=3)], None)  # fmt: skip
    assert "6,913.00 (mean of 3)" in text


def test_two_recipes_with_one_file_name_are_two_histories(tmp_path):
    seed = yaml.safe_load(SEED_FILE.read_text())
    other = yaml.safe_load(SEED_FILE.read_text())
    other["gpu"]["type"], other["gpu"]["memory_gb"] = "H100", 80
    other["gpu"]["instance"] = "AWS p5.48xlarge"  # the H100 instance (validate checks it)
    a, b = tmp_path / "a" / "h200" / "tp1.yaml", tmp_path / "b" / "h100" / "tp1.yaml"
    for path, raw in ((a, seed), (b, other)):
        path.parent.mkdir(parents=True)
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert load_recipe(a).slug != load_recipe(b).slug
    moved = tmp_path / "elsewhere.yaml"
    moved.write_text(SEED_FILE.read_text() + "# a comment does not change the recipe\n")
    assert load_recipe(moved).slug == load_recipe(a).slug == SLUG


def test_a_run_dir_of_an_older_launcher_joins_its_recipes_history(tmp_path):
    d = make_run_dir(tmp_path / "runs", "r-old", slug="qwen3-30b-a3b/h200/attune-tp1-pp1-ep8-mt16k")
    (d / "recipe.yaml").write_text(SEED_FILE.read_text())
    r = index_run(d, tmp_path / "h.sqlite")
    assert (r.slug, r.legacy_slug) == (SLUG, "qwen3-30b-a3b/h200/attune-tp1-pp1-ep8-mt16k")


def test_a_locked_database_is_a_clear_error_not_a_traceback(tmp_path, monkeypatch):
    from launcher.records import history as history_module

    monkeypatch.setattr(history_module, "BUSY_TIMEOUT_S", 0.2)
    db = tmp_path / "h.sqlite"
    History(db).close()
    holder = sqlite3.connect(db)
    holder.execute("BEGIN EXCLUSIVE")  # another writer holds the database
    try:
        with pytest.raises(history_module.HistoryUnavailable, match="locked by another process"):
            index_run(make_run_dir(tmp_path / "runs", "r1"), db)
    finally:
        holder.rollback()
        holder.close()


def test_a_database_damaged_behind_a_readable_schema_is_bad_input_at_open(tmp_path):
    db = damage(tmp_path / "h.sqlite")
    with pytest.raises(BadInput, match="is damaged") as info:
        History(db)
    assert str(db) in str(info.value) and "--import" in str(info.value)


def test_cli_history_of_a_damaged_database_is_exit_2_without_traceback(tmp_path):
    db = damage(tmp_path / "h.sqlite")
    proc = cli("history", SLUG, "--history", db, "--runs-dir", tmp_path / "empty")
    assert proc.returncode == 2, proc.stderr
    assert "is damaged" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("history", SLUG, "--history", db, "--runs-dir", tmp_path / "empty", "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["exit_code"] == 2


def test_damage_found_after_opening_is_a_clear_error_too(tmp_path, monkeypatch):
    db = tmp_path / "h.sqlite"
    hist = History(db)
    damage(tmp_path / "other.sqlite")
    # the file changes under an open connection: every read and write says so, never a traceback
    hist.conn.close()
    hist.conn = sqlite3.connect(tmp_path / "other.sqlite")
    hist.conn.row_factory = sqlite3.Row
    from launcher.records.history import HistoryDamaged

    with pytest.raises(HistoryDamaged, match="is damaged"):
        hist.runs(SLUG)
    with pytest.raises(HistoryDamaged, match="is damaged"):
        hist.insert(RunRow(run_id="r-new", slug=SLUG, cluster_name="local", state="done"))
    hist.close()
