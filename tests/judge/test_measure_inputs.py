"""What `measure` and `compare` accept, and where they write (docs/architecture.md, CLI contract).

`measure` takes one log file or one run directory (a directory holding run.json), nothing else;
its outputs go to the run directory, or to --out for a bare log, never next to an arbitrary
input. `compare` refuses runs of two different recipes unless told otherwise.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml
from support.cli import completed_here
from support.measure import REPO, SEED, run_standin, seed_raw, step_times_for_tps

OUTPUTS = ("steps.jsonl", "result.yaml", "verdict.json", "report.md")


def cli(*args: object) -> subprocess.CompletedProcess:
    return completed_here(*map(str, args), cwd=REPO)


def run_dir(root: Path, name: str, raw: dict | None = None, **standin) -> Path:
    """A run directory as `reproduce` leaves one: run.json, recipe.yaml, logs/train.log."""
    d = root / name
    raw = raw if raw is not None else seed_raw()
    run_standin(d / "logs" / "train.log", 20, raw=raw, **standin)
    (d / "run.json").write_text(json.dumps({"run_id": name}))
    (d / "recipe.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return d


def test_a_directory_that_is_not_a_run_directory_is_refused_and_nothing_written(tmp_path):
    loose = tmp_path / "loose"
    run_standin(loose / "logs" / "a.log", 20)
    run_standin(loose / "logs" / "b.log", 20, step_time_s=30.0)
    before = sorted(p.name for p in loose.rglob("*"))
    proc = cli("measure", loose, "--recipe", SEED)
    assert proc.returncode == 2 and "not a run directory" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in loose.rglob("*")) == before


def test_a_bare_log_writes_nothing_next_to_it_and_out_writes_there(tmp_path):
    log = tmp_path / "somewhere" / "train.log"
    run_standin(log, 20)
    assert cli("measure", log, "--recipe", SEED).returncode == 0
    assert sorted(p.name for p in log.parent.iterdir()) == ["train.log"]
    out = tmp_path / "measured"
    proc = cli("measure", log, "--recipe", SEED, "--out", out)
    assert proc.returncode == 0, proc.stderr
    for name in OUTPUTS:
        assert (out / name).is_file(), name
    assert sorted(p.name for p in log.parent.iterdir()) == ["train.log"]


def test_a_run_directory_gets_its_outputs_and_out_redirects_them(tmp_path):
    d = run_dir(tmp_path, "r1")
    proc = cli("measure", d, "--json")  # the run's own recipe.yaml
    assert proc.returncode == 0, proc.stderr
    assert json.loads((d / "verdict.json").read_text())["status"] == "reproduced"
    other = tmp_path / "elsewhere"
    assert cli("measure", d, "--out", other).returncode == 0
    assert (other / "result.yaml").is_file()


def test_out_that_is_a_file_is_bad_input(tmp_path):
    log = tmp_path / "train.log"
    run_standin(log, 20)
    (tmp_path / "file").write_text("x")
    proc = cli("measure", log, "--recipe", SEED, "--out", tmp_path / "file")
    assert proc.returncode == 2 and "not a directory" in proc.stderr


def test_a_run_directory_measures_its_train_log_only(tmp_path):
    d = run_dir(tmp_path, "r1")
    run_standin(d / "logs" / "other.log", 20, step_time_s=60.0)  # another stage's log
    proc = cli("measure", d, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["verdict"]["status"] == "reproduced"


def test_compare_refuses_two_different_recipes_unless_allowed(tmp_path):
    other = seed_raw()
    other["layout"]["label"] = "another layout"
    a, b = run_dir(tmp_path, "a"), run_dir(tmp_path, "b", raw=other)
    refused = cli("compare", a, b)
    assert refused.returncode == 2 and "different recipes" in refused.stderr
    assert "--allow-different-recipes" in refused.stderr
    allowed = cli("compare", a, b, "--allow-different-recipes", "--json")
    assert allowed.returncode == 0, allowed.stderr
    data = json.loads(allowed.stdout)
    assert data["passed"] is True and data["recipes"]["identity"].startswith("different recipes")


def test_compare_of_the_same_recipe_anywhere_and_of_bare_logs_says_what_it_knows(tmp_path):
    a = run_dir(tmp_path, "a")
    b = tmp_path / "copy"
    shutil.copytree(a, b)
    (b / "recipe.yaml").write_text(SEED.read_text())  # the same recipe, other bytes and place
    same = cli("compare", a, b)
    assert same.returncode == 0 and "recipes: the same recipe" in same.stdout
    # a bare log is identified by the arguments it printed (Megatron's listing), as `measure` does
    bare = cli("compare", a / "logs" / "train.log", b)
    assert bare.returncode == 0 and "the same printed arguments" in bare.stdout
    # ... and only a log that prints none leaves the identity unchecked
    unlisted = tmp_path / "unlisted.log"
    run_standin(unlisted, 20, step_time_s=step_times_for_tps(6913.23), print_args=0)
    blind = cli("compare", unlisted, b)
    assert blind.returncode == 0 and "not checked" in blind.stdout
