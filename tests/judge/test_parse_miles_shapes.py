"""The shapes miles and slime print their metrics in, across versions (docs/miles-log.md), and logs
that are not miles' at all.

Every fixture is written here from the formats as their source code prints them (no copied
logs): slime/miles `logger.info(f"perf {rollout_id}: {log_dict}")` under the logging format
`[%(asctime)s] %(filename)s:%(lineno)d - %(message)s` (with or without milliseconds and a process
name), slime v0.1.0's `print(f"perf {rollout_id}: {log_dict}")` with `perf/total_train_time`,
a dict logged with no marker, dicts pretty-printed over several lines (pprint, json indent=2),
Ray's actor prefixes, ANSI colours, `[repeated Nx across cluster]`, CRLF line ends, and
Megatron's `_print_args` listing. Each is read by the file reader and the line reader alike.
"""

from __future__ import annotations

import json
import pprint
from pathlib import Path

import pytest
from support.cli import completed_here
from support.measure import REPO, SEED, run_standin, seed_raw

from launcher.judge.parse import reader
from launcher.judge.parse.miles import ParseStats, parse_lines

ACTOR = "(MegatronTrainRayActor pid=5123) "
COLOR = "\x1b[36m(MegatronTrainRayActor pid=5123, ip=10.0.0.2)\x1b[0m "


def perf(n: int, step_time: float = 19.0, tok: float = 56680.0) -> dict:
    return {
        "perf/train_wait_time": 0.4,
        "perf/train_time": step_time - 0.4,
        "perf/actor_train_time": 18.5,
        "perf/actor_train_tflops": 130.1,
        "perf/actor_train_tok_per_s": tok,
        "perf/step_time": step_time,
    }


def step(n: int, loss: float = 0.9) -> dict:
    return {"train/loss": loss, "train/grad_norm": 2.3, "train/lr-pg_0": 1e-05, "train/step": n}


def stamp(sec: int, ms: bool = True, proc: str | None = "actor_cell0_rank0") -> str:
    frac = ".250" if ms else ""
    return f"[2026-10-21 10:{sec // 60:02d}:{sec % 60:02d}{frac}{' ' + proc if proc else ''}]"


def both_readers(tmp_path: Path, lines: list[str], newline: str = "\n"):
    """(records, stats) from the file reader, checked equal to the line reader's."""
    path = tmp_path / "train.log"
    path.write_bytes(newline.join(lines).encode() + newline.encode())
    a, b = ParseStats(), ParseStats()
    small = reader._CHUNK
    try:
        reader._CHUNK = 97  # many chunk boundaries, inside dicts and listings
        by_file = list(reader.parse_path(path, a))
    finally:
        reader._CHUNK = small
    by_lines = list(parse_lines(reader.iter_file_lines(path), b))
    assert by_file == by_lines and a == b
    return by_file, a


def test_marker_lines_with_and_without_ray_prefix_colours_and_milliseconds(tmp_path):
    lines = []
    for n in range(3):
        prefix = (ACTOR, COLOR, "")[n]
        when = stamp(20 * n, ms=n != 1, proc=None if n == 2 else "actor_cell0_rank0")
        lines += [
            f"{prefix}{when} log_utils.py:542 - step {n}: {step(n)}",
            f"{prefix}{when} train_metric_utils.py:56 - perf {n}: {perf(n)}",
        ]
    records, stats = both_readers(tmp_path, lines)
    assert [(r.step, r.step_time, r.loss) for r in records] == [(n, 19.0, 0.9) for n in range(3)]
    assert records[2].timestamp == pytest.approx(1792576800.0 + 40 + 0.25)
    assert stats.coarse_stamps == 1 and stats.unparseable == 0  # step 1 is stamped to the second


def test_slime_v010_printed_perf_without_logging_prefix_and_total_train_time(tmp_path):
    # slime v0.1.0, slime/backends/megatron_utils/data.py:377: print(f"perf {rollout_id}: ...")
    # with perf/total_train_time = train_wait_time + train_time (renamed perf/step_time later).
    lines = []
    for n in range(3):
        d = {"perf/train_wait_time": 0.5, "perf/train_time": 18.5, "perf/actor_train_time": 18.4}
        d["perf/total_train_time"] = 19.0
        d["perf/wait_time_ratio"] = 0.5 / 19.0
        lines += [f"step {n}: {step(n)}", f"perf {n}: {d}"]
    records, stats = both_readers(tmp_path, lines)
    assert [r.step_time for r in records] == [19.0, 19.0, 19.0]
    assert stats.coarse_stamps == 0 and stats.no_step_time == 0


