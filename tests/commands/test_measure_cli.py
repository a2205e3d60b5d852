"""`reproduce measure` and `reproduce compare` as a user runs them: output, JSON contract, exit codes."""

from __future__ import annotations

import json
import subprocess

import pytest
from support.cli import completed_here
from support.measure import REPO, SEED, run_standin, seed_raw, step_times_for_tps


def cli(*args: str) -> subprocess.CompletedProcess:
    return completed_here(*map(str, args), cwd=REPO)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    claim = seed_raw()["result"]["tokens_per_s_per_gpu"]
    made = {
        "good": {"step_time_s": step_times_for_tps(claim)},
        "slow": {"step_time_s": step_times_for_tps(claim * 0.9)},
        "nan": {"step_time_s": step_times_for_tps(claim), "nan_at": 15},
        "scaled": {"step_time_s": step_times_for_tps(claim), "loss_scale": 1.2},
    }
    out = {}
    for name, env in made.items():
        out[name] = root / name / "logs" / "train.log"
        run_standin(out[name], steps=20, **env)
        (root / name / "run.json").write_text(json.dumps({"run_id": name}))  # a run directory
    out["short"] = root / "short" / "logs" / "train.log"
    run_standin(out["short"], steps=20, step_time_s=step_times_for_tps(claim), cut_at=12)
    return out


def test_json_is_one_object_with_the_contract_fields_and_exit_0_when_reproduced(logs):
    proc = cli("measure", logs["good"], "--recipe", SEED, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # exactly one JSON document: json.loads rejects trailing data
    for key in (
        "tokens_per_s_per_gpu",
        "step_time_cv_percent",
        "mfu",
        "usd_per_million_tokens",
        "window",
        "steps_parsed",
        "verdict",
    ):
        assert key in data
    assert data["verdict"]["status"] == "reproduced"
    assert data["window"] == [5, 19] and data["steps_parsed"] == 20
    assert round(data["mfu"], 4) == 0.1276 and round(data["usd_per_million_tokens"], 2) == 0.32
    assert data["price"]["usd_per_hour"] == 63.296


def test_slower_run_exits_1_with_a_negative_difference(logs):
    proc = cli("measure", logs["slow"], "--recipe", SEED, "--json")
    assert proc.returncode == 1
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["status"] == "slower" and verdict["difference_percent"] == pytest.approx(
        -10.0, abs=0.01
    )
    assert verdict["reasons"]


def test_tolerance_flag_changes_the_verdict(logs):
    proc = cli("measure", logs["slow"], "--recipe", SEED, "--json", "--tolerance-slower", "11")
    assert proc.returncode == 0 and json.loads(proc.stdout)["verdict"]["status"] == "reproduced"


def test_nan_and_killed_runs_are_never_reproduced(logs):
    nan = cli("measure", logs["nan"], "--recipe", SEED, "--json")
    assert nan.returncode == 1 and json.loads(nan.stdout)["verdict"]["status"] == "failed"
    short = cli("measure", logs["short"], "--recipe", SEED, "--json")
    assert short.returncode == 1 and json.loads(short.stdout)["verdict"]["status"] == "incomplete"


def test_human_output_prints_every_figure_and_the_price_used(logs):
    proc = cli("measure", logs["good"], "--recipe", SEED, "--price-per-hour", "50")
    assert proc.returncode == 0
    for text in (
        "tokens/s per GPU",
        "MFU",
        "$ per 1M tokens",
        "step-time CV",
        "population",
        "$50.0/h",
        "override",
        "REPRODUCED",
    ):
        assert text in proc.stdout, text


def test_run_dir_mode_writes_artifacts(logs):
    run_dir = logs["good"].parent.parent
    proc = cli("measure", run_dir, "--recipe", SEED)
    assert proc.returncode == 0
    assert (run_dir / "result.yaml").is_file() and (run_dir / "report.md").is_file()


def test_bad_input_exits_2_with_one_line_and_no_traceback(logs, tmp_path):
    missing = cli("measure", tmp_path / "nope.log", "--recipe", SEED)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().count("\n") == 0 and "nope.log" in missing.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    invalid = cli("measure", logs["good"], "--recipe", bad)
    assert invalid.returncode == 2 and "Traceback" not in invalid.stderr


def test_compare_passes_a_run_against_itself_and_fails_a_diverged_or_nan_one(logs):
    same = cli("compare", logs["good"].parent.parent, logs["slow"])
    assert same.returncode == 0, same.stdout
    for text in ("correlation", "final loss difference", "pointwise failures", "PASS"):
        assert text in same.stdout
    diverged = cli("compare", logs["scaled"], logs["good"])
    assert diverged.returncode == 1 and "FAIL" in diverged.stdout
    nan = cli("compare", logs["nan"], logs["good"], "--json")
    assert nan.returncode == 1
    data = json.loads(nan.stdout)
    assert data["passed"] is False and data["nan_steps"] == [15, 16, 17, 18, 19]


def test_run_dir_recipe_is_the_default(logs):
    run_dir = logs["good"].parent.parent
    (run_dir / "recipe.yaml").write_text(SEED.read_text())
    proc = cli("measure", run_dir, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["verdict"]["status"] == "reproduced"
    no_recipe = cli("measure", logs["slow"], "--json")
    assert no_recipe.returncode == 2 and "--recipe" in no_recipe.stderr


def _sections(html: str) -> list[str]:
    import re

    return re.findall(r'<section[^>]*id="([^"]+)"', html)


def test_measure_log_out_writes_the_same_report_html_a_run_directory_gets(logs, tmp_path):
    out = tmp_path / "out"
    proc = cli("measure", logs["good"], "--recipe", SEED, "--out", out)
    assert proc.returncode == 0, proc.stderr
    page = (out / "report.html").read_text()
    assert (out / "recipe.yaml").read_text() == SEED.read_text()  # what it was judged against
    run_dir = logs["good"].parent.parent
    assert cli("measure", run_dir, "--recipe", SEED).returncode == 0
    run_page = (run_dir / "report.html").read_text()
    assert _sections(page) == _sections(run_page) and "verdict" in _sections(page)
    assert "reproduced" in page.lower() and "<svg" in page  # judged, with its charts
    assert "could not be shown" not in page
    # a run directory measured into another place: the page goes there too, the run dir's own
    # record (its recipe.yaml, written here: the module's tests may run on other workers, in any
    # order) still read from the run directory
    (run_dir / "recipe.yaml").write_text(SEED.read_text())
    elsewhere = tmp_path / "elsewhere"
    assert cli("measure", run_dir, "--out", elsewhere).returncode == 0
    assert _sections((elsewhere / "report.html").read_text()) == _sections(run_page)
