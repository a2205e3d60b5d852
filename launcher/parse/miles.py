"""Streaming parser for miles' text log: one StepRecord per optimizer step.

Why a text parser: the recipe is run as published, and the published `run` block does not ask
miles for its JSONL debug events, so the text log (every process's stderr, gathered by Ray) is
the only record of the step times the verdict rests on (docs/miles-log.md, what is parsed).

What a real log contains, and how each is handled:

- Ray prefixes `(MegatronTrainRayActor pid=5123) ` or `(..., ip=10.0.0.2) ` and ANSI colour codes:
  ignored; the metric marker is searched anywhere in the line.
- `step N: {...}` printed twice with identical content: the first wins, the second is counted
  as a duplicate and never parsed again.
- Two different `perf N: {...}` lines: the train actor's (it has `perf/actor_train_time`) gives
  the step time; the RolloutManager's is recognised and counted.
- `rollout N: {...}`: recognised and counted.
- `nan`, `inf`, `-inf`, `np.float64(x)` values: read as floats. A NaN loss is data.
- `[repeated Nx across cluster]` suffixes: stripped and counted.
- Interleaved lines of several processes: records are assembled by step number and released
  once the log has moved a few steps past them, so memory stays bounded by that lag.
- Garbage lines, and metric lines whose payload does not parse: counted, never fatal. A last
  line cut mid-dict (a killed run) is counted as `truncated`, not as unparseable.

Speed: a cheap substring test (`": {"`) rejects almost every line before any regular
expression runs; flat numeric dicts (the common case) are read by one regular expression, and
only other payloads go through the `ast`-based literal reader.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = [
    "StepRecord",
    "ParseStats",
    "ParseResult",
    "MilesLogParser",
    "parse_lines",
    "parse_file",
    "parse_path",
    "parse_payload",
    "last_step",
]

# A metric line: `step 7: {`, `perf 7: {`, `rollout 7: {`, anywhere in the line, so any prefix
# (Ray, ANSI, the logging prefix, a fragment of another process's line) is allowed before it.
# Found with str.find from each `: {` backwards (cheaper than a regex search over the line).
_KINDS = ("step", "perf", "rollout")
# The logging prefix `[2026-10-21 10:00:00.123 actor_cell0_rank0]`.
_STAMP_RE = re.compile(
    r"\[(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))? ([^\]\s]+)\]"
)
# Ray prints the suffix in colour, with a one-time hint after it (DedupState.formatted):
# `<line>\x1b[32m [repeated 3x across cluster] (Ray deduplicates logs ...)\x1b[0m`.
_REPEATED_RE = re.compile(r"\s*(?:\x1b\[[0-9;?]*[A-Za-z])*\s*\[repeated (\d+)x across cluster\].*$")
_REPEATED_BYTES_RE = re.compile(rb"\[repeated (\d+)x across cluster\]")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

# Flat dict of string keys to numbers: the shape of every metric payload miles prints.
_NUM = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
_VAL = (
    rf"(?:np\.float(?:64|32|16)\(({_NUM})\)|np\.int(?:64|32)\(({_NUM})\)|({_NUM})"
    r"|(True|False|None))"
)
# A pair must end at `,` or `}`: a value such as `2.3.4` then matches nothing, the pair count
# falls short of the `': ` count, and the payload goes to the strict reader (which rejects it).
_PAIR_RE = re.compile(rf"'([^'\\]*)': {_VAL}(?=[,}}])")
_CONSTS = {"True": 1.0, "False": 0.0, "None": None}

# How many steps behind the newest one a step may still receive lines before it is released.
# miles prints a step's lines within one step of each other; 4 leaves room for interleaving.
_RELEASE_LAG = 4


@dataclass
class StepRecord:
    """One optimizer step as the log reports it. Missing values are None (never guessed)."""

    step: int
    loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    step_time: float | None = None  # perf/step_time (s): train_wait_time + train_time
    actor_train_time: float | None = None  # perf/actor_train_time (s)
    tokens: int | None = None  # global tokens in the step: actor_train_tok_per_s x actor_train_time
    tflops: float | None = None  # perf/actor_train_tflops as miles logged it
    timestamp: float | None = None  # epoch seconds (UTC) of the step line, else of the perf line
    logged_mfu: float | None = None  # perf/actor_train_mfu, miles' own figure (kept for comparison)
    logged_peak_tflops: float | None = None  # perf/mfu_peak_tflops

    def to_dict(self) -> dict:
        """JSON-ready: NaN and infinities become strings, since JSON has no spelling for them."""
        out = {}
        for key, value in asdict(self).items():
            if isinstance(value, float) and not math.isfinite(value):
                value = repr(value)  # 'nan', 'inf', '-inf'
            out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: dict) -> StepRecord:
        """Inverse of to_dict (reads steps.jsonl back)."""
        kwargs: dict[str, Any] = {}
        for name in cls.__dataclass_fields__:
            value = data.get(name)
            if isinstance(value, str):
                value = float(value)
            kwargs[name] = value
        return cls(**kwargs)


@dataclass
class ParseStats:
    """Counters that say how much of the log was understood. Reported beside every result."""

    lines: int = 0
    metric_lines: int = 0  # step / perf / rollout lines recognised and parsed
    step_lines: int = 0
    train_perf_lines: int = 0
    rollout_perf_lines: int = 0
    rollout_lines: int = 0
    duplicates: int = 0  # the doubled `step N:` line, or any line for a step already complete
    repeated: int = 0  # lines carrying `[repeated Nx across cluster]`
    repeated_collapsed: int = 0  # sum of N over those lines: lines Ray did not show
    unparseable: int = 0  # metric lines whose payload could not be read
    truncated: int = 0  # the last line, cut mid-dict
    late: int = 0  # lines for a step already released (arrived more than _RELEASE_LAG steps late)
    unparseable_examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ParseResult:
    records: list[StepRecord]
    stats: ParseStats


def _literal(node: ast.AST | None) -> Any:
    """ast.literal_eval, extended with nan / inf and numpy scalar wrappers such as np.float64(x)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name) and node.id in ("nan", "inf", "NaN", "Infinity"):
        return float(node.id.lower().replace("infinity", "inf"))
    if (
        isinstance(node, ast.Call)
        and len(node.args) == 1
        and not node.keywords
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("np", "numpy")
    ):
        return _literal(node.args[0])
    raise ValueError(f"not a literal: {ast.dump(node)[:80] if node is not None else node}")


