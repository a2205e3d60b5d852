"""The miles log parser against what real logs contain (docs/miles-log.md, "The log format")."""

from __future__ import annotations

import math

import pytest
from support.measure import run_standin

from launcher.judge.parse.miles import (
    MilesLogParser,
    ParseStats,
    parse_lines,
    parse_payload,
)
from launcher.judge.parse.reader import parse_file

ACTOR = "(MegatronTrainRayActor pid=5123) "
ACTOR_IP = "(MegatronTrainRayActor pid=7, ip=10.0.0.2) "
ROLLOUT = "(RolloutManager pid=5101) "


def stamp(sec: int) -> str:
    return f"[2026-10-21 10:{sec // 60:02d}:{sec % 60:02d}.250 actor_cell0_rank0]"


def step_line(n: int, loss="0.91", grad="2.3", prefix=ACTOR, sec=None) -> str:
    return (
        f"{prefix}{stamp(sec if sec is not None else 20 * n)} log_utils.py:542 - step {n}: "
        f"{{'train/loss': {loss}, 'train/grad_norm': {grad}, 'train/lr-pg_0': 9.5e-06, "
        f"'train/lr-pg_1': 9.5e-06, 'train/step': {n}}}"
    )


def perf_line(n: int, step_time="19.0", prefix=ACTOR) -> str:
    # miles computes perf/step_time as train wait + train: the parts are printed to agree.
    digits = step_time.removeprefix("np.float64(").rstrip(")")
    try:
        train = repr(float(digits) - 0.4) if math.isfinite(float(digits)) else "18.6"
    except ValueError:
        train = "18.6"
    return (
        f"{prefix}{stamp(20 * n)} train_metric_utils.py:56 - perf {n}: {{'perf/train_wait_time': 0.4, "
        f"'perf/train_time': {train}, 'perf/actor_train_time': 18.5, 'perf/actor_train_tflops': np.float64(130.1), "
        f"'perf/actor_train_tok_per_s': np.float64(56680.0), 'perf/mfu_peak_tflops': 989.0, "
        f"'perf/actor_train_mfu': 0.13, 'perf/step_time': {step_time}, 'perf/wait_time_ratio': 0.02}}"
    )


def rollout_perf_line(n: int) -> str:
    return (
        f"{ROLLOUT}[2026-10-21 10:00:00.000 rollout_manager] metrics.py:89 - perf {n}: "
        f"{{'rollout/response_len/mean': 5546.2, 'perf/rollout_time': np.float64(0.31)}}"
    )


def test_one_record_per_step_from_doubled_step_line_and_both_perf_lines():
    lines = []
    for n in range(3):
        lines += [
            rollout_perf_line(n),
            f"{ROLLOUT}[2026-10-21 10:00:00.000 rollout_manager] rollout.py:1 - rollout {n}: "
            "{'rollout/total_lengths': 8192.0, 'rollout/response_lengths': 5546.2}",
            step_line(n),
            step_line(n),
            perf_line(n),
        ]
    stats = ParseStats()
    records = list(parse_lines(lines, stats))
    assert [r.step for r in records] == [0, 1, 2]
    r = records[1]
    assert (r.loss, r.grad_norm, r.lr, r.step_time, r.actor_train_time) == (
        0.91,
        2.3,
        9.5e-06,
        19.0,
        18.5,
    )
    assert r.tflops == 130.1
    assert r.tokens == round(56680.0 * 18.5)
    assert r.timestamp == pytest.approx(1792576800.0 + 20 + 0.25)
    assert stats.duplicates == 3
    assert (
        stats.rollout_perf_lines == 3 and stats.train_perf_lines == 3 and stats.rollout_lines == 3
    )
    assert stats.unparseable == 0


def test_ray_prefix_with_ip_and_ansi_colours():
    colored = f"\x1b[36m{ACTOR_IP.strip()}\x1b[0m "
    records = list(parse_lines([step_line(4, prefix=colored), perf_line(4, prefix=ACTOR_IP)]))
    assert len(records) == 1 and records[0].loss == 0.91 and records[0].step_time == 19.0


