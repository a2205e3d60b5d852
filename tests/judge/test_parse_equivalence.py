"""The file reader's fast path against the line-by-line reader, over generated logs.

`parse_path` (launcher/judge/parse/reader.py) reads most metric lines through the parser's fast
path (MilesLogParser.fast: bytes, payload templates, cached stamps); the line-by-line reader
(`parse_lines`, MilesLogParser.candidate) is the straightforward reference. Both must give exactly
the same records and counters on every log. The logs here come from a model of a run with every
shape the parser knows (launcher/judge/parse/shapes.py; tests/support/log_shapes.py renders the
versions' shapes) and then an adversary: random interleavings, Ray prefixes with and without
colours, `[repeated Nx across cluster]` suffixes with Ray's colour codes and hint, logging stamps
(also impossible ones), CRLF, lone carriage returns, noise, binary garbage and bad UTF-8, numpy
wrappers, NaN and infinities, ints, booleans, nested values, broken numbers, keys with odd
characters, words that end in a kind (`xstep`, `critic-step`), doubled, replayed, late and
out-of-order lines, dicts without a marker or over several lines, arguments listings, failure
lines, huge lines, and lines cut across the reader's chunks (chunk sizes down to a few bytes).

Seeded (derandomized hypothesis, no database): the same logs in every run, a failure reproducible.
"""

from __future__ import annotations

import pprint
import random
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.log_shapes import Run, render
from support.properties import examples

from launcher.judge.parse import reader
from launcher.judge.parse.miles import MilesLogParser, parse_lines
from launcher.judge.parse.records import ParseStats
from launcher.judge.parse.shapes import SHAPES

# A key such as 'x\\y' goes to the literal reader, which warns about the escape as Python does.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
SETTINGS = examples(60)
PREFIXES = (
    "",
    "(MegatronTrainRayActor pid=5123) ",
    "(MegatronTrainRayActor pid=7, ip=10.0.0.2) ",
    "\x1b[36m(MegatronTrainRayActor pid=5123)\x1b[0m ",
    "\x1b[36m(RolloutManager pid=5101, ip=10.0.0.2)\x1b[0m ",
    "(pid=99)",
    "x",
    "critic-",
    "]",
    "\u00e9",
    "\x1c",
)
STAMPS = (
    "",
    "[2026-10-21 10:00:{s:02d}.250 actor_cell0_rank0] log_utils.py:542 - ",
    "[2026-10-21 10:00:{s:02d}] train.py:88 - ",
    "[2026-10-21T10:00:{s:02d},5] x.py:1 - ",
    "[2026-13-21 10:00:{s:02d}] x.py:1 - ",  # no such month
    "[2026-10-21 10:00:60.1 main] x.py:1 - ",  # no such second
    "[2026-10-21 10:00:{s:02d}.1234567] x.py:1 - ",  # seven digits: not a stamp
    "[2026-10-21 10:00:{s:02d} a\x1fb] x.py:1 - ",
)
VALUES = (
    "0.4",
    "18.96",
    "9.5e-06",
    "1E5",
    "-0.0",
    "+3",
    "8191",
    ".5",
    "7.",
    "nan",
    "inf",
    "-inf",
    "np.float64(129.23)",
    "np.float32(nan)",
    "np.int64(12)",
    "np.float64(1.5",
    "True",
    "None",
    "[1, 2]",
    "'text'",
    "2.3.4",
    "1e",
    "infinity",
    "NaN",
    "\u0661\u0662",
)
KEYS = (
    "train/loss",
    "train/grad_norm",
    "train/lr-pg_0",
    "train/lr-pg_1",
    "train/step",
    "perf/step_time",
    "perf/total_train_time",
    "perf/train_wait_time",
    "perf/train_time",
    "perf/actor_train_time",
    "perf/actor_train_tflops",
    "perf/actor_train_tok_per_s",
    "perf/mfu_peak_tflops",
    "perf/actor_train_mfu",
    "rollout/response_len/mean",
    "perf/rollout_time",
    "rollout/step",
    "k\u00e9y",
    "a: b",
    "a, 'b",
    'd"q',
    "x\\y",
    "",
)
NOISE = (
    "Timer train start",
    "[Rank 0] Memory-Usage after clear_memory: {'gpu': 0, 'used_GB': 21.0}",
    "ip-10-0-0-2:5123:5190 [0] NCCL INFO Channel 00/32 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "ft op=train_step rollout=3 step=0 attempt=0 outcome=NORMAL valid_step=false",
    "Traceback (most recent call last):",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 7.50 GiB.",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "train.py:88 - {'perf/step_time': 19.0, 'perf/actor_train_time': 18.5}",
    "x.py:1 - {'train/loss': 0.5, 'train/step': 3}",
    "------------------------ arguments ------------------------",
    "  global_batch_size ............................... 128",
    "-------------------- end of arguments ---------------------",
    "progress 10%\r progress 20%\r",
    "12: {'not': 'a kind'}",
    "hello [repeated 3x across cluster]",
)
REPEATED = (
    " [repeated 7x across cluster]",
    "\x1b[32m [repeated 3x across cluster] (Ray deduplicates logs by default.)\x1b[0m",
)