def parse_payload(text: str) -> dict:
    """Read one metric dict as miles prints it (Python repr). Raises ValueError when it cannot."""
    text = text.strip()
    if text.startswith("{") and text.endswith("}"):
        pairs = _PAIR_RE.findall(text)
        if len(pairs) == text.count("': ") and "{" not in text[1:] and "[" not in text:
            out = {}
            for key, f64, i64, num, const in pairs:
                raw = f64 or i64 or num
                out[key] = float(raw) if raw else _CONSTS[const]
            return out
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as err:
        raise ValueError(f"syntax: {err.msg}") from None
    value = _literal(tree.body)
    if not isinstance(value, dict):
        raise ValueError("payload is not a dict")
    return value


def _marker(line: str) -> tuple[str, int, str] | None:
    """(kind, N, payload) of the first `<kind> N: {` in the line, or None."""
    i = line.find(": {")
    while i >= 0:
        j = line.rfind(" ", 0, i)
        num = line[j + 1 : i]
        if j > 0 and num.isdigit() and num.isascii():
            for kind in _KINDS:
                k = j - len(kind)
                if line.startswith(kind, k, j) and (
                    k == 0 or not (line[k - 1].isalnum() or line[k - 1] in "_/")
                ):
                    return kind, int(num), line[i + 2 :]
        i = line.find(": {", i + 3)
    return None


def last_step(data: bytes) -> int | None:
    """N of the last `step N: {` line in a chunk of the log (None when it has none).

    The runner's progress reads the log through this, so a step line is recognised in one place.
    """
    last = None
    for line in data.decode(errors="replace").splitlines():
        found = _marker(line)
        if found is not None and found[0] == "step":
            last = found[1]
    return last


def _timestamp(line: str) -> float | None:
    m = _STAMP_RE.search(line)
    if not m:
        return None
    y, mo, d, h, mi, s, frac = m.group(1, 2, 3, 4, 5, 6, 7)
    micro = int(frac.ljust(6, "0")) if frac else 0
    try:
        dt = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), micro, tzinfo=UTC)
    except ValueError:
        return None
    return dt.timestamp()


def _num(metrics: dict, key: str) -> float | None:
    value = metrics.get(key)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


