"""A dry run applies every check the real run applies before it starts, so a dry run that passes
means the real run starts (launcher/runner/prelaunch.py, check_before_start): option values, a reused
run id, the budget. What a real run refuses although its plan exists (several nodes, a dry-run-only
profile kind) is printed at the top of the dry run and on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import SEED, reproduce_here
from support.paths import REPO

NO_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "",
    "AWS_SECRET_ACCESS_KEY": "",
    "AWS_PROFILE": "",
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
}
P5E = "the seed on p5e.48xlarge"  # sold as Capacity Blocks only: the catalog has no price


def p5e_recipe(tmp_path: Path) -> Path:
    path = tmp_path / "seed-on-p5e.yaml"
    path.write_text(SEED.read_text().replace("AWS p5en.48xlarge", "AWS p5e.48xlarge"))
    assert "p5e.48xlarge" in path.read_text()
    return path


@pytest.mark.parametrize(
    "recipe, args, expected",
    [
        (SEED, ("--on-interrupt", "later"), "Invalid value for '--on-interrupt'"),
        (SEED, ("--max-hours", "0.0001"), "expected to take"),
        (SEED, ("--max-usd", "1"), "more than --max-usd 1"),
        (SEED, ("--max-usd", "-5"), "-5"),
        (P5E, ("--max-usd", "100"), "--max-usd needs a price"),
    ],
    ids=["on-interrupt", "max-hours", "max-usd", "negative-max-usd", "max-usd-without-price"],
)
def test_the_dry_run_refuses_what_the_real_run_refuses(recipe, args, expected, tmp_path):
    runs = tmp_path / "runs"
    recipe = p5e_recipe(tmp_path) if recipe == P5E else recipe
    dry = reproduce_here(recipe, "--cluster", "aws", "--dry-run", *args, env=NO_CREDENTIALS)
    assert dry.code == 2 and expected in dry.err and dry.out == "", dry
    real = reproduce_here(
        recipe, "--cluster", "local", "--runs-dir", runs, *args, env=NO_CREDENTIALS
    )
    assert real.code == 2 and expected in real.err, real
    assert not runs.exists() or not any(runs.rglob("run.json"))


def test_a_reused_run_id_is_refused_by_the_dry_run_too(tmp_path):
    runs = tmp_path / "runs"
    old = runs / "x" / "h200" / "20260101T000000Z-taken"
    old.mkdir(parents=True)
    (old / "run.json").write_text(json.dumps({"run_id": "taken"}))
    res = reproduce_here(
        SEED, "--cluster", "local", "--dry-run", "--runs-dir", runs, "--run-id", "taken"
    )
    assert res.code == 2 and "was used before" in res.err


def test_a_dry_run_within_the_budget_passes(tmp_path):
    res = reproduce_here(
        SEED, "--cluster", "aws", "--dry-run", "--max-usd", "500", "--max-hours", "2",
        env=NO_CREDENTIALS,
    )  # fmt: skip
    assert res.code == 0 and "REFUSED" not in res.out, res.err


def test_a_plan_the_real_run_refuses_is_shown_with_the_refusal_on_top(monkeypatch):
    """Every kind runs for real today, multi-node included: a dry-run-only kind is made up here."""
    from launcher import clusters
    from launcher.runner.prelaunch import RunOptions, check_before_start, dry_run_text, prepare

    monkeypatch.setattr(clusters, "DRY_RUN_ONLY", {"ray": "a reason"})
    prepared = prepare(SEED, RunOptions(cluster="ray"))
    refusals = check_before_start(prepared, RunOptions(cluster="ray")).refusals
    header = dry_run_text(prepared, refusals).split("# ----", 1)[0]
    assert "# REFUSED   a real run would not start" in header and "a reason" in header


def test_the_check_is_one_function_for_both_paths():
    """Runner.run applies prelaunch.check_before_start: no second list of checks to drift."""
    source = (REPO / "launcher" / "runner" / "runner.py").read_text()
    assert "check_before_start(prepared, options)" in source
    assert "refuse_if_over" not in source.split("def run(", 1)[1].split("def execute(", 1)[0]