def payload(rng: random.Random, kind: str, step: int) -> str:
    """A metric dict: mostly as miles prints it, sometimes not."""
    if kind == "step":
        keys = ["train/loss", "train/grad_norm", "train/lr-pg_0", "train/lr-pg_1", "train/step"]
    elif kind == "perf":
        keys = [
            "perf/train_wait_time",
            "perf/train_time",
            "perf/actor_train_time",
            "perf/actor_train_tflops",
            "perf/actor_train_tok_per_s",
            "perf/mfu_peak_tflops",
            "perf/actor_train_mfu",
            rng.choice(("perf/step_time", "perf/total_train_time", "perf/renamed")),
        ]
    else:
        keys = ["rollout/response_len/mean", "perf/rollout_time"]
    if rng.random() < 0.2:
        keys = rng.sample(KEYS, rng.randint(1, 6)) + keys[: rng.randint(0, len(keys))]
    wait, train = 0.4, round(rng.choice((18.56, 18.6, 1.0)), 2)
    pairs = []
    for key in keys:
        if rng.random() < 0.1:
            value = rng.choice(VALUES)
        elif key in ("perf/step_time", "perf/total_train_time"):
            value = repr(wait + train) if rng.random() < 0.8 else "19.5"  # else: disagrees
        elif key == "perf/train_wait_time":
            value = repr(wait)
        elif key == "perf/train_time":
            value = repr(train)
        elif key == "train/step":
            value = str(step)
        elif key == "train/loss":
            value = repr(round(0.9 + 0.01 * rng.randint(0, 3), 4))
        elif key.endswith(("tflops", "tok_per_s")) and rng.random() < 0.5:
            value = f"np.float64({rng.uniform(1, 1e5)!r})"
        else:
            value = repr(round(rng.uniform(0, 100), rng.randint(0, 6)))
        pairs.append(f"'{key}': {value}")
    sep = ", " if rng.random() < 0.95 else ","
    return "{" + sep.join(pairs) + "}"


def metric_line(rng: random.Random, kind: str, step: int) -> list[str]:
    prefix = rng.choice(PREFIXES) if rng.random() < 0.7 else PREFIXES[1]
    stamp = rng.choice(STAMPS).format(s=rng.choice((step % 60, 59, 60, 0)))
    body = payload(rng, kind, step)
    marker = f"{kind} {step}: "
    if rng.random() < 0.05:
        marker = rng.choice(("xstep ", "critic-step ", "step  ", "rollout ")) + f"{step}: "
    if rng.random() < 0.05:  # printed over several lines (pprint), each line with the prefix
        shown = {"train/loss": 0.9, "train/grad_norm": 2.5, "train/step": step}
        if kind == "perf":
            shown = {"perf/train_wait_time": 0.4, "perf/train_time": 18.6, "perf/step_time": 19.0}
        lines = pprint.pformat(shown, width=30).splitlines()
        return [f"{prefix}{stamp}{marker}{lines[0]}"] + [prefix + line for line in lines[1:]]
    line = f"{prefix}{stamp}{marker}{body}"
    if rng.random() < 0.05:
        line += rng.choice(REPEATED)
    if rng.random() < 0.03:
        line = line[: rng.randint(0, len(line))]  # cut
    return [line]


