"""One fixture log per shape of step and perf line that a tagged miles or slime release prints,
and per failure shape, each measured to the figures its model gives (tests/support/log_shapes.py;
docs/miles-log.md, "Which version prints what").

Issue 20's cases are here: a slime v0.1.0 log (`perf/total_train_time`) is measured, not FAILED;
`critic-step N:` lines are not the actor's steps; a NaN grad norm, skipped optimizer steps with a
frozen loss, an OOM and an illegal memory access are `failed`, naming the step and the line, with
no difference from the claim and no in-band reason; a replayed step with another loss is a
mismatch for `measure` and never a pass for `compare`.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from support.cli import completed_here
from support.log_shapes import FIXTURE_RUNS, FIXTURES, REPO, expected, render
from support.measure import SEED, seed_recipe

from launcher.judge.parse.shapes import SHAPES
from launcher.results.evaluate import measure_path, parse_log

NAMES = sorted(FIXTURE_RUNS)


def cli(*args: object) -> subprocess.CompletedProcess:
    return completed_here(*map(str, args), cwd=REPO)


def test_every_shape_of_the_table_has_a_fixture():
    assert {s.name for s in SHAPES} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_fixture_is_its_model_rendered(name):
    # The files are what the model renders (regenerate: python tests/support/log_shapes.py).
    run = FIXTURE_RUNS[name]
    assert (FIXTURES / f"{name}.log").read_text() == render(run)
    assert yaml.safe_load((FIXTURES / f"{name}.expected.yaml").read_text()) == expected(run)


@pytest.mark.parametrize("name", NAMES)
def test_the_fixture_is_measured_to_its_expected_figures(name):
    want = yaml.safe_load((FIXTURES / f"{name}.expected.yaml").read_text())
    result, verdict = measure_path(FIXTURES / f"{name}.log", seed_recipe())
    assert verdict.status == want["status"], verdict.reasons
    text = " ".join(verdict.reasons)
    for word in want["reasons_mention"]:
        assert word in text
    if want["tokens_per_s_per_gpu"] is not None:
        assert result.tokens_per_s_per_gpu == pytest.approx(want["tokens_per_s_per_gpu"], rel=1e-9)
        assert verdict.difference_percent is not None
    if verdict.status in ("failed", "incomplete", "mismatch", "unreadable"):
        assert verdict.difference_percent is None
        assert not any("within -" in r for r in verdict.reasons)
    assert verdict.to_dict()["policy"]["name"] == "reproduce-verdict"


def test_critic_steps_are_not_the_actors():
    records, stats = parse_log(FIXTURES / "ppo-critic.log")
    assert stats.role_step_lines == 20
    assert [r.step for r in records] == list(range(20))
    assert all(r.loss is not None and r.loss > 0.5 for r in records)  # the actor's loss, not 0.3


@pytest.mark.parametrize(
    ("name", "word", "step"),
    [("oom-at-step-12", "OutOfMemoryError", 11), ("illegal-memory-access", "illegal memory", 8)],
)
def test_the_error_that_ended_training_is_named_with_its_step(name, word, step):
    _, verdict = measure_path(FIXTURES / f"{name}.log", seed_recipe())
    assert verdict.status == "failed"
    assert verdict.error is not None and word in verdict.error
    assert any(f"after step {step}" in r and word in r for r in verdict.reasons)


def test_compare_never_passes_a_replayed_step_with_two_losses():
    proc = cli(
        "compare", FIXTURES / "replay-two-losses.log", FIXTURES / "miles-v0.1.0.log", "--json"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["passed"] is False
    assert any("step 7" in r and "0.777" in r for r in data["reasons"])


def test_compare_calls_an_unreadable_log_unreadable_exit_2_as_measure_does(tmp_path):
    import gzip

    packed = tmp_path / "train.log.gz"
    packed.write_bytes(gzip.compress((FIXTURES / "miles-v0.1.0.log").read_bytes()))
    empty = tmp_path / "empty.log"
    empty.write_text("")
    for bad in (packed, empty, FIXTURES / "no-step-time.log"):
        measured = cli("measure", bad, "--recipe", SEED)
        compared = cli("compare", bad, FIXTURES / "miles-v0.1.0.log")
        assert measured.returncode == compared.returncode == 2, compared.stdout
        assert "not a log this launcher can read" in compared.stderr
        assert "Traceback" not in compared.stderr
        named = "gzip-compressed data, not text" in measured.stderr + measured.stdout
        assert named == (bad == packed), measured.stderr  # a gzip log is named as gzip


def test_two_bare_logs_with_different_printed_arguments_are_not_one_recipe(tmp_path):
    text = (FIXTURES / "miles-v0.1.0.log").read_text()
    other = tmp_path / "other.log"
    other.write_text(
        text.replace(
            "  global_batch_size ............................... 128",
            "  global_batch_size ............................... 64",
        )
    )
    refused = cli("compare", other, FIXTURES / "miles-v0.1.0.log")
    assert refused.returncode == 2 and "global_batch_size: 64 vs 128" in refused.stderr
    allowed = cli(
        "compare", other, FIXTURES / "miles-v0.1.0.log", "--allow-different-recipes", "--json"
    )
    identity = json.loads(allowed.stdout)["recipes"]["identity"]
    assert "different printed arguments" in identity and "not checked" not in identity
    same = cli("compare", FIXTURES / "step-time-print.log", FIXTURES / "miles-v0.1.0.log", "--json")
    assert same.returncode == 0
    assert "same printed arguments" in json.loads(same.stdout)["recipes"]["identity"]


def test_the_standin_oom_is_failed_naming_the_exception_and_its_step(tmp_path):
    from support.measure import run_standin

    log = tmp_path / "train.log"
    assert run_standin(log, 20, oom_at=12) == 1
    _, verdict = measure_path(log, seed_recipe())
    assert verdict.status == "failed" and verdict.difference_percent is None
    assert verdict.error is not None and "OutOfMemoryError" in verdict.error
    assert any("after step 11" in r for r in verdict.reasons)


def test_a_reference_the_gate_does_not_pass_is_refused(tmp_path):
    import shutil

    from launcher.errors import BadInput
    from launcher.results.evaluate import measure_run_dir

    rd = tmp_path / "run"
    (rd / "logs").mkdir(parents=True)
    shutil.copyfile(FIXTURES / "miles-v0.1.0.log", rd / "logs" / "train.log")
    with pytest.raises(BadInput, match="two lines give loss"):
        measure_run_dir(
            rd, seed_recipe(), write_plots=False, reference=FIXTURES / "replay-two-losses.log"
        )
