"""Golden files of the seed recipe: its node script for --cluster local, ssh and aws, and its full
AWS dry run, rendered with a fixed run id, owner and clock.

A change to what the launcher would run on a node (or ask AWS for) fails here with a unified diff
until the golden file is regenerated and committed with it:

    REPRODUCE_UPDATE_GOLDEN=1 .venv/bin/pytest -q tests/ -k golden -p no:cacheprovider
"""

from __future__ import annotations

import inspect
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import support.golden as golden_support
from support.cli import REPO, SEED, reproduce
from support.golden import assert_golden, check_golden

import launcher.runner.prelaunch as prelaunch

SEED_ARG = str(SEED.relative_to(REPO))  # as README's command 1 gives it
RUN_ID = "20261201T120000Z-golden"
OWNER = "golden"
NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
CLUSTERS = ("local", "ssh", "aws")
MACHINE = {str(REPO): "<repo>"}  # the checkout's location is the only machine-specific text
EXPIRES = re.compile(r'("reproduce:expires-at",\s*"Value": )"[^"]*"')


@pytest.fixture
def fixed_world(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same owner and working directory on every machine (getpass reads LOGNAME first)."""
    monkeypatch.setenv("LOGNAME", OWNER)
    monkeypatch.setenv("USER", OWNER)
    monkeypatch.chdir(REPO)


def prepared(cluster: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`prelaunch.prepare` of the seed at NOW: through its `now` argument when it has one,
    else by fixing the clock the module reads."""
    options = prelaunch.RunOptions(cluster=cluster, run_id=RUN_ID)
    if "now" in inspect.signature(prelaunch.prepare).parameters:
        return prelaunch.prepare(SEED_ARG, options, now=NOW)  # type: ignore[call-arg]

    class FixedClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return NOW if tz is None else NOW.astimezone(tz)

    monkeypatch.setattr(prelaunch, "datetime", FixedClock)
    return prelaunch.prepare(SEED_ARG, options)


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_seed_node_script_matches_golden(
    cluster: str, fixed_world: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = prepared(cluster, monkeypatch).plan.node_script
    assert_golden(f"seed-node-{cluster}.sh", script, normalize=MACHINE)


def test_seed_aws_dry_run_matches_golden(
    fixed_world: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = prelaunch.dry_run_text(prepared("aws", monkeypatch))
    assert NOW.strftime("%Y-%m-%d") in text, "the fixed clock did not reach the expiry tags"
    assert_golden("seed-dry-run-aws.txt", text, normalize=MACHINE)


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_cli_prints_the_golden_node_script(cluster: str, tmp_path: Path) -> None:
    """The golden files are what a user gets from the CLI, not only from the Python API."""
    if golden_support.updating():
        pytest.skip("golden files are being regenerated")
    out = tmp_path / "node.sh"
    result = reproduce(
        SEED_ARG,
        "--cluster",
        cluster,
        "--run-id",
        RUN_ID,
        "--dry-run",
        "--script-out",
        out,
        env={"LOGNAME": OWNER, "USER": OWNER},
    )
    assert result.code == 0, result.err
    golden = golden_support.golden_path(f"seed-node-{cluster}.sh").read_text(encoding="utf-8")
    assert golden_support.normalized(out.read_text(encoding="utf-8"), MACHINE) == golden


def test_cli_dry_run_is_the_golden_one_but_for_the_clock() -> None:
    if golden_support.updating():
        pytest.skip("golden files are being regenerated")
    result = reproduce(
        SEED_ARG,
        "--cluster",
        "aws",
        "--run-id",
        RUN_ID,
        "--dry-run",
        env={"LOGNAME": OWNER, "USER": OWNER},
    )
    assert result.code == 0, result.err
    golden = golden_support.golden_path("seed-dry-run-aws.txt").read_text(encoding="utf-8")
    printed = golden_support.normalized(result.out, MACHINE)
    assert EXPIRES.search(golden), "the golden dry run has no expiry tag to mask"
    assert EXPIRES.sub(r'\1"<now + ttl>"', printed) == EXPIRES.sub(r'\1"<now + ttl>"', golden)


def test_a_changed_text_fails_with_a_unified_diff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(golden_support, "GOLDEN_DIR", tmp_path)
    monkeypatch.delenv(golden_support.UPDATE_ENV, raising=False)
    (tmp_path / "t.sh").write_text("set -e\necho one\n", encoding="utf-8")
    assert check_golden("t.sh", "set -e\necho one\n") is None
    message = check_golden("t.sh", "set -e\necho two\n")
    assert message is not None
    assert "-echo one\n+echo two\n" in message
    assert golden_support.UPDATE_COMMAND in message
    missing = check_golden("absent.sh", "x")
    assert missing is not None and "does not exist" in missing
    with pytest.raises(ValueError, match="leaves tests/golden"):
        check_golden("../escape.sh", "x")


def test_update_mode_writes_and_normalizes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(golden_support, "GOLDEN_DIR", tmp_path)
    monkeypatch.setenv(golden_support.UPDATE_ENV, "1")
    assert (
        check_golden("sub/t.txt", "cd /srv/x/y && ls /srv/x", {"/srv/x": "<a>", "/srv/x/y": "<b>"})
        is None
    )
    assert (tmp_path / "sub" / "t.txt").read_text(encoding="utf-8") == "cd <b> && ls <a>"


def test_three_measured_runs_train_stage_matches_golden(tmp_path: Path) -> None:
    """The train stage of a recipe with result.runs 3 (launcher/plan/measured.py): the run block
    looped three times, each run its own train stage in a subshell; everything else in node.sh is
    the one-run script's (the seed's goldens above)."""
    import yaml

    from launcher.inputs.profile import load_profile
    from launcher.inputs.recipe import load_recipe
    from launcher.plan.plan import build_plan

    raw = yaml.safe_load(SEED.read_text())
    raw["result"]["runs"] = 3
    path = tmp_path / "recipes" / "qwen3-30b-a3b" / "h200" / "runs3.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    three = build_plan(load_recipe(path), load_profile("local"), run_id=RUN_ID).node_script
    one = build_plan(load_recipe(path), load_profile("local"), run_id=RUN_ID, runs=1).node_script
    start = three.index("# ---- stage train")
    end = three.index("\ndone\n", start) + len("\ndone")
    assert three[:start] == one[: one.index("# ---- stage train")]  # the same up to the stage
    assert_golden("seed-train-stage-runs3.sh", three[start:end] + "\n")