def test_a_step_time_key_no_version_printed_is_not_taken_without_its_parts(tmp_path):
    # `perf/total_train_loop_time` was never printed by miles or slime: not a step time.
    d = {"perf/train_wait_time": 0.5, "perf/actor_train_time": 18.4}
    d["perf/total_train_loop_time"] = 19.0
    records, stats = both_readers(tmp_path, [f"step 0: {step(0)}", f"perf 0: {d}"])
    assert records[0].step_time is None
    assert stats.no_step_time == 1 and "no step time" in stats.half_read_examples[0]


def test_a_dict_logged_without_a_marker_takes_its_step_from_a_field(tmp_path):
    lines = []
    for n in (3, 4, 5):
        d = {**perf(n, 18.0 + n), "rollout/step": n}
        lines += [
            f"{ACTOR}{stamp(n)} train.py:88 - {d}",
            f"{ACTOR}{stamp(n)} train.py:90 - {step(n)}",
            f"{ACTOR}{stamp(n)} train.py:90 - {step(n)}",  # doubled, as miles prints it
        ]
    records, stats = both_readers(tmp_path, lines)
    assert [(r.step, r.step_time, r.loss) for r in records] == [
        (3, 21.0, 0.9),
        (4, 22.0, 0.9),
        (5, 23.0, 0.9),
    ]
    assert stats.unmarked == 9 and stats.duplicates == 3


def test_a_dict_logged_without_a_marker_or_a_step_field_takes_its_step_from_line_order(tmp_path):
    lines = []
    for n in range(4):
        d = perf(n, 18.0 + n)
        lines.append(f"[2026-10-21 10:00:0{n}] train.py:88 - {d}")
        lines.append(f"[2026-10-21 10:00:0{n}] rollout.py:1 - {{'perf/rollout_time': 0.3}}")
    records, stats = both_readers(tmp_path, lines)
    assert [(r.step, r.step_time) for r in records] == [(n, 18.0 + n) for n in range(4)]
    assert stats.rollout_perf_lines == 4


@pytest.mark.parametrize("style", ["pprint", "json", "pprint+ray"])
def test_dicts_pretty_printed_over_several_lines(tmp_path, style):
    lines = []
    for n in range(3):
        for kind, d in (("step", step(n)), ("perf", perf(n, 19.5))):
            if style == "json":
                body = json.dumps(d, indent=2)
            else:
                body = pprint.pformat(d, width=40)
            head, *rest = body.splitlines()
            prefix = ACTOR if style == "pprint+ray" else ""
            lines.append(f"{prefix}{stamp(n)} log_utils.py:542 - {kind} {n}: {head}")
            lines += [f"{prefix}{line}" for line in rest]
        lines.append(f"{stamp(n)} other.py:1 - an unrelated line")
    records, stats = both_readers(tmp_path, lines)
    assert [(r.step, r.loss, r.step_time) for r in records] == [(n, 0.9, 19.5) for n in range(3)]
    assert stats.multiline == 6 and stats.unparseable == 0


def test_a_pretty_printed_dict_cut_by_the_end_of_the_log_is_truncated(tmp_path):
    body = pprint.pformat(perf(1), width=40).splitlines()
    lines = [f"step 0: {step(0)}", f"perf 0: {perf(0)}", f"step 1: {step(1)}"]
    lines += [f"perf 1: {body[0]}", *body[1:3]]
    records, stats = both_readers(tmp_path, lines)
    assert stats.truncated == 1 and stats.unparseable == 0
    assert records[1].step_time is None


