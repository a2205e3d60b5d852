"""The shapes of miles' and slime's metric lines, version by version, as one table, and the lines
that say training failed.

Why a table: which key holds the step time, whether a line has a logging prefix, whether a
critic's steps are printed beside the actor's, all changed between releases (docs/miles-log.md,
"Which version prints what", gives the commit each fact was read from). The parser reads every
shape through this module, so a shape is added here, with its fixture under tests/data/logs/,
and nowhere else.

Why the step time is defined by its parts: every version computes it as train wait + train
(`perf/train_wait_time + perf/train_time`: slime's `log_perf_data`, miles'
`log_perf_data_raw`); only its name changed (`perf/total_train_time`, then `perf/step_time`).
So a train perf dict whose step-time key is unknown is still read when it carries both parts,
and one whose named step time disagrees with its parts is not trusted (fail closed: docs/
measurement.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from launcher.judge.parse.frame import payload
from launcher.judge.parse.lines import (
    Metrics,
    as_float,
    marker,
    number,
    parse_payload,
    small_int,
)
from launcher.judge.parse.records import StepRecord


@dataclass(frozen=True)
class Shape:
    """One shape of the train actor's lines, and where it was read from."""

    name: str
    versions: str  # the releases / commit range that print it
    source: str  # the file and commit the shape was read from
    prefix: str  # none (print) | logging, seconds | logging, milliseconds and process
    step_time_key: str  # the name of train wait + train in the perf dict
    has_tokens: bool  # perf/actor_train_tok_per_s is printed
    has_mfu: bool  # perf/actor_train_mfu and perf/mfu_peak_tflops are printed


SHAPES: tuple[Shape, ...] = (
    Shape(
        "slime-v0.1.0",
        "slime v0.1.0 (261ecee7) and slime/miles before the rename (slime 2e27587b, "
        "miles 26695d7b, 2025-10-29/30); tokens/s from slime 3f87d04a / miles bd55c838",
        "slime v0.1.0: slime/backends/megatron_utils/data.py:377 (log_perf_data), model.py:476",
        "none (print)",
        "perf/total_train_time",
        False,
        False,
    ),
    Shape(
        "step-time-print",
        "slime 2e27587b..a68f81b2~1, miles 26695d7b..73daa824~1 (2025-10-29 to 2025-11-17)",
        "miles 926178f7: miles/utils/train_metric_utils.py (print)",
        "none (print)",
        "perf/step_time",
        True,
        False,
    ),
    Shape(
        "step-time-logging",
        "slime a68f81b2 on: v0.2.0 .. v0.3.1 and HEAD 624b824a; miles 73daa824..7f7830e1~1",
        "slime v0.3.1: slime/utils/train_metric_utils.py:47, utils/logging_utils.py:16",
        "logging, seconds: [YYYY-MM-DD HH:MM:SS] file.py:N - ",
        "perf/step_time",
        True,
        False,
    ),
    Shape(
        "miles-v0.1.0",
        "miles 7f7830e1 on, v0.1.0 (78527b91, the seed's pin) and HEAD 31f1ca96; MFU keys from "
        "d0e8e7c6",
        "miles v0.1.0: miles/utils/train_metric_utils.py:53, utils/logging_utils.py:35",
        "logging, milliseconds and process: [YYYY-MM-DD HH:MM:SS.mmm PROC] file.py:N - ",
        "perf/step_time",
        True,
        True,
    ),
)
STEP_TIME_KEYS: tuple[str, ...] = tuple(dict.fromkeys(s.step_time_key for s in SHAPES))
WAIT_KEY, TRAIN_KEY = "perf/train_wait_time", "perf/train_time"
# The keys that make a perf dict the train actor's (the RolloutManager's has none of them).
TRAIN_PERF_KEYS: tuple[str, ...] = ("perf/actor_train_time", *STEP_TIME_KEYS, WAIT_KEY, TRAIN_KEY)
# A named step time and its parts are the same float sum; more than this apart, they are two
# different figures and neither is trusted.
PARTS_TOLERANCE = 1e-6