class MilesLogParser:
    """Incremental parser: feed lines, collect released records, then finish().

    Records are released in step order once the log is `_RELEASE_LAG` steps past them, so the
    memory held is a handful of records however long the log is.
    """

    def __init__(self, stats: ParseStats | None = None) -> None:
        self.stats = stats if stats is not None else ParseStats()
        self._pending: dict[int, StepRecord] = {}
        self._have_step: set[int] = set()  # steps whose `step N:` line was read (pending only)
        self._have_perf: set[int] = set()
        self._released_upto = -1
        self._max_step = -1

    # -- the hot path ------------------------------------------------------------------------
    def feed(self, line: str, *, last: bool = False) -> list[StepRecord]:
        """Consume one line; return the records it released (usually none)."""
        self.stats.lines += 1
        if ": {" not in line:  # the cheap pre-filter: no metric dict on this line
            return []
        return self.candidate(line, last)

    def candidate(self, line: str, last: bool = False) -> list[StepRecord]:
        """A line that passed the pre-filter (it holds `: {`). Does not count it in `lines`."""
        stats = self.stats
        if "across cluster]" in line:  # counted by the line loops; here only stripped
            rep = _REPEATED_RE.search(line)
            if rep:
                line = line[: rep.start()]
        found = _marker(line)
        if found is None:
            return []  # some other dict (Memory-Usage, ...): not ours
        kind, step, payload = found
        if "\x1b" in payload:
            payload = _ANSI_RE.sub("", payload)
        if step <= self._released_upto:
            stats.late += 1
            return []
        if step in (
            self._have_step if kind == "step" else self._have_perf if kind == "perf" else ()
        ):
            if kind == "step" or "perf/actor_train_time" in payload or "perf/step_time" in payload:
                stats.duplicates += 1  # the doubled step line: same content, skip the parse
                return []
        # Lines whose content the record does not use are only checked to be whole.
        if kind == "rollout" or (
            kind == "perf"
            and "perf/actor_train_time" not in payload
            and "perf/step_time" not in payload
        ):
            if not payload.rstrip().endswith("}"):
                self._bad(line, last)
            elif kind == "rollout":
                stats.metric_lines += 1
                stats.rollout_lines += 1
            else:
                stats.metric_lines += 1
                stats.rollout_perf_lines += 1  # the RolloutManager's perf line
            return []
        try:
            metrics = parse_payload(payload)
        except (ValueError, TypeError, RecursionError, MemoryError):
            self._bad(line, last)
            return []
        stats.metric_lines += 1
        if kind == "perf":
            stats.train_perf_lines += 1
            rec = self._record(step)
            self._have_perf.add(step)
            self._apply_perf(rec, metrics)
            if rec.timestamp is None:
                rec.timestamp = _timestamp(line)
        else:
            stats.step_lines += 1
            rec = self._record(step)
            self._have_step.add(step)
            self._apply_step(rec, metrics)
            ts = _timestamp(line)
            if ts is not None:
                rec.timestamp = ts
        if step > self._max_step:
            self._max_step = step
            return self._release(self._max_step - _RELEASE_LAG)
        return []

    def _bad(self, line: str, last: bool) -> None:
        """A metric line that cannot be read: the cut last line of a killed run, or unparseable."""
        if last and not line.rstrip().endswith("}"):
            self.stats.truncated += 1
            return
        self.stats.unparseable += 1
        if len(self.stats.unparseable_examples) < 5:
            self.stats.unparseable_examples.append(line.rstrip("\r\n")[:200])

    # -- assembling records --------------------------------------------------------------------
    def _record(self, step: int) -> StepRecord:
        rec = self._pending.get(step)
        if rec is None:
            rec = self._pending[step] = StepRecord(step=step)
        return rec

    @staticmethod
    def _apply_step(rec: StepRecord, metrics: dict) -> None:
        rec.loss = _num(metrics, "train/loss")
        rec.grad_norm = _num(metrics, "train/grad_norm")
        lr = _num(metrics, "train/lr-pg_0")
        if lr is None:
            lr = next((_num(metrics, k) for k in metrics if str(k).startswith("train/lr")), None)
        rec.lr = lr

    @staticmethod
    def _apply_perf(rec: StepRecord, metrics: dict) -> None:
        rec.step_time = _num(metrics, "perf/step_time")
        rec.actor_train_time = _num(metrics, "perf/actor_train_time")
        rec.tflops = _num(metrics, "perf/actor_train_tflops")
        rec.logged_mfu = _num(metrics, "perf/actor_train_mfu")
        rec.logged_peak_tflops = _num(metrics, "perf/mfu_peak_tflops")
        tok_per_s = _num(metrics, "perf/actor_train_tok_per_s")
        if tok_per_s is not None and rec.actor_train_time is not None:
            tokens = tok_per_s * rec.actor_train_time
            rec.tokens = round(tokens) if math.isfinite(tokens) else None

    def _release(self, upto: int) -> list[StepRecord]:
        if upto <= self._released_upto or not self._pending:
            return []
        ready = sorted(s for s in self._pending if s <= upto)
        out = [self._pending.pop(s) for s in ready]
        for s in ready:
            self._have_step.discard(s)
            self._have_perf.discard(s)
        self._released_upto = upto
        return out

    def finish(self) -> list[StepRecord]:
        """Release everything still pending (end of log)."""
        out = [self._pending.pop(s) for s in sorted(self._pending)]
        self._have_step.clear()
        self._have_perf.clear()
        if out:
            self._released_upto = max(self._released_upto, out[-1].step)
        return out


