"""The evidence gate: the wrong answers `measure` used to give, each now the right status and exit.

Only consistent evidence may be reproduced, slower, faster or unstable (docs/measurement.md, "The
evidence gate"): a log of another batch, another layout or another number of nodes is a
`mismatch` (exit 1) listing every disagreement with both values, whatever its throughput.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.measure import REPO, SEED, as_recipe, run_standin, seed_raw, step_times_for_tps

from launcher.judge.evidence import NO_GPU_SAMPLES, NO_HOST_CLOCK
from launcher.judge.measure import measure
from launcher.judge.timeline import RunTimeline
from launcher.judge.verdict import judge
from launcher.results.evaluate import parse_log

CLAIM = 6913.23
SEED_STEP = step_times_for_tps(CLAIM)


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def judged(log: Path, raw: dict | None = None):
    raw = raw if raw is not None else seed_raw()
    records, stats = parse_log(log)
    result = measure(records, as_recipe(raw), parse_stats=stats)
    return result, judge(result, as_recipe(raw))


@pytest.fixture(scope="module")
def half_batch_log(tmp_path_factory) -> Path:
    """A run of global batch 64 (half the seed's), each step taking half the time: its tokens/s
    figure against the seed's 128-row steps is twice the claim."""
    log = tmp_path_factory.mktemp("gb64") / "train.log"
    args = {"global_batch_size": 64, "rollout_batch_size": 64}
    assert run_standin(log, 20, args=args, step_time_s=SEED_STEP / 2) == 0
    return log


def test_a_log_of_global_batch_64_is_a_mismatch_not_faster(half_batch_log):
    result, verdict = judged(half_batch_log)
    assert result.tokens_per_s_per_gpu == pytest.approx(2 * CLAIM, rel=1e-3)  # the old "+100%"
    assert verdict.status == "mismatch" and not verdict.reproduced
    assert verdict.difference_percent is None  # a figure of another run is no difference
    checks = {d.check for d in result.evidence.disagreements}
    assert {"arguments", "tokens per step"} <= checks
    text = "\n".join(verdict.reasons)
    assert "workload.global_batch is 128, but miles printed global_batch_size = 64" in text
    assert "1,048,576" in text and "524,288" in text  # both values of tokens per step
    assert not any(r.startswith("tokens/s per GPU") for r in verdict.reasons)


def test_the_cli_says_mismatch_with_exit_1_and_both_values(half_batch_log):
    proc = cli("measure", half_batch_log, "--recipe", SEED, "--json")
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["verdict"]["status"] == "mismatch"
    found = data["evidence"]["disagreements"]
    gb = next(
        d for d in found if d["what"] == "workload.global_batch" and d["check"] == "arguments"
    )
    assert (gb["recipe"], gb["evidence"]) == (128, "64")
    human = cli("measure", half_batch_log, "--recipe", SEED)
    assert human.returncode == 1 and "verdict: MISMATCH" in human.stdout
    assert "FASTER" not in human.stdout


def test_without_an_arguments_listing_the_tokens_still_disagree_and_the_gap_is_said(tmp_path):
    log = tmp_path / "train.log"
    args = {"global_batch_size": 64, "rollout_batch_size": 64}
    run_standin(log, 20, args=args, step_time_s=SEED_STEP / 2, print_args=0)
    result, verdict = judged(log)
    assert verdict.status == "mismatch"
    checks = [d.check for d in result.evidence.disagreements]
    assert checks == ["arguments", "tokens per step"]
    assert any("prints no `arguments` listing" in r for r in verdict.reasons)


def test_the_seed_log_against_a_4_node_recipe_is_a_mismatch_naming_nodes_and_steps(tmp_path):
    log = tmp_path / "train.log"
    assert run_standin(log, 20) == 0  # the seed's own run: 1 node x 8 GPUs, 20 steps
    raw = seed_raw()
    raw["gpu"]["count"], raw["layout"]["dp"] = 32, 32
    raw["result"].update(steps_per_run=10, window=[2, 9], window_tokens=8 * 128 * 8192)
    result, verdict = judged(log, raw)
    assert verdict.status == "mismatch"
    text = "\n".join(verdict.reasons)
    assert "gpu.count / gpu.per_node (nodes) is 4, but miles printed actor_num_nodes = 1" in text
    assert "result.steps_per_run is 10, but miles printed num_rollout = 20" in text
    assert "the log has steps up to 19 (20 steps), the recipe runs result.steps_per_run 10" in text
    # Without the listing, the step count alone still refuses the verdict.
    bare = tmp_path / "bare.log"
    run_standin(bare, 20, print_args=0)
    assert judged(bare, raw)[1].status == "mismatch"


def test_two_lines_for_one_step_that_differ_are_a_mismatch_whatever_their_order(tmp_path):
    """Two runs' lines in one log: the old reader kept the first value per step, so the order of
    the lines decided between SLOWER and REPRODUCED."""
    fast, slow = tmp_path / "fast.log", tmp_path / "slow.log"
    run_standin(fast, 20)
    run_standin(slow, 20, step_time_s=SEED_STEP * 1.2)
    for first, second in ((fast, slow), (slow, fast)):
        both = tmp_path / f"both-{first.stem}.log"
        both.write_bytes(first.read_bytes() + second.read_bytes())
        result, verdict = judged(both)
        assert verdict.status == "mismatch", verdict.reasons
        assert any(d.check == "one value per step" for d in result.evidence.disagreements)


def test_stamps_that_disagree_with_perf_step_time_are_a_mismatch(tmp_path):
    log = tmp_path / "train.log"
    run_standin(log, 20)
    lines = log.read_text().splitlines(keepends=True)
    doubled = []
    for line in lines:  # perf/step_time (and its parts) claim half of what the clock shows
        for key in ("perf/step_time", "perf/train_wait_time", "perf/train_time"):
            if f"'{key}': " in line:
                head, _, tail = line.partition(f"'{key}': ")
                value, _, rest = tail.partition(",")
                line = f"{head}'{key}': {float(value) / 2!r},{rest}"
        doubled.append(line)
    log.write_text("".join(doubled))
    result, verdict = judged(log)
    assert verdict.status == "mismatch"
    (d,) = [d for d in result.evidence.disagreements if d.check == "step times"]
    assert "logging stamps give 18.960 s per step, perf/step_time 9.480 s" in d.detail


def test_consistent_evidence_is_still_reproduced_and_says_what_was_checked(tmp_path):
    log = tmp_path / "train.log"
    run_standin(log, 20)
    result, verdict = judged(log)
    assert verdict.status == "reproduced" and result.evidence.consistent
    # a log file: no run, so no host clock and no GPU samples
    assert result.evidence.not_checked == [NO_HOST_CLOCK, NO_GPU_SAMPLES]
    assert verdict.reasons[-2:] == [
        f"not checked: {NO_HOST_CLOCK}",
        f"not checked: {NO_GPU_SAMPLES}",
    ]
    assert any("printed arguments compared" in c for c in result.evidence.checked)


def test_a_seed_log_without_arguments_fails_closed_its_identity_unproven(tmp_path):
    # Every miles version prints the listing: a log without it does not show this is a run of
    # the recipe's model, layout and batch, so it is never reproduced, and the reason says so.
    log = tmp_path / "train.log"
    run_standin(log, 20, print_args=0)
    result, verdict = judged(log)
    assert verdict.status == "mismatch" and verdict.difference_percent is None
    assert any("identity is not proven" in r for r in verdict.reasons)


@pytest.mark.parametrize(
    "field, value, printed",
    [
        (("layout", "tp"), 2, "tensor_model_parallel_size = 1"),
        (("layout", "ep"), 4, "expert_model_parallel_size = 8"),
        (("layout", "max_tokens_per_gpu"), 32768, "max_tokens_per_gpu = 16384"),
        (("gpu", "per_node"), 4, "actor_num_gpus_per_node = 8"),
    ],
)
def test_each_printed_argument_is_compared(tmp_path, field, value, printed):
    log = tmp_path / "train.log"
    run_standin(log, 20)
    raw = seed_raw()
    raw[field[0]][field[1]] = value
    result, verdict = judged(log, raw)
    assert verdict.status == "mismatch"
    assert any(printed in r for r in verdict.reasons), verdict.reasons


def test_a_failed_run_stays_failed_and_lists_the_mismatch_too(tmp_path):
    log = tmp_path / "train.log"
    run_standin(log, 20, args={"global_batch_size": 64}, fail_at=6)
    records, stats = parse_log(log)
    timeline = {"acquired_at": 0, "stages": [{"name": "train", "status": "failed"}]}
    result = measure(
        records, as_recipe(seed_raw()), parse_stats=stats, timeline=RunTimeline.of(timeline)
    )
    verdict = judge(result, as_recipe(seed_raw()))
    assert verdict.status == "failed"
    assert any("global_batch_size = 64" in r for r in verdict.reasons)


def test_no_evidence_that_disagrees_can_be_reproduced_slower_or_faster(tmp_path):
    """Whatever the throughput, a disagreement keeps the verdict off the judged statuses."""
    for factor in (0.5, 1.0, 2.0):
        log = tmp_path / f"gb64-{factor}.log"
        run_standin(log, 20, args={"global_batch_size": 64}, step_time_s=SEED_STEP * factor)
        assert judged(log)[1].status == "mismatch"


def test_the_recipe_file_and_its_run_block_agree_for_the_standin_runs(tmp_path):
    """The seed's run block run verbatim prints arguments that agree with its fields."""
    raw = yaml.safe_load(SEED.read_text())
    log = tmp_path / "train.log"
    run_standin(log, 20, raw=raw)
    assert judged(log, raw)[0].evidence.consistent


def test_the_4_node_case_through_the_cli_exits_1_with_mismatch(tmp_path):
    log = tmp_path / "train.log"
    run_standin(log, 20)
    raw = seed_raw()
    raw["gpu"]["count"], raw["layout"]["dp"] = 32, 32
    raw["result"].update(steps_per_run=10, window=[2, 9], window_tokens=8 * 128 * 8192)
    raw["run"] = (
        raw["run"]
        .replace("--actor-num-nodes 1", "--actor-num-nodes 4")
        .replace("--num-rollout 20", "--num-rollout 10")
    )
    recipe = tmp_path / "four-nodes.yaml"
    recipe.write_text(yaml.safe_dump(raw, sort_keys=False))
    proc = cli("measure", log, "--recipe", recipe, "--json")
    assert proc.returncode == 1, proc.stderr
    verdict = json.loads(proc.stdout)["verdict"]
    assert verdict["status"] == "mismatch" and verdict["difference_percent"] is None
    assert any("actor_num_nodes = 1" in r for r in verdict["reasons"])