# Lines that say training failed, and what each is. Searched as plain substrings (bytes.find in
# the file reader, one pass per needle over a chunk): Python's traceback header, PyTorch's OOM
# message (`torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...`), CUDA's errors,
# miles' logfmt record of an optimizer step it skipped
# (miles/backends/megatron_utils/model.py:636 at v0.1.0: `ft op=train_step rollout=R step=S
# attempt=A outcome=NAME valid_step=false`), and the deaths that print no Python traceback:
# PyTorch's NCCL watchdog (ProcessGroupNCCL.cpp: `[Rank 0] Watchdog caught collective operation
# timeout: WorkNCCL(...) ran for 600000 milliseconds before timing out.`), the C++ runtime's abort
# (`terminate called after throwing an instance of 'c10::DistBackendError'`), CPython's
# (`Fatal Python error: Aborted`), and the shell's word for a child it lost (`train.sh: line 7:
# 4242 Killed  python3 train.py ...`, `Segmentation fault (core dumped)`). A needle with a
# pattern counts only where the pattern matches too (`Killed` alone is a common word).
SIGNALS: tuple[tuple[str, str], ...] = (
    ("Traceback (most recent call last)", "exception"),
    ("out of memory", "out of memory"),
    ("CUDA error", "CUDA error"),
    ("valid_step=false", "skipped optimizer step"),
    ("Watchdog caught collective operation timeout", "NCCL timeout"),
    ("terminate called after throwing", "fatal error"),
    ("Fatal Python error", "fatal error"),
    ("(core dumped)", "fatal error"),
    ("Killed", "killed"),
)
SIGNAL_BYTES: tuple[bytes, ...] = tuple(s.encode() for s, _ in SIGNALS)
# The shell's job report (`<where>: line N: PID Killed <command>`, or `PID Killed` alone), and
# `Killed` as a whole line (what bash prints for a foreground child the kernel's OOM killer ended).
_CONFIRM = {"Killed": re.compile(r"(?:\b\d+\s+Killed\b|^\s*Killed\s*$)")}


def maybe_signal(line: str) -> bool:
    """A cheap test (a few substrings) that a line may be a failure line; `signal` decides."""
    return (
        "rror" in line
        or "Traceback (" in line
        or "valid_step=false" in line
        or "out of memory" in line
        or "Watchdog caught" in line
        or "terminate called" in line
        or "core dumped" in line
        or "Killed" in line
    )


def signal(line: str) -> str | None:
    """What failure a line reports (the most specific kind), or None."""
    found = None
    for needle, kind in SIGNALS:
        if needle in line:
            confirm = _CONFIRM.get(needle)
            if confirm is not None and confirm.search(payload(line)) is None:
                continue
            if kind != "exception":
                return kind
            found = kind
    return found


def skipped_rollout(line: str) -> int | None:
    """The rollout of miles' `ft op=train_step rollout=R ... valid_step=false` line, or None."""
    if "op=train_step" not in line:
        return None
    for word in line.split():
        if word.startswith("rollout="):
            number = small_int(word[8:])  # `rollout=²` or 5,000 digits: no rollout, no ValueError
            if number is not None:
                return number
    return None


class SignalScan:
    """The next failure line's position in a chunk of the file reader, one cached position per
    needle, so that each needle is searched through a chunk once (linear, whatever the hits)."""

    def __init__(self, buf: bytes, cut: int) -> None:
        self.buf, self.cut = buf, cut
        self.next_at = [-1] * len(SIGNAL_BYTES)

    def after(self, pos: int) -> int:
        best = self.cut
        for i, at in enumerate(self.next_at):
            if at < pos:
                found = self.buf.find(SIGNAL_BYTES[i], pos, self.cut)
                at = self.next_at[i] = found if found >= 0 else self.cut
            best = min(best, at)
        return best


