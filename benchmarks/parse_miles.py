"""Benchmark: parse speed (MB/s) and peak memory of the miles log parser on a large log, side by
side with a bare Python loop over the same file (issue 24's goal: on the dense log, the parser at
least as fast as the bare loop; memory flat).

The bare loop is the least a line-by-line reader can do: open the file, iterate its lines, one
compiled regular expression `search` per line (the metric marker, `(step|perf|rollout) N: {`).
Each measurement runs in a fresh process, bare loop and parser alternating, so a busy machine
slows both alike; the ratio is parser MB/s over bare-loop MB/s of the same round. A third child,
the floor (`floor_child`), only tells each line's kind: its ratio is the most any reader that
touches each line from Python could reach.

Target (mixed log): at least 100 MB/s, with memory that does not grow with the log's length,
shown on a 1 GB log. The log is synthetic but shaped like a real miles run (docs/miles-log.md): per step
the doubled `step N:` line, both `perf N:` lines, a `rollout N:` line, Timer and Memory-Usage
lines from 8 ranks (some collapsed by Ray), NCCL and warning chatter, ANSI-coloured Ray prefixes,
and one garbage line. `--dense` makes every line a metric line (the worst case).

    .venv/bin/python benchmarks/parse_miles.py --size-mb 1024 [--dense] [--keep PATH] [--repeat N]

Each measurement runs in a fresh process so that its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The tree to measure: PYTHONPATH's first entry when set (an older tree, for a baseline in the
# same run), else this repository.
sys.path.insert(
    0,
    os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
    or str(Path(__file__).resolve().parents[1]),
)

ACTOR = "\x1b[36m(MegatronTrainRayActor pid=5123)\x1b[0m "
ROLLOUT = "\x1b[36m(RolloutManager pid=5101, ip=10.0.0.2)\x1b[0m "


def step_block(n: int, dense: bool) -> str:
    ts = f"[2026-10-21 {10 + (n // 3600) % 14:02d}:{(n // 60) % 60:02d}:{n % 60:02d}.123"
    metric = [
        f"{ROLLOUT}{ts} rollout_manager] metrics.py:89 - perf {n}: {{'rollout/response_len/mean': 5546.2, "
        f"'rollout/response_len/median': 5601.0, 'rollout/response_len/max': 8191, 'rollout/response_len/min': 3, "
        f"'perf/rollout_time': np.float64(0.31)}}",
        f"{ROLLOUT}{ts} rollout_manager] rollout.py:301 - rollout {n}: {{'rollout/total_lengths': 8192.0, "
        f"'rollout/response_lengths': 5546.2}}",
        f"{ACTOR}{ts} actor_cell0_rank0] log_utils.py:542 - step {n}: {{'train/loss': 0.9123{n % 10}, "
        f"'train/grad_norm': 2.31, 'train/lr-pg_0': 9.5e-06, 'train/lr-pg_1': 9.5e-06, 'train/step': {n}}}",
        f"{ACTOR}{ts} actor_cell0_rank0] log_utils.py:542 - step {n}: {{'train/loss': 0.9123{n % 10}, "
        f"'train/grad_norm': 2.31, 'train/lr-pg_0': 9.5e-06, 'train/lr-pg_1': 9.5e-06, 'train/step': {n}}}",
        f"{ACTOR}{ts} actor_cell0_rank0] train_metric_utils.py:56 - perf {n}: {{'perf/train_wait_time': 0.4, "
        f"'perf/data_preprocess_time': 0.02, 'perf/train_time': 18.56, 'perf/actor_train_time': 18.51, "
        f"'perf/actor_train_tflops': np.float64(129.23), 'perf/actor_train_tok_per_s': np.float64(56649.16), "
        f"'perf/mfu_peak_tflops': 989.0, 'perf/actor_train_mfu': 0.1306, 'perf/step_time': 18.96, "
        f"'perf/wait_time_ratio': 0.021}}",
    ]
    if dense:
        return "\n".join(metric) + "\n"
    noise = [f"{ACTOR}{ts} actor_cell0_rank0] timer.py:24 - Timer train start"]
    for r in range(8):
        noise.append(
            f"{ACTOR}{ts} actor_cell0_rank{r}] train.py:120 - [Rank {r}] Memory-Usage after "
            f"clear_memory: {{'gpu': {r}, 'total_GB': 139.8, 'free_GB': 118.2, 'used_GB': 21.6}}"
        )
    for i in range(24):
        noise.append(
            f"{ACTOR}ip-10-0-0-2:5123:5190 [{i % 8}] NCCL INFO Channel {i:02d}/32 : {i % 8}[{i % 8}] -> "
            f"{(i + 1) % 8}[{(i + 1) % 8}] via P2P/CUMEM/read"
        )
    noise.append(
        f"{ACTOR}/usr/local/lib/python3.12/dist-packages/torch/utils/checkpoint.py:85: UserWarning: "
        f"None of the inputs have requires_grad=True. Gradients will be None [repeated 7x across cluster]"
    )
    noise.append(f"{ACTOR}{ts} actor_cell0_rank0] timer.py:31 - Timer train end (elapsed: 18.6s)")
    noise.append(f"ft op=train_step rollout={n} step=0 rank=0 elapsed=18.560 \ufffd\ufffd garbage")
    return "\n".join(metric[:2] + noise[:10] + metric[2:4] + noise[10:] + metric[4:]) + "\n"


def generate(path: Path, size_mb: int, dense: bool) -> int:
    target = size_mb * 1024 * 1024
    written = n = 0
    with open(path, "w", encoding="utf-8") as fh:
        while written < target:
            chunk = "".join(step_block(n + i, dense) for i in range(200))
            fh.write(chunk)
            written += len(chunk.encode())
            n += 200
    return n


BARE_RE = rb"(step|perf|rollout) (\d+): \{"


def bare_child(path: str) -> dict:
    """The bare loop: the file's lines, one compiled regex search each."""
    import re

    rx = re.compile(BARE_RE)
    c0 = time.process_time()
    t0 = time.perf_counter()
    hits = 0
    with open(path, "rb") as fh:
        for line in fh:
            if rx.search(line):
                hits += 1
    return _rates(path, t0, c0, hits)


