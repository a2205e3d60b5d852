"""`result.runs: 3` run as three measured runs on one node (launcher/plan/measured.py,
launcher/results/measured_runs.py, launcher/judge/aggregate.py).

Real processes over `--cluster local`: the Plan's own train-stage loop (the text node.sh renders)
runs the seed's run block three times from the stand-in miles (tests/standin_miles), the runner
follows the one node.log, each run is cut into measured/<k>/ and judged alone, and the verdict is
on their mean. A failed run of three fails the whole, naming it; --runs 1 and --runs 2 say so in
the verdict; `reproduce measure RUN_DIR` reaches the same verdict offline.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.measure import REPO, seed_raw, step_times_for_tps
from support.measured_runs import k_runs, times_env

from launcher.errors import CheckFailed
from launcher.inputs.profile import load_profile
from launcher.plan.plan import build_plan

CLAIM = seed_raw()["result"]["tokens_per_s_per_gpu"]
TOKENS = 128 * 8192  # the seed's global batch x row tokens


def _measure_cli(run_dir: Path) -> tuple[int, dict]:
    res = subprocess.run(
        [sys.executable, "-m", "launcher", "measure", str(run_dir), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return res.returncode, json.loads(res.stdout)


def test_runs_3_is_three_measured_runs_judged_on_their_mean(tmp_path):
    times = [step_times_for_tps(CLAIM * f) for f in (0.985, 1.0, 1.02)]
    rd, plan, run = k_runs(tmp_path, 3, times_env(times))
    assert plan.to_dict()["runs"] == {"claimed": 3, "measured": 3, "accepted": None}
    real = build_plan(plan.recipe, load_profile("local")).node_script
    assert "for REPRODUCE_MEASURED_RUN in $(seq 1 3); do" in real  # the loop node.sh runs
    outcome = run()
    assert outcome.exit_code == 0 and outcome.measurement is not None
    _, verdict = outcome.measurement
    assert verdict.status == "reproduced", verdict.reasons
    assert verdict.reasons[0] == "judged on the mean of 3 measured runs (result.runs 3)"
    # each run kept: its own log (the three together are train.log byte for byte), timeline,
    # figures and verdict
    logs = [rd.path / "measured" / str(k) / "logs" / "train.log" for k in (1, 2, 3)]
    assert b"".join(p.read_bytes() for p in logs) == (rd.logs / "train.log").read_bytes()
    per_run = []
    for k in (1, 2, 3):
        sub = rd.path / "measured" / str(k)
        assert json.loads((sub / "timeline.json").read_text())["stages"][0]["name"] == "train"
        own = json.loads((sub / "verdict.json").read_text())
        assert own["status"] == "reproduced"
        assert any(f"measured run {k} of 3" in r for r in own["reasons"])
        per_run.append(yaml.safe_load((sub / "result.yaml").read_text()))
    # the figure is the mean of the runs' figures, computed here from the step times alone
    expected = statistics.fmean(TOKENS / t / 8 for t in times)
    result = yaml.safe_load((rd.path / "result.yaml").read_text())
    assert result["runs"] == 3
    assert result["provenance"]["unrounded"]["tokens_per_s_per_gpu"] == pytest.approx(expected)
    each = result["provenance"]["measured_runs"]["each"]
    assert [e["run"] for e in each] == [1, 2, 3]
    for e, own in zip(each, per_run, strict=True):
        assert e["tokens_per_s_per_gpu"] == pytest.approx(
            own["provenance"]["unrounded"]["tokens_per_s_per_gpu"]
        )
    # GPU-hours: each run its own training; the whole is the node's, the setup counted once
    assert all(r["gpu_hours_note"].startswith("GPUs x this measured run's") for r in per_run)
    whole = result["provenance"]["unrounded"]["gpu_hours"]
    assert 0 < sum(r["provenance"]["unrounded"]["gpu_hours"] for r in per_run) <= whole
    spread = result["provenance"]["measured_runs"]["spread"]
    assert spread["min"] < expected < spread["max"]
    saved = json.loads((rd.path / "verdict.json").read_text())
    assert saved["runs"]["measured"] == 3 and saved["policy"]["version"] == 6
    assert "measured/1" in (rd.path / "report.md").read_text()
    # offline: the same verdict from the run directory alone
    code, again = _measure_cli(rd.path)
    assert code == 0
    assert again["verdict"]["status"] == saved["status"]
    assert again["verdict"]["difference_percent"] == pytest.approx(saved["difference_percent"])
    assert again["verdict"]["reasons"] == saved["reasons"]
    page = (rd.path / "report.html").read_text()  # written by `measure`: each run and the mean
    assert 'data-measured-runs="3"' in page and 'href="measured/2/report.md"' in page
    # compare reads one log: a directory of three runs is refused, each run's log is read
    res = subprocess.run(
        [sys.executable, "-m", "launcher", "compare", str(rd.path), str(logs[0])],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2 and "holds 3 measured runs; give one of them" in res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "launcher", "compare", str(logs[1]), str(logs[0])],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    # the history keeps the mean with K
    from launcher.records.history import index_run

    row = index_run(rd.path, tmp_path / "history.sqlite")
    assert row.measured_runs == 3
    assert row.tokens_per_s_per_gpu == pytest.approx(expected)


def test_one_failed_run_of_three_fails_the_whole_naming_it(tmp_path):
    times = [step_times_for_tps(CLAIM)] * 3
    rd, _, run = k_runs(tmp_path, 3, times_env(times, fail_run=2))
    with pytest.raises(CheckFailed) as err:
        run()
    assert "in stage train (measured run 2 of 3, measured/2)" in str(err.value)
    verdict = json.loads((rd.path / "verdict.json").read_text())
    assert verdict["status"] == "failed"
    assert verdict["difference_percent"] is None
    assert any(
        r.startswith("measured run 2 of 3 (measured/2) is failed") for r in verdict["reasons"]
    )
    assert any("measured run(s) 3 of 3 never ran" in r for r in verdict["reasons"])
    assert not any(", within -" in r for r in verdict["reasons"])
    assert "illegal memory access" in (verdict["error"] or "")
    assert not (rd.path / "measured" / "3").exists()  # the loop stopped: nothing more was paid
    assert json.loads((rd.path / "measured" / "1" / "verdict.json").read_text())["status"] == (
        "reproduced"
    )
    result = yaml.safe_load((rd.path / "result.yaml").read_text())
    assert result["tokens_per_s_per_gpu"] is None  # no mean of an incomplete set
    code, again = _measure_cli(rd.path)
    assert code == 1 and again["verdict"]["reasons"] == verdict["reasons"]


@pytest.mark.parametrize("accepted, words", [(1, "--runs 1 asked"), (2, "fewer, as --runs 2")])
def test_fewer_runs_than_the_claim_say_so_in_the_verdict(tmp_path, accepted, words):
    times = [step_times_for_tps(CLAIM)] * 3
    rd, plan, run = k_runs(tmp_path, 3, times_env(times), accepted=accepted)
    assert plan.to_dict()["runs"] == {"claimed": 3, "measured": accepted, "accepted": accepted}
    outcome = run()
    _, verdict = outcome.measurement
    assert verdict.status == "reproduced"
    assert any(words in r for r in verdict.reasons), verdict.reasons
    assert (rd.path / "measured").exists() == (accepted > 1)


def test_each_measured_run_starts_from_an_empty_output_directory_of_its_own(tmp_path):
    """A run block that resumes from a checkpoint in $REPRODUCE_OUT_DIR (miles' --save/--load)
    must not resume run 2 from run 1's end: each run has REPRODUCE_OUT_DIR/run-<k> to itself."""
    times = [step_times_for_tps(CLAIM)] * 3
    resume = (
        'if [ -n "$(ls -A "$REPRODUCE_OUT_DIR")" ]; then export STANDIN_FAIL_AT=0; fi\n'
        'echo "$REPRODUCE_MEASURED_RUN" > "$REPRODUCE_OUT_DIR/latest_checkpointed_iteration.txt"'
    )
    rd, plan, run = k_runs(tmp_path, 3, times_env(times) + "\n" + resume)
    outcome = run()
    assert outcome.exit_code == 0, outcome
    out = Path(plan.node_run_dir) / "out"
    for k in (1, 2, 3):
        assert (out / f"run-{k}" / "latest_checkpointed_iteration.txt").read_text() == f"{k}\n"
    assert sorted(p.name for p in out.iterdir()) == ["run-1", "run-2", "run-3"]