def kind_of(metrics: Metrics) -> str | None:
    """The kind of a dict logged without a marker: `perf` (the train actor's), `step` (it has a
    loss), `rollout-perf` (another process's perf or rollout dict), or None (not ours)."""
    if any(k in metrics for k in TRAIN_PERF_KEYS):
        return "perf"
    if "train/loss" in metrics:
        return "step"
    if any(str(k).startswith(("perf/", "rollout/")) for k in metrics):
        return "rollout-perf"
    return None


def is_train_perf(payload: str) -> bool:
    """Whether a `perf N:` payload is the train actor's (has one of TRAIN_PERF_KEYS)."""
    return any(key in payload for key in TRAIN_PERF_KEYS)


def step_time_of(metrics: Metrics) -> tuple[float | None, str | None]:
    """(step time, problem): a named step time (STEP_TIME_KEYS) checked against train wait +
    train when both are printed; else the parts' sum (a renamed key, recognised by its parts).
    The problem is a sentence when the dict says two different things, and the time is then None.
    """
    named_key = next((k for k in STEP_TIME_KEYS if k in metrics), None)
    named = as_float(metrics.get(named_key)) if named_key else None
    wait, train = number(metrics, WAIT_KEY), number(metrics, TRAIN_KEY)
    parts = wait + train if wait is not None and train is not None else None
    if named is not None and parts is not None and math.isfinite(named) and math.isfinite(parts):
        if abs(named - parts) > PARTS_TOLERANCE * max(1.0, abs(parts)):
            return None, (
                f"{named_key} {named!r} is not {WAIT_KEY} {wait!r} + {TRAIN_KEY} {train!r} "
                f"(= {parts!r}), as every version computes it"
            )
    if named is not None:
        return named, None
    return parts, None


def apply_step(rec: StepRecord, metrics: Metrics) -> None:
    """The actor's `step N:` dict into a StepRecord (keys without a role tag: the actor's)."""
    rec.loss = as_float(metrics.get("train/loss"))
    rec.grad_norm = as_float(metrics.get("train/grad_norm"))
    lr = as_float(metrics.get("train/lr-pg_0"))
    if lr is None:
        named = (k for k in metrics if isinstance(k, str) and k.startswith("train/lr"))
        lr = next((number(metrics, k) for k in named), None)
    rec.lr = lr


def apply_perf(rec: StepRecord, metrics: Metrics) -> str | None:
    """The train actor's `perf N:` dict into a StepRecord; returns step_time_of's problem."""
    rec.step_time, problem = step_time_of(metrics)
    rec.actor_train_time = as_float(metrics.get("perf/actor_train_time"))
    rec.tflops = as_float(metrics.get("perf/actor_train_tflops"))
    rec.logged_mfu = as_float(metrics.get("perf/actor_train_mfu"))
    rec.logged_peak_tflops = as_float(metrics.get("perf/mfu_peak_tflops"))
    tok_per_s = as_float(metrics.get("perf/actor_train_tok_per_s"))
    if tok_per_s is not None and rec.actor_train_time is not None:
        tokens = tok_per_s * rec.actor_train_time
        rec.tokens = round(tokens) if math.isfinite(tokens) else None
    return problem


def last_step_time(data: bytes) -> tuple[int, float] | None:
    """(N, seconds) of the last train `perf N: {...}` line in a chunk with a step time, or None.

    The runner's live speed (tokens/s while training) reads the log through this, so the step
    time is read by the same rule as the verdict's.
    """
    if b"perf " not in data:
        return None
    last = None
    for line in data.decode(errors="replace").splitlines():
        found = marker(line)
        if found is None or found[0] != "perf":
            continue
        try:
            metrics = parse_payload(found[2])
        except (ValueError, RecursionError):
            continue
        seconds, problem = step_time_of(metrics)
        if problem is None and seconds is not None and seconds > 0 and math.isfinite(seconds):
            last = (found[1], seconds)
    return last
