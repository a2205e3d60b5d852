"""The recipe's figures, computed the recipe's way (docs/measurement.md), from step records."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml
from support.measure import as_recipe, run_standin, seed_raw, step_times_for_tps

from launcher.catalog import price_per_hour
from launcher.errors import BadInput
from launcher.judge.measure import measure, pure_figures, stage_split
from launcher.judge.parse.miles import StepRecord
from launcher.judge.timeline import RunTimeline
from launcher.results.evaluate import measure_run_dir


def records_with_times(times: dict[int, float], loss: float = 1.0) -> list[StepRecord]:
    return [
        StepRecord(step=s, loss=loss, step_time=t, timestamp=1000.0 + s)
        for s, t in sorted(times.items())
    ]


def test_seed_mfu_and_cost_from_its_own_tokens_per_second():
    raw = seed_raw()
    claim = raw["result"]
    price = price_per_hour(raw["gpu"]["instance"], "us-east-1")
    assert price.value == 63.296 and price.source == "catalog" and "p5en.48xlarge" in price.detail
    mfu, usd = pure_figures(
        claim["tokens_per_s_per_gpu"],
        gpus=raw["gpu"]["count"],
        active_params=claim["active_params"]["count"],
        peak_flops=989e12,
        usd_per_hour=price.value,
    )
    assert round(mfu, 4) == claim["mfu"] == 0.1276
    assert round(usd, 2) == claim["usd_per_million_tokens"] == 0.32
    assert usd == pytest.approx(0.318, abs=5e-4)


def test_seed_figures_from_a_log_at_the_claimed_speed():
    raw = seed_raw()
    t = step_times_for_tps(raw["result"]["tokens_per_s_per_gpu"])
    times = {s: (t + 40.0 if s == 0 else t) for s in range(20)}  # step 0 carries start-up
    result = measure(records_with_times(times), as_recipe(raw))
    assert result.tokens_per_s_per_gpu == pytest.approx(6913.23, rel=1e-9)
    assert result.window_tokens == raw["result"]["window_tokens"] == 15 * 128 * 8192
    out = result.to_result_yaml()
    assert (
        out["tokens_per_s_per_gpu"] == 6913.23
        and out["mfu"] == 0.1276
        and out["usd_per_million_tokens"] == 0.32
    )
    assert out["provenance"]["std_kind"] == "population"
    assert out["provenance"]["mfu_peak_flops"] == 989e12
    assert out["provenance"]["price"]["usd_per_hour"] == 63.296
    assert set(raw["result"]) <= set(out)  # shaped like the recipe's result block


def test_tokens_per_second_and_population_cv_over_the_window_only():
    raw = seed_raw()
    times = dict.fromkeys(range(5), 100.0)  # warm-up: must not count
    times.update({s: (18.0 if s % 2 else 20.0) for s in range(5, 20)})
    result = measure(records_with_times(times), as_recipe(raw))
    window = [times[s] for s in range(5, 20)]
    assert result.tokens_per_s_per_gpu == pytest.approx(15 * 1048576 / sum(window) / 8)
    assert result.step_time_cv_percent == pytest.approx(
        100 * statistics.pstdev(window) / statistics.mean(window)
    )
    assert result.step_time_cv_percent != pytest.approx(
        100 * statistics.stdev(window) / statistics.mean(window)
    )


def test_missing_and_nan_steps_are_reported():
    raw = seed_raw()
    times = {s: 19.0 for s in range(20) if s not in (7, 8)}
    recs = records_with_times(times)
    recs[3].loss = float("nan")
    result = measure(recs, as_recipe(raw))
    assert result.missing_window_steps == [7, 8]
    assert result.nan_loss_steps == [3]
    assert result.window_tokens == 13 * 1048576


def test_gpu_hours_from_the_timeline_with_a_per_stage_split():
    raw = seed_raw()
    timeline = {
        "acquired_at": 0.0,
        "released_at": 5625.0,
        "stages": [
            {"name": "provision", "start": 0.0, "end": 600.0, "status": "ok"},
            {"name": "train", "start": 1800.0, "end": 3600.0, "status": "ok"},
            {"name": "teardown", "start": 5600.0, "end": None, "status": "running"},
        ],
    }
    result = measure(
        records_with_times(dict.fromkeys(range(20), 19.0)),
        as_recipe(raw),
        timeline=RunTimeline.of(timeline),
    )
    assert result.gpu_hours == pytest.approx(8 * 5625 / 3600) == 12.5
    window_s = 15 * 19.0
    assert result.window_gpu_hours == pytest.approx(8 * window_s / 3600)
    # where they went, in seconds x 8 GPUs: the open teardown stage is not a stage (no end)
    assert result.gpu_hours_by_stage == {
        "acquire": 0.0,
        "provision": pytest.approx(8 * 600 / 3600),
        "train": pytest.approx(8 * (1800 - window_s) / 3600),
        "window": pytest.approx(8 * window_s / 3600),
        "between": pytest.approx(8 * 1200 / 3600),
        "collect": pytest.approx(8 * 2025 / 3600),
    }
    assert sum(result.gpu_hours_by_stage.values()) == pytest.approx(result.gpu_hours)
    unreleased = dict(timeline, released_at=None)
    result = measure(
        records_with_times(dict.fromkeys(range(20), 19.0)),
        as_recipe(raw),
        timeline=RunTimeline.of(unreleased),
    )
    assert (
        result.gpu_hours == pytest.approx(8 * 5600 / 3600)
        and "lower bound" in result.gpu_hours_source
    )


def test_the_split_by_stage_adds_up_to_the_total_and_says_where_the_hours_went():
    """acquire (until the node's first stage), each node stage, train less its measured window,
    the window, the gaps between stages, collect (until the release began) and release."""
    timeline = {
        "acquired_at": 1000.0,
        "release_started_at": 2000.0,
        "released_at": 2060.0,
        "stages": [
            {"name": "preflight", "start": 1300.0, "end": 1310.0, "status": "ok"},
            {"name": "resolve", "start": 1310.0, "end": 1320.0, "status": "ok"},
            {"name": "image", "start": 1321.0, "end": 1500.0, "status": "ok"},
            {"name": "assets", "start": 1500.0, "end": 1600.0, "status": "ok"},
            {"name": "convert", "start": 1600.0, "end": 1700.0, "status": "ok"},
            {"name": "ray", "start": 1700.0, "end": 1710.0, "status": "ok"},
            {"name": "train", "start": 1710.0, "end": 1980.0, "status": "ok"},
        ],
    }
    split = stage_split(RunTimeline.of(timeline), window_s=200.0)
    assert list(split) == [
        "acquire",
        "preflight",
        "resolve",
        "image",
        "assets",
        "convert",
        "ray",
        "train",
        "window",
        "between",
        "collect",
        "release",
    ]
    assert split["acquire"] == 300.0 and split["train"] == 70.0 and split["window"] == 200.0
    assert split["between"] == 1.0 and split["collect"] == 20.0 and split["release"] == 60.0
    assert sum(split.values()) == 1060.0  # released - acquired
    # without the release's start (older runs) collect holds both; a clock that runs behind
    # never makes a part negative
    old = {k: v for k, v in timeline.items() if k != "release_started_at"}
    assert stage_split(RunTimeline.of(old))["collect"] == 80.0 and "release" not in stage_split(
        RunTimeline.of(old)
    )
    skewed = dict(timeline, acquired_at=1400.0)
    assert stage_split(RunTimeline.of(skewed))["acquire"] == 0.0


def test_price_override_region_and_unknown_instance():
    raw = seed_raw()
    recs = records_with_times(dict.fromkeys(range(20), 19.0))
    eu = measure(recs, as_recipe(raw), region="eu-north-1")
    assert eu.price.value == 67.73 and eu.price.region == "eu-north-1"
    assert eu.price.source == "catalog" and "eu-north-1" in eu.price.describe()
    over = measure(recs, as_recipe(raw), price_per_hour=30.0)
    assert over.price.value == 30.0 and over.price.source == "option"
    assert "--price-per-hour" in over.price.describe()
    assert over.usd_per_million_tokens == pytest.approx(eu.usd_per_million_tokens * 30.0 / 67.73)
    raw["gpu"]["instance"] = "Azure ND96isr_H200_v5"
    unknown = measure(recs, as_recipe(raw))
    assert unknown.price is None and unknown.usd_per_million_tokens is None
    assert any("price" in n for n in unknown.notes)
    with pytest.raises(BadInput):
        price_per_hour("p5en.48xlarge", "af-south-1")  # a region the catalog has no price for


def test_recipe_inconsistency_is_reported():
    raw = seed_raw()
    raw["result"]["window_tokens"] = 999
    result = measure(records_with_times(dict.fromkeys(range(20), 19.0)), as_recipe(raw))
    assert any("window_tokens 999" in n for n in result.notes)


def test_recipe_without_a_window_is_bad_input():
    raw = seed_raw()
    del raw["result"]["window"]
    with pytest.raises(BadInput, match="result.window"):
        measure([], as_recipe(raw))


def test_cross_check_flags_timestamps_that_disagree_with_perf_step_time():
    raw = seed_raw()
    recs = [
        StepRecord(step=s, loss=1.0, step_time=19.0, timestamp=1000.0 + 25.0 * s) for s in range(20)
    ]
    result = measure(recs, as_recipe(raw))
    assert result.cross_checks["timestamp_mean_step_time_s"] == pytest.approx(25.0)
    found = result.evidence.disagreements
    assert [d.check for d in found] == ["step times"] and "25.000 s" in found[0].detail


def test_measure_run_dir_writes_every_artifact(tmp_path):
    raw = seed_raw()
    t = step_times_for_tps(7000.0)
    assert run_standin(tmp_path / "logs" / "train.log", steps=20, step_time_s=t) == 0
    (tmp_path / "timeline.json").write_text(
        json.dumps({"acquired_at": 0, "released_at": 3600, "stages": []})
    )
    result, verdict = measure_run_dir(tmp_path, as_recipe(raw))
    assert verdict.status == "reproduced"
    for name in (
        "steps.jsonl",
        "result.yaml",
        "verdict.json",
        "report.md",
        "plots/loss.png",
        "plots/step_time.png",
    ):
        assert (tmp_path / name).is_file(), name
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(20))
    written = yaml.safe_load((tmp_path / "result.yaml").read_text())
    assert written["tokens_per_s_per_gpu"] == round(result.tokens_per_s_per_gpu, 2)
    assert written["tokens_per_s_per_gpu"] == pytest.approx(7000.0, abs=0.01)
    assert written["gpu_hours"] == 8.0
    assert json.loads((tmp_path / "verdict.json").read_text())["status"] == "reproduced"


def test_the_seed_run_block_verbatim_on_the_standin_measures_as_reproduced(tmp_path):
    """The recipe's own `run` script, run by bash from the stand-in tree as from /root/miles."""
    import os
    import subprocess

    from support.measure import STANDIN, START

    raw = seed_raw()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STANDIN_")}
    env.update(
        HF_CKPT="/nonexistent/hf",
        TORCH_DIST="/nonexistent/dist",
        SFT_DATA="/nonexistent/rows.parquet",
        STANDIN_START_EPOCH=str(START),
    )
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    with open(run_dir / "logs" / "train.log", "wb") as log:
        proc = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + raw["run"]],
            cwd=STANDIN,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=60,
        )
    assert proc.returncode == 0, (run_dir / "logs" / "train.log").read_text()[-2000:]
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump(raw))
    reference = tmp_path / "ref.log"
    run_standin(reference, steps=20)
    result, verdict = measure_run_dir(run_dir, as_recipe(raw), reference=reference)
    assert result.steps_parsed == 20  # --num-rollout 20 from the recipe reached the stand-in
    assert verdict.status == "reproduced", verdict.reasons
    assert json.loads((run_dir / "convergence.json").read_text())["passed"] is True
    assert "Convergence" in (run_dir / "report.md").read_text()


def test_cost_per_million_tokens_pays_for_every_node_of_a_multi_node_recipe():
    # Two p5en nodes (16 GPUs) at the seed's tokens/s per GPU cost the same per token as one:
    # the hourly price is per node (--price-per-hour is "US$ per node-hour"), so it counts twice.
    raw = seed_raw()
    raw["gpu"]["count"], raw["gpu"]["per_node"] = 16, 8
    raw["result"]["window_tokens"] = 15 * 128 * 8192
    t = 128 * 8192 / 6913.23 / 16
    result = measure(
        records_with_times(dict.fromkeys(range(20), t)), as_recipe(raw), region="us-east-1"
    )
    assert result.tokens_per_s_per_gpu == pytest.approx(6913.23)
    expected = 2 * 63.296 / (6913.23 * 16 * 3600 / 1e6)
    assert result.usd_per_million_tokens == pytest.approx(expected)
    assert round(result.usd_per_million_tokens, 2) == 0.32