def adversary(seed: int) -> bytes:
    """A log: a model run in one version's shape, then lines of every kind mixed in."""
    rng = random.Random(seed)
    run = Run(
        shape=rng.choice([s.name for s in SHAPES]),
        steps=rng.randint(1, 12),
        noise=rng.randint(0, 2),
        critic=rng.random() < 0.3,
        replay={rng.randint(0, 11): 0.5} if rng.random() < 0.3 else {},
        print_args=rng.random() < 0.3,
    )
    lines = render(run).splitlines()
    for _ in range(rng.randint(0, 120)):
        step = rng.randint(0, 30)
        roll = rng.random()
        if roll < 0.6:
            new = metric_line(rng, rng.choice(("step", "step", "perf", "perf", "rollout")), step)
        elif roll < 0.85:
            new = [rng.choice(PREFIXES[:4]) + rng.choice(NOISE)]
        elif roll < 0.95:
            new = [bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))).decode("latin-1")]
        else:  # a huge line: noise, or a metric dict with many keys
            keys = ", ".join(f"'perf/k{i}': {i}.5" for i in range(rng.randint(100, 800)))
            new = [rng.choice(("x" * rng.randint(2000, 9000), f"perf {step}: {{{keys}}}"))]
        at = rng.randint(0, len(lines))
        lines[at:at] = new
    text = "".join(line + ("\r\n" if rng.random() < 0.05 else "\n") for line in lines)
    data = text.encode()
    if rng.random() < 0.3:  # bytes that are not UTF-8
        at = rng.randint(0, len(data))
        data = data[:at] + b"\xff\xe2\x82" + data[at:]
    if rng.random() < 0.3:  # no final newline
        data = data.rstrip(b"\n")
    return data


def reference(path: Path) -> tuple[list[dict], str]:
    stats = ParseStats()
    records = [r.to_dict() for r in parse_lines(reader.iter_file_lines(path), stats)]
    return records, repr(asdict(stats))


def by_file(path: Path, chunk: int) -> tuple[list[dict], str]:
    stats = ParseStats()
    saved = reader._CHUNK
    try:
        reader._CHUNK = chunk
        records = [r.to_dict() for r in reader.parse_path(path, stats)]
    finally:
        reader._CHUNK = saved
    return records, repr(asdict(stats))


@SETTINGS
@given(seed=st.integers(min_value=0, max_value=2**32 - 1), chunk=st.sampled_from([7, 97, 4096]))
def test_the_fast_reader_gives_the_line_readers_records_and_counters(seed, chunk):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.log"
        path.write_bytes(adversary(seed))
        want = reference(path)
        assert by_file(path, chunk) == want
        assert by_file(path, 4 << 20) == want


@pytest.mark.parametrize("name", [s.name for s in SHAPES])
def test_the_fast_path_reads_every_shapes_metric_lines(tmp_path, name):
    # The promise is the same result; this keeps it a fast path: each version's step and train
    # perf lines are read by it, none declined to the slow path.
    path = tmp_path / "train.log"
    path.write_text(render(Run(shape=name, steps=8)))
    declined = []
    parser = MilesLogParser()
    for raw in path.read_bytes().split(b"\n"):
        if b": {" in raw and parser.fast(raw) is None:
            declined.append(raw)
    assert [d for d in declined if b"step " in d or b"perf " in d] == []


def test_a_line_the_fast_path_declines_leaves_the_parser_untouched():
    # A second, different line for a step (a conflict) is the slow path's to judge.
    parser = MilesLogParser()
    first = b"step 3: {'train/loss': 0.5, 'train/grad_norm': 1.0, 'train/lr-pg_0': 1e-05}"
    assert parser.fast(first) == []
    before = repr(asdict(parser.stats))
    assert parser.fast(first.replace(b"0.5", b"0.7")) is None
    assert repr(asdict(parser.stats)) == before