def _count_repeated(stats: ParseStats, line: str) -> None:
    rep = _REPEATED_RE.search(line)
    if rep:
        stats.repeated += 1
        stats.repeated_collapsed += int(rep.group(1))


def parse_lines(lines: Iterable[str], stats: ParseStats | None = None) -> Iterator[StepRecord]:
    """Yield one StepRecord per step, in step order, from an iterable of log lines.

    Pass a ParseStats to read the counters afterwards. The last line is known to be last (one
    line of look-ahead), so a cut final line counts as truncated rather than unparseable.
    """
    parser = MilesLogParser(stats)
    candidate = parser.candidate
    count = 0
    it = iter(lines)
    first = next(it, None)
    if first is None:  # an empty log
        yield from parser.finish()
        return
    prev: str = first
    stats = parser.stats
    for line in it:  # the hot loop: two substring tests per line, the rest only on candidates
        count += 1
        if "cluster]" in prev:
            _count_repeated(stats, prev)
        if ": {" in prev:
            released = candidate(prev)
            if released:
                yield from released
        prev = line
    count += 1
    if "cluster]" in prev:
        _count_repeated(stats, prev)
    if ": {" in prev:
        yield from candidate(prev, last=True)
    parser.stats.lines += count
    yield from parser.finish()


_CHUNK = 4 << 20  # bytes read at a time by parse_path
_MAX_LINE = 64 << 20  # a "line" longer than this (binary garbage, no newline) is dropped, counted


def iter_file_lines(path: Path) -> Iterator[str]:
    """Lines of a log file as text; undecodable bytes become U+FFFD instead of an error."""
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:
        yield from fh


def parse_path(path: str | Path, stats: ParseStats | None = None) -> Iterator[StepRecord]:
    """parse_lines for a file, faster: read in 4 MiB binary chunks, find `: {` with bytes.find
    (C speed) and decode only the candidate lines. Same records and counters as
    parse_lines(iter_file_lines(path)) for `\n`-separated logs; memory is one chunk plus the
    pending records, whatever the file's size.
    """
    parser = MilesLogParser(stats)
    candidate = parser.candidate
    lines = 0
    carry = b""
    with open(path, "rb") as fh:
        while True:
            data = fh.read(_CHUNK)
            if not data:
                break
            buf = carry + data if carry else data
            # Hold back the last line (complete or not): only at EOF is it known to be the last.
            cut = buf.rfind(b"\n", 0, len(buf) - 1) + 1
            if cut == 0:
                carry = buf
                if len(carry) > _MAX_LINE:
                    lines += 1
                    parser.stats.unparseable += b": {" in carry
                    carry = b""
                continue
            carry = buf[cut:]  # `buf` itself is searched up to `cut`: no copy of the chunk
            lines += buf.count(b"\n", 0, cut)
            if buf.find(b"across cluster]", 0, cut) >= 0:
                for rep in _REPEATED_BYTES_RE.finditer(buf, 0, cut):
                    parser.stats.repeated += 1
                    parser.stats.repeated_collapsed += int(rep.group(1))
            find, rfind = buf.find, buf.rfind
            i = find(b": {", 0, cut)
            while i >= 0:
                if not 48 <= buf[i - 1] <= 57:  # no digit before `: {`: not `<kind> N: {`
                    i = find(b": {", i + 3, cut)
                    continue
                end = find(b"\n", i, cut)
                released = candidate(buf[rfind(b"\n", 0, i) + 1 : end].decode("utf-8", "replace"))
                if released:
                    yield from released
                i = find(b": {", end, cut)
    if carry:
        lines += 1
        if b"across cluster]" in carry:
            _count_repeated(parser.stats, carry.decode("utf-8", "replace"))
        if b": {" in carry:
            yield from candidate(carry.decode("utf-8", "replace"), last=True)
    parser.stats.lines += lines
    yield from parser.finish()


def parse_file(path: str | Path) -> ParseResult:
    """Parse a whole log file (streamed; only the per-step records are kept)."""
    stats = ParseStats()
    records = list(parse_path(Path(path), stats))
    return ParseResult(records=records, stats=stats)
