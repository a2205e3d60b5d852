"""`result.runs: N`: the claim is a mean of N runs (launcher/plan/claimruns.py).

Before, `runs` was never mentioned: one run within the band of a three-run mean was "reproduced".
Now a reproduction measures N runs (tests/results/test_measured_runs.py runs them); ONE run (a
bare log, `--runs 1`) is never `reproduced` against a mean unless `--runs 1` accepts it (then its
reasons say so); the dry run says how many runs are measured and counts their training in the
cost; the choice is recorded in plan.json so measuring the run directory again judges it the
same way; what cannot be honoured (more runs than the claim's, none) is refused, exit 2.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from support.cli import completed_here
from support.measure import REPO, SEED, run_standin, seed_raw, step_times_for_tps


def cli(*args) -> subprocess.CompletedProcess:
    return completed_here(*map(str, args), cwd=REPO)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs-logs")
    claim = seed_raw()["result"]["tokens_per_s_per_gpu"]
    out = {}
    for name, tps in (("good", claim), ("slow", claim * 0.9)):
        out[name] = root / name / "train.log"
        run_standin(out[name], steps=20, step_time_s=step_times_for_tps(tps))
    return out


def recipe(tmp_path: Path, runs: int) -> Path:
    raw = seed_raw()
    raw["result"]["runs"] = runs
    path = tmp_path / f"runs{runs}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def verdict_of(*args) -> tuple[int, dict]:
    res = cli("measure", *args, "--json")
    return res.returncode, json.loads(res.stdout)["verdict"]


def test_one_run_within_the_band_of_a_mean_of_three_is_not_reproduced(logs, tmp_path):
    path = recipe(tmp_path, 3)
    code, verdict = verdict_of(logs["good"], "--recipe", path)
    assert code == 1 and verdict["status"] == "incomplete"
    assert "the claim is a mean of 3 runs (result.runs); this is 1 run" in verdict["reasons"][0]
    assert not any("within -3%" in r for r in verdict["reasons"])  # not judged in the band
    assert verdict["difference_percent"] is not None  # the figure is still stated


def test_runs_1_judges_one_run_against_the_mean_and_says_so(logs, tmp_path):
    path = recipe(tmp_path, 3)
    code, verdict = verdict_of(logs["good"], "--recipe", path, "--runs", "1")
    assert code == 0 and verdict["status"] == "reproduced"
    assert any("judged against the mean as --runs 1 asked" in r for r in verdict["reasons"])


def test_a_slower_run_stays_slower_and_names_the_runs(logs, tmp_path):
    code, verdict = verdict_of(logs["slow"], "--recipe", recipe(tmp_path, 3))
    assert code == 1 and verdict["status"] == "slower"
    assert any("mean of 3 runs" in r for r in verdict["reasons"])


def test_a_claim_of_one_run_is_judged_as_before(logs):
    code, verdict = verdict_of(logs["good"], "--recipe", SEED)
    assert code == 0 and verdict["status"] == "reproduced"
    assert not any("result.runs" in r for r in verdict["reasons"])


@pytest.mark.parametrize(
    "runs, words",
    [("4", "expected at most 3"), ("0", "expected a number")],
)
def test_runs_that_cannot_be_honoured_are_refused(logs, tmp_path, runs, words):
    path = recipe(tmp_path, 3)
    for args in (("measure", logs["good"], "--recipe", path), (path, "--dry-run")):
        res = cli(*args, "--runs", runs)
        assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr


def test_the_dry_run_says_what_the_claim_summarises(tmp_path):
    path = recipe(tmp_path, 3)
    plain = cli(path, "--dry-run")
    assert plain.returncode == 0, plain.stderr
    assert "# runs      the claim is a mean of 3 runs (result.runs); this run measures 3 on " \
        "one node, each kept and judged, the verdict on their mean" in plain.stdout  # fmt: skip
    accepted = cli(path, "--dry-run", "--runs", "1")
    assert "one run judged against the mean, as --runs 1 asks" in accepted.stdout
    assert "for REPRODUCE_MEASURED_RUN in $(seq 1 3); do" in plain.stdout
    assert "REPRODUCE_MEASURED_RUN" not in accepted.stdout  # one run: the train stage as before
    assert "# runs " not in cli(SEED, "--dry-run").stdout

    def window(text: str) -> float:  # the cold node's window GPU-hours
        line = next(x for x in text.splitlines() if x.startswith("#   window "))
        return float(line.split()[2])

    assert window(plain.stdout) == pytest.approx(3 * window(accepted.stdout), rel=1e-3)
    assert "window count 3 times: 3 measured runs" in plain.stdout


def test_the_choice_is_recorded_and_a_run_dir_is_judged_again_the_same_way(logs, tmp_path):
    from launcher.inputs.profile import load_profile
    from launcher.inputs.recipe import load_recipe
    from launcher.plan.plan import build_plan

    path = recipe(tmp_path, 3)
    for accepted, status in ((1, "reproduced"), (None, "incomplete")):
        run_dir = tmp_path / f"run-{accepted}"
        (run_dir / "logs").mkdir(parents=True)
        shutil.copy(logs["good"], run_dir / "logs" / "train.log")
        shutil.copy(path, run_dir / "recipe.yaml")
        plan = build_plan(load_recipe(path), load_profile("local"), run_id="r1", runs=accepted)
        assert plan.to_dict()["runs"] == {
            "claimed": 3,
            "measured": accepted or 3,
            "accepted": accepted,
        }
        (run_dir / "plan.json").write_text(json.dumps(plan.to_dict()))
        (run_dir / "run.json").write_text(json.dumps({"run_id": "r1"}))
        code, verdict = verdict_of(run_dir)
        assert verdict["status"] == status, verdict
        saved = json.loads((run_dir / "verdict.json").read_text())
        assert saved["status"] == status