def test_nan_inf_and_numpy_values_are_data_not_errors():
    stats = ParseStats()
    lines = [
        step_line(0, loss="nan", grad="inf"),
        perf_line(0, step_time="np.float64(19.5)"),
        step_line(1, loss="np.float64(nan)", grad="-inf"),
        perf_line(1),
    ]
    records = list(parse_lines(lines, stats))
    assert math.isnan(records[0].loss) and records[0].grad_norm == math.inf
    assert records[0].step_time == 19.5
    assert math.isnan(records[1].loss) and records[1].grad_norm == -math.inf
    assert stats.unparseable == 0


def test_repeated_across_cluster_suffix_is_stripped_and_counted():
    stats = ParseStats()
    records = list(
        parse_lines([step_line(2) + " [repeated 7x across cluster]", perf_line(2)], stats)
    )
    assert records[0].loss == 0.91
    assert stats.repeated == 1 and stats.repeated_collapsed == 7


def test_interleaved_processes_and_out_of_order_lines():
    # perf 0 arrives after step 1's line; another process's noise in between.
    lines = [
        step_line(0),
        "(pid=99) some other process says hello",
        step_line(1),
        perf_line(0),
        rollout_perf_line(1),
        perf_line(1),
    ]
    records = list(parse_lines(lines))
    assert [(r.step, r.step_time) for r in records] == [(0, 19.0), (1, 19.0)]


def test_garbage_and_broken_metric_lines_are_counted_never_fatal():
    stats = ParseStats()
    lines = [
        "\x00\x01binary garbage \xff",
        "step 3: {'train/loss': ",
        "Traceback (most recent call last):",
        step_line(5).replace("'train/grad_norm': 2.3", "'train/grad_norm': 2.3.4"),
        step_line(6),
        perf_line(6),
        "{'not': 'a metric line'}",
    ]
    records = list(parse_lines(lines, stats))
    assert [r.step for r in records] == [6]
    assert stats.unparseable == 2 and stats.truncated == 0
    assert stats.lines == len(lines)
    assert stats.unparseable_examples


def test_last_line_cut_mid_dict_counts_as_truncated():
    stats = ParseStats()
    lines = [step_line(0), perf_line(0), step_line(1)[:-40]]
    records = list(parse_lines(lines, stats))
    assert [r.step for r in records] == [0]
    assert stats.truncated == 1 and stats.unparseable == 0


def test_payload_reader_handles_nested_values_through_the_ast_path():
    value = parse_payload(
        "{'a': [1, 2.5, nan], 'b': {'c': -inf}, 'd': 'text', 'e': np.float64(3.0)}"
    )
    assert value["a"][:2] == [1, 2.5] and math.isnan(value["a"][2])
    assert value["b"]["c"] == -math.inf and value["d"] == "text" and value["e"] == 3.0
    with pytest.raises(ValueError):
        parse_payload("{'a': __import__('os').system('true')}")


def test_memory_stays_bounded_on_a_long_stream():
    parser = MilesLogParser()
    peak = 0
    released = 0
    for n in range(5000):
        for line in (step_line(n), step_line(n), perf_line(n)):
            released += len(parser.feed(line))
            peak = max(peak, len(parser._pending))
    released += len(parser.finish())
    assert released == 5000
    assert peak <= 6  # a handful of steps pending, however long the log


def test_standin_log_round_trip(tmp_path):
    log = tmp_path / "logs" / "train.log"
    assert run_standin(log, steps=12, step_times="20,19,18.5", nan_at=10) == 0
    result = parse_file(log)
    assert [r.step for r in result.records] == list(range(12))
    assert result.records[1].step_time == 19.0 and result.records[5].step_time == 18.5
    assert math.isnan(result.records[10].loss) and not math.isnan(result.records[9].loss)
    assert result.records[0].tokens == 128 * 8192
    assert result.stats.unparseable == 0 and result.stats.duplicates == 12
    assert result.stats.repeated == 1