def test_crlf_ansi_numpy_and_repeated_suffix(tmp_path):
    lines = []
    for n in range(2):
        p = "{" + ", ".join(f"'{k}': np.float64({v!r})" for k, v in perf(n).items()) + "}"
        lines += [
            f"{COLOR}{stamp(n)} log_utils.py:542 - step {n}: {step(n)}",
            f"{COLOR}{stamp(n)} train_metric_utils.py:56 - perf {n}: {p}"
            "\x1b[32m [repeated 2x across cluster]\x1b[0m",
        ]
    records, stats = both_readers(tmp_path, lines, newline="\r\n")
    assert [(r.step, r.step_time) for r in records] == [(0, 19.0), (1, 19.0)]
    assert stats.repeated == 2 and stats.unparseable == 0


def test_megatron_arguments_listing_is_read_including_long_names(tmp_path):
    names = {
        "global_batch_size": "128",
        "tensor_model_parallel_size": "1",
        "a_name_that_is_longer_than_forty_eight_characters_in_all": "True",
        "lr": "1e-05",
        "empty": "",
    }
    listing = ["------------------------ arguments ------------------------"]
    for name, value in names.items():
        listing.append(f"  {name} {'.' * (48 - len(name))} {value}")
    listing.append("-------------------- end of arguments ---------------------")
    records, stats = both_readers(tmp_path, [*listing, f"step 0: {step(0)}", f"perf 0: {perf(0)}"])
    assert stats.arguments == names and stats.argument_blocks == 1
    assert len(records) == 1


@pytest.mark.parametrize(
    "content, first",
    [
        (b"", "(the log is empty)"),
        (bytes(range(256)) * 40, "\\x00"),
        (b"Epoch 1/3\nloss: 0.91 - accuracy: 0.55\nEpoch 2/3\n", "Epoch 1/3"),
        (b"[2026-10-21 10:00:00] x.py:1 - {'perf/step_time': 1.0.0}\n", "perf/step_time"),
    ],
    ids=["empty", "binary", "another-program", "broken-metric-line"],
)
def test_a_log_nothing_in_which_is_miles_is_unreadable_exit_2_never_failed(
    tmp_path, content, first
):
    log = tmp_path / "train.log"
    log.write_bytes(content)
    proc = completed_here("measure", log, "--recipe", SEED, "--json", cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    data = json.loads(proc.stdout)
    assert data["verdict"]["status"] == "unreadable"
    assert "Expected miles' metric lines" in proc.stderr and first in proc.stderr
    assert "FAILED" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    human = completed_here("measure", log, "--recipe", SEED, cwd=REPO)
    assert human.returncode == 2 and "not a log this launcher can read" in human.stderr


def test_the_standin_prints_the_listing_as_megatron_does(tmp_path):
    log = tmp_path / "train.log"
    run_standin(log, 3)
    result = reader.parse_file(log)
    listing = result.stats.arguments
    assert listing["global_batch_size"] == "128" and listing["expert_model_parallel_size"] == "8"
    assert listing["max_tokens_per_gpu"] == "16384" and listing["num_rollout"] == "3"
    text = log.read_text()
    assert "  global_batch_size ............................... 128\n" in text
    assert seed_raw()["workload"]["global_batch"] == 128


def test_failure_lines_are_kept_with_their_step_by_both_readers(tmp_path):
    lines = []
    for n in range(6):
        lines += [f"{ACTOR}{stamp(n * 19)} log_utils.py:542 - step {n}: {step(n)}"]
        lines += [f"{ACTOR}{stamp(n * 19)} train_metric_utils.py:56 - perf {n}: {perf(n)}"]
        valid = "false" if n >= 4 else "true"
        lines.append(
            f"{ACTOR}{stamp(n * 19)} model.py:636 - ft op=train_step rollout={n} step=0 "
            f"attempt=0 outcome=NORMAL valid_step={valid}"
        )
    lines += [
        f"{ACTOR}Traceback (most recent call last):",
        f'{ACTOR}  File "/root/miles/train.py", line 92, in <module>',
        f"{ACTOR}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB.",
        "an error-free line that only mentions an error",
    ]
    _, stats = both_readers(tmp_path, lines)
    assert stats.skipped_optimizer_steps == 2 and stats.skipped_rollouts == [4, 5]
    kinds = [(s["kind"], s["after_step"]) for s in stats.signals]
    assert kinds == [
        ("skipped optimizer step", 4),
        ("skipped optimizer step", 5),
        ("exception", 5),
        ("out of memory", 5),
    ]
    assert "OutOfMemoryError" in stats.signals[-1]["line"]