def _rates(path: str, t0: float, c0: float, hits: int) -> dict:
    """Wall and CPU throughput of a child that started at perf_counter t0, process_time c0."""
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    size = os.path.getsize(path)
    return {
        "seconds": dt,
        "mb_per_s": size / 1e6 / dt,
        "mb_per_cpu_s": size / 1e6 / cpu,
        "hits": hits,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def floor_child(path: str) -> dict:
    """The least a reader that tells a line's kind must do, and nothing else: 4 MiB binary chunks
    split into lines, per line one `find(b": {")`, one `rfind` of the space before it, a slice of
    the kind and a comparison (no value read, no record). What it costs beside the bare loop says
    whether any per-line Python design can reach the bare loop's speed (docs/benchmarks.md)."""
    c0 = time.process_time()
    t0 = time.perf_counter()
    kinds = {b"step": 0, b"perf": 0}
    other = 0
    with open(path, "rb") as fh:
        carry = b""
        while True:
            data = fh.read(4 << 20)
            if not data:
                break
            buf = carry + data
            cut = buf.rfind(b"\n") + 1
            carry = buf[cut:]
            for line in buf[:cut].split(b"\n"):
                colon = line.find(b": {")
                if colon < 0:
                    continue
                space = line.rfind(b" ", 0, colon)
                kind = line[space - 4 : space]
                if kind in kinds:
                    kinds[kind] += 1
                else:
                    other += 1
    return _rates(path, t0, c0, sum(kinds.values()) + other)


def measure_child(path: str) -> dict:
    from launcher.judge.parse.miles import ParseStats, parse_lines

    try:
        from launcher.judge.parse.reader import iter_file_lines, parse_path
    except ImportError:  # a tree before judge/parse/reader.py (PYTHONPATH=<old tree>: a baseline)
        from launcher.judge.parse.miles import iter_file_lines, parse_path  # type: ignore

    stats = ParseStats()
    c0 = time.process_time()
    t0 = time.perf_counter()
    count = 0
    last = None
    records = (
        parse_lines(iter_file_lines(Path(path)), stats)
        if os.environ.get("BENCH_LINES")
        else parse_path(path, stats)
    )
    for rec in records:
        count += 1
        last = rec
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    size = os.path.getsize(path)
    return {
        "bytes": size,
        "seconds": dt,
        "mb_per_s": size / 1e6 / dt,
        "cpu_seconds": cpu,
        "mb_per_cpu_s": size / 1e6 / cpu,
        "records": count,
        "last_step": last.step if last else None,
        "lines": stats.lines,
        "unparseable": stats.unparseable,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--dense", action="store_true", help="every line a metric line (worst case)")
    ap.add_argument("--keep", type=Path, help="write the log here and keep it")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="parse the same log this many times (fresh process each)",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--bare-child", help=argparse.SUPPRESS)
    ap.add_argument("--floor-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure_child(args.child)))
        return
    if args.bare_child:
        print(json.dumps(bare_child(args.bare_child)))
        return
    if args.floor_child:
        print(json.dumps(floor_child(args.floor_child)))
        return
    tmpdir = None
    if args.keep:
        path = args.keep
    else:
        tmpdir = tempfile.TemporaryDirectory()
        path = Path(tmpdir.name) / "train.log"
    try:
        steps = generate(path, args.size_mb, args.dense)
        runs, bares, floors = [], [], []
        for _ in range(args.repeat):
            for flag, into in (
                ("--bare-child", bares),
                ("--floor-child", floors),
                ("--child", runs),
            ):
                out = subprocess.run(
                    [sys.executable, __file__, flag, str(path)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                into.append(json.loads(out.stdout))
        result = dict(runs[-1])
        result["runs_mb_per_s"] = [round(r["mb_per_s"], 1) for r in runs]
        result["runs_mb_per_cpu_s"] = [round(r["mb_per_cpu_s"], 1) for r in runs]
        result["runs_peak_rss_mb"] = [round(r["peak_rss_mb"], 1) for r in runs]
        result["bare_mb_per_s"] = [round(r["mb_per_s"], 1) for r in bares]
        result["bare_mb_per_cpu_s"] = [round(r["mb_per_cpu_s"], 1) for r in bares]
        ratios = [r["mb_per_s"] / b["mb_per_s"] for r, b in zip(runs, bares, strict=True)]
        result["ratio_each_round"] = [round(x, 2) for x in ratios]
        result["ratio_median"] = round(statistics.median(ratios), 2)
        result["floor_mb_per_s"] = [round(r["mb_per_s"], 1) for r in floors]
        result["floor_mb_per_cpu_s"] = [round(r["mb_per_cpu_s"], 1) for r in floors]
        floor_ratios = [f["mb_per_s"] / b["mb_per_s"] for f, b in zip(floors, bares, strict=True)]
        result["floor_ratio_each_round"] = [round(x, 2) for x in floor_ratios]
        result["floor_ratio_median"] = round(statistics.median(floor_ratios), 2)
        result.update(
            {
                "steps_generated": steps,
                "dense": args.dense,
                "python": platform.python_version(),
                "machine": f"{platform.machine()} {os.cpu_count()} cpus",
            }
        )
        print(json.dumps(result, indent=2))
    finally:
        if tmpdir:
            tmpdir.cleanup()


if __name__ == "__main__":
    main()