def test_standin_killed_mid_line_is_truncated_not_fatal(tmp_path):
    log = tmp_path / "train.log"
    assert run_standin(log, steps=20, cut_at=7) == 137
    result = parse_file(log)
    assert result.stats.truncated == 1
    assert max(r.step for r in result.records if r.loss is not None) == 6


@pytest.mark.parametrize("cut", [None, 9])
def test_file_reader_and_line_reader_agree(tmp_path, cut):
    from launcher.judge.parse import reader

    log = tmp_path / "train.log"
    run_standin(log, steps=15, step_times="21,19.5,19.1", **({"cut_at": cut} if cut else {}))
    with open(log, "a") as fh:  # garbage, a broken metric line, Ray's dedup note, no final newline
        fh.write(
            "\x00\x01garbage\n(A pid=1) perf 3: {'perf/step_time': 1.0.0}\n"
            "(A pid=1) [2026-10-21 10:00:00.000 main] x.py:1 - hello [repeated 3x across cluster]\nlast words"
        )
    small_chunks = reader._CHUNK
    try:
        reader._CHUNK = 1000  # many chunk boundaries, lines cut across them
        a_stats, b_stats = ParseStats(), ParseStats()
        by_file = list(reader.parse_path(log, a_stats))
    finally:
        reader._CHUNK = small_chunks
    by_lines = list(parse_lines(reader.iter_file_lines(log), b_stats))
    assert by_file == by_lines and len(by_file) == (cut or 15)
    assert a_stats == b_stats
    assert a_stats.repeated == 2 and a_stats.repeated_collapsed == 10
    assert a_stats.lines == len(log.read_bytes().split(b"\n"))


def test_standin_failure_and_model_args(tmp_path):
    import subprocess
    import sys

    from support.measure import STANDIN

    log = tmp_path / "train.log"
    assert run_standin(log, steps=20, fail_at=5) == 1
    result = parse_file(log)
    assert [r.step for r in result.records] == [0, 1, 2, 3, 4]
    assert "Traceback" in log.read_text()
    script = "miles/utils/external_utils/model_args_utils.py"
    ok = subprocess.run(
        [sys.executable, script, "qwen3-30B-A3B"], cwd=STANDIN, capture_output=True, text=True
    )
    assert ok.returncode == 0 and ok.stdout.count("\n") == 1 and "--num-experts 128" in ok.stdout
    bad = subprocess.run(
        [sys.executable, script, "llama-1B"], cwd=STANDIN, capture_output=True, text=True
    )
    assert bad.returncode != 0 and bad.stdout == ""


@pytest.mark.parametrize(
    "hint",
    [
        "",
        " (Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log "
        "deduplication, or see https://docs.ray.io/en/master/ray-observability/user-guides/"
        "configure-logging.html#log-deduplication for more options.)",
    ],
)
def test_repeated_suffix_as_ray_prints_it_green_with_its_first_time_hint(hint):
    # Ray's DedupState.formatted(): line + GREEN + " [repeated Nx across cluster]" + hint (first time only) + RESET.
    stats = ParseStats()
    line = step_line(2, loss="nan") + f"\x1b[32m [repeated 3x across cluster]{hint}\x1b[0m"
    records = list(parse_lines([line, perf_line(2)], stats))
    assert math.isnan(records[0].loss)
    assert stats.unparseable == 0
    assert stats.repeated == 1 and stats.repeated_collapsed == 3


def test_a_rollout_line_with_a_train_key_is_the_rollout_managers_never_a_step():
    # Found by tests/judge/test_parse_equivalence.py: such a line for a released step crashed the
    # conflict check (KeyError 'rollout'); a `rollout N:` line is counted as one, whatever its keys.
    stats = ParseStats()
    lines = [step_line(n) for n in range(8)] + [
        "rollout 1: {'perf/step_time': 97.0, 'train/lr-pg_0': 97.0}",
        "rollout 7: {'perf/step_time': 97.0}",
    ]
    records = list(parse_lines(lines, stats))
    assert [r.step_time for r in records] == [None] * 8 and stats.rollout_lines == 2
    assert stats.conflicts == 0 and stats.late == 0
