"""Which failed stages decide the verdict, read once for a run judged alone and for a mean of K
(launcher/judge/split.py, failed_stages).

A stage that failed before training, or training itself, means the figures were not made as the
recipe says: failed. A stage that began after every train stage had ended ok (the store's push)
failed once the figures were made: they stand, with a note. Found by trying it (2026-12-04): a
push that failed after a good run was "failed" for a run judged alone and "reproduced", silently,
for the same run measured as a mean of two.
"""

from __future__ import annotations

import json

import pytest
from support.cli import completed_here
from support.measure import REPO, SEED, run_standin, seed_raw, step_times_for_tps
from support.measured_runs import k_runs, times_env

from launcher.judge.split import failed_stages
from launcher.judge.timeline import RunTimeline

CLAIM = seed_raw()["result"]["tokens_per_s_per_gpu"]


def stage(name: str, start: float, end: float, status: str = "ok") -> dict:
    return {"name": name, "start": start, "end": end, "status": status}


@pytest.mark.parametrize(
    "stages, deciding, after",
    [
        ([stage("preflight", 0, 1, "failed")], ["preflight"], []),
        ([stage("train", 0, 9, "failed"), stage("push", 10, 11, "failed")], ["train", "push"], []),
        ([stage("train", 0, 9), stage("push", 10, 11, "failed")], [], ["push"]),
        ([stage("assets", 0, 1, "failed"), stage("train", 2, 9)], ["assets"], []),
        # a stage that began before training ended is not after it, whatever it did
        ([stage("train", 0, 9), stage("push", 8, 11, "failed")], ["push"], []),
        # K runs: after the last one only
        ([stage("train", 0, 4), stage("x", 5, 6, "failed"), stage("train", 7, 9)], ["x"], []),
        (
            [stage("train", 0, 4), stage("train", 5, 9), stage("push", 9, 10, "failed")],
            [],
            ["push"],
        ),
        ([stage("train", 0, 9, "cancelled"), stage("push", 10, 11, "failed")], ["push"], []),
    ],
)
def test_failed_stages_splits_before_and_after_training(stages, deciding, after):
    assert failed_stages(RunTimeline.of({"stages": stages})) == (deciding, after)


def _with_push_failed(timeline: dict) -> dict:
    end = max(s["end"] for s in timeline["stages"] if s["name"] == "train")
    timeline["stages"].append(stage("push", end + 1, end + 2, "failed"))
    return timeline


def test_a_push_failed_after_training_reads_the_same_alone_and_as_a_mean(tmp_path):
    # alone: a good log and a timeline whose push failed after its train stage
    log = tmp_path / "one" / "train.log"
    run_standin(log, steps=20, step_time_s=step_times_for_tps(CLAIM))
    timeline = tmp_path / "timeline.json"
    timeline.write_text(json.dumps(_with_push_failed({"stages": [stage("train", 0, 400)]})))
    res = completed_here(
        "measure", str(log), "--recipe", str(SEED), "--timeline", str(timeline), "--json",
        cwd=REPO,
    )  # fmt: skip
    alone = json.loads(res.stdout)["verdict"]
    # a mean of two: the run directory's timeline gains the same failed push
    rd, _, run = k_runs(tmp_path / "k", 2, times_env([step_times_for_tps(CLAIM)] * 2))
    assert run().exit_code == 0
    path = rd.path / "timeline.json"
    path.write_text(json.dumps(_with_push_failed(json.loads(path.read_text()))))
    res = completed_here("measure", str(rd.path), "--json", cwd=REPO)
    mean = json.loads(res.stdout)["verdict"]
    for verdict in (alone, mean):
        assert verdict["status"] == "reproduced", verdict["reasons"]
        assert any("push failed after training had ended" in r for r in verdict["reasons"])


def test_a_stage_failed_before_training_fails_the_run(tmp_path):
    log = tmp_path / "train.log"
    run_standin(log, steps=20, step_time_s=step_times_for_tps(CLAIM))
    timeline = tmp_path / "timeline.json"
    timeline.write_text(
        json.dumps({"stages": [stage("assets", 0, 1, "failed"), stage("train", 2, 400)]})
    )
    res = completed_here(
        "measure", str(log), "--recipe", str(SEED), "--timeline", str(timeline), "--json",
        cwd=REPO,
    )  # fmt: skip
    verdict = json.loads(res.stdout)["verdict"]
    assert res.returncode == 1 and verdict["status"] == "failed"
    assert "run stage(s) failed: assets" in verdict["reasons"]


def test_a_log_without_its_first_steps_says_so(tmp_path):
    """A log holding only steps 5-19 (a resume, or a head cut off) was reproduced without a word."""
    log = tmp_path / "train.log"
    run_standin(log, steps=20, step_time_s=step_times_for_tps(CLAIM))
    lines = log.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if "step 5:" in line)
    first = next(i for i, line in enumerate(lines) if "step 0:" in line or "perf 0:" in line)
    (tmp_path / "cut.log").write_text("".join(lines[:first] + lines[start:]))
    res = completed_here("measure", str(tmp_path / "cut.log"), "--recipe", str(SEED), "--json")
    verdict = json.loads(res.stdout)["verdict"]
    assert any(
        "the log's first step is 5: steps 0-4 are not in it" in r for r in verdict["reasons"]
    )
