"""Streaming parser for miles' text log: one StepRecord per optimizer step.

Why a text parser: the recipe is run as published, and the published `run` block does not ask
miles for its JSONL debug events, so the text log (every process's stderr and stdout, gathered by
Ray) is the only record of the step times the verdict rests on (docs/miles-log.md).

Every peculiarity of real logs (Ray prefixes, the doubled step line, conflicts, the versions'
shapes, dicts with no marker or over several lines, `[repeated Nx across cluster]`, the
arguments listing, interleaved processes, garbage, a cut last line, failure lines) and how it is
read: docs/miles-log.md, "What the parser reads". The shapes themselves, version by version, are
one table: launcher/judge/parse/shapes.py. Two lines for one step that DIFFER are a conflict, never
resolved by picking one; what is only half understood is counted and shown (fail closed).

Two ways in, one result: `feed`/`candidate` read a decoded line (the straightforward reference,
`parse_lines`); `fast` reads a marker line's bytes for the file reader (launcher/judge/parse/
reader.py) when its shape is known (payload templates: launcher/judge/parse/templates.py) and
otherwise declines, changing nothing. tests/judge/test_parse_equivalence.py holds them equal.
Speed: cheap substring tests reject almost every line before any regular expression runs; flat
numeric dicts (the common case) are read by one regular expression, and only other payloads go
through the `ast`-based literal reader.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from itertools import chain, islice

from launcher.inputs.runargs import checked_dests
from launcher.judge.parse.clock import CLOCK, HostClock
from launcher.judge.parse.lines import (
    ARGS_BEGIN,
    ARGS_END,
    BARE,
    MAX_DIGITS,
    ROLE_STEP,
    Metrics,
    argument,
    bare,
    continues_dict,
    depth,
    last_step,
    marker,
    parse_payload,
    repeated,
    shown,
    stamp,
    stamp_bytes,
    strip_prefix,
    wanted,
)
from launcher.judge.parse.records import (
    ParseResult,
    ParseStats,
    SignalGroup,
    StepRecord,
    Value,
    same,
)
from launcher.judge.parse.shapes import (
    TRAIN_PERF_KEYS,
    apply_perf,
    apply_step,
    is_train_perf,
    kind_of,
    maybe_signal,
    signal,
    skipped_rollout,
)
from launcher.judge.parse.templates import Templates, perf_values

__all__ = [
    "StepRecord",
    "ParseStats",
    "ParseResult",
    "MilesLogParser",
    "parse_lines",
    "parse_payload",
    "last_step",
]

# How many steps behind the newest one a step may still receive lines before it is released.
# miles prints a step's lines within one step of each other; 4 leaves room for interleaving.
_RELEASE_LAG = 4
_MAX_DICT_LINES = 4096  # a dict printed over more lines than this is not a metric dict
_MAX_ARG_LINES = 20000  # an arguments listing longer than this has lost its end line
_KEEP_DONE = 4096  # released steps whose values a late line is checked against
FIRST_LINES = 5  # kept to show what the log looked like when nothing in it was recognised
_EXAMPLES = 5
# Failure groups kept (one per step a failure line follows): a log failing after more steps than
# this is judged on the first ones and the last, which always stays.
MAX_SIGNAL_GROUPS = 1000

# What two lines for one step are compared on: indexes into MilesLogParser._values.
_VALUE_NAMES = ("step", "loss", "grad_norm", "lr", "step_time", "actor_train_time", "tokens")
# The values two lines for one step must agree on, in the order of _VALUE_NAMES.
_Figure = float | None
Compared = tuple[int, _Figure, _Figure, _Figure, _Figure, _Figure, int | None]
_COMPARED = {"step": (1, 2, 3), "perf": (4, 5, 6)}
_STEP_FIELDS = {"perf": ("rollout/step", "perf/step", "step"), "step": ("train/step", "step")}
# The fast path (MilesLogParser.fast): bytes before a kind that make it part of a word (str.isalnum
# on ASCII, `_`, `/`, `-`), the train perf keys as one search, and the empty release.
_NOT_BOUNDARY = [chr(c).isalnum() or chr(c) in "_/-" for c in range(128)]
_TRAIN_RE = re.compile(b"|".join(re.escape(k.encode()) for k in TRAIN_PERF_KEYS))
_NOTHING: list[StepRecord] = []


class MilesLogParser:
    """Incremental parser: feed lines, collect released records, then finish().

    Records are released in step order once the log is `_RELEASE_LAG` steps past them, so the
    memory held is a handful of records however long the log is.
    """

    def __init__(self, stats: ParseStats | None = None, nonce: str | None = None) -> None:
        self.stats = stats if stats is not None else ParseStats()
        self.clock = HostClock(nonce)  # its lines count only with the run's nonce
        self.busy = False  # inside a dict printed over several lines, or an arguments listing
        self._pending: dict[int, StepRecord] = {}
        self._texts: dict[int, str] = {}  # step << 1 | (a perf line) -> payload read (pending)
        # Values of the last _KEEP_DONE released steps, for a late line to be checked against.
        self._done: dict[int, Compared] = {}
        self._released_upto = -1
        self._max_step = -1
        self._ordinal = {"step": 0, "perf": 0}  # unmarked dicts without a step field
        self._last_unmarked: dict[str, str] = {}
        self._open: list[str] = []
        self._open_head: tuple[str | None, int | None, str] = (None, None, "")
        self._open_depth = 0
        self._args: dict[str, str] | None = None
        self._args_lines = 0
        self._layouts = (Templates(), Templates())  # step, perf payloads seen (the fast path)

    # -- the hot path ------------------------------------------------------------------------
    def feed(self, line: str, *, last: bool = False) -> list[StepRecord]:
        """Consume one line; return the records it released (usually none)."""
        self.stats.lines += 1
        if self.busy:
            return self.continuation(line, last)
        if ": {" not in line and BARE not in line and ARGS_BEGIN not in line:
            self.other(line)
            return []  # the cheap pre-filter: no metric dict, no arguments listing
        return self.candidate(line, last)

    def other(self, line: str) -> None:  # no metric line: the host's clock, or a failure line
        if line.startswith(CLOCK):
            self.clock.line(line)
        elif maybe_signal(line):
            self.failure(line)

    def failure(self, line: str) -> None:
        """A line that may say training failed (shapes.SIGNALS): kept with the step before it."""
        kind = signal(line)
        if kind is None:
            return
        stats = self.stats
        stats.signal_lines += 1
        if kind == "skipped optimizer step":
            stats.skipped_optimizer_steps += 1
            rollout = skipped_rollout(line)
            if rollout is not None and len(stats.skipped_rollouts) < _KEEP_DONE:
                stats.skipped_rollouts.append(rollout)
        if len(stats.signals) < 2 * _EXAMPLES:
            stats.signals.append({"kind": kind, "after_step": self._max_step, "line": shown(line)})
        if kind != "skipped optimizer step":
            self._group(kind, line)

    def _group(self, kind: str, line: str) -> None:
        """Keep the failure line with the others printed after the same step (the step only
        grows, so a group is the last one or a new one): the first line of the most specific kind
        names the group. Past MAX_SIGNAL_GROUPS the last group is overwritten, never dropped."""
        groups = self.stats.signal_groups
        if groups and groups[-1]["after_step"] == self._max_step:
            group = groups[-1]
            group["lines"] += 1
            if group["kind"] == "exception" and kind != "exception":
                group["kind"], group["line"] = kind, shown(line)
            return
        new: SignalGroup = {
            "after_step": self._max_step,
            "kind": kind,
            "line": shown(line),
            "lines": 1,
        }
        if len(groups) >= MAX_SIGNAL_GROUPS:
            groups[-1] = new
        else:
            groups.append(new)

    def candidate(self, line: str, last: bool = False) -> list[StepRecord]:
        """A line that passed the pre-filter. Does not count it in `lines`."""
        if "across cluster]" in line:  # counted by the line loops; here only stripped
            rep = repeated(line)
            if rep:
                line = line[: rep[0]]
        found = marker(line)
        if found is not None:
            kind: str | None
            kind, step, payload = found
        else:
            if ARGS_BEGIN in line:
                self._args, self._args_lines, self.busy = {}, 0, True
                self.stats.argument_blocks += 1
                return []
            payload_or_none = bare(line)
            if payload_or_none is None:
                self.failure(line)
                return []
            kind, step, payload = None, None, payload_or_none
        if "\x1b" in payload:
            payload = strip_prefix(payload)
        if not payload.rstrip().endswith("}"):
            level = depth(payload)
            if level > 0 and not last:
                self._open, self._open_head, self._open_depth = [payload], (kind, step, line), level
                self.busy = True
                return []
        return self._metric(kind, step, payload, line, last)

    def fast(self, line: bytes) -> list[StepRecord] | None:
        """The file reader's hot path: what candidate() does with a marker line, for the lines
        whose shape it knows (ASCII, `<kind> N: {...}` as the first `: {`, a payload that a
        template reads: launcher/judge/parse/templates.py), read from the bytes. None: not such a
        line, or one the slow path must judge (a late or second line for a step, a step time that
        disagrees with its parts); nothing has changed then, and the caller reads it through
        candidate(). tests/judge/test_parse_equivalence.py holds the two paths equal.
        """
        colon = line.find(b": {")
        space = line.rfind(b" ", 0, colon)
        if space <= 0 or not line.isascii() or not line.endswith(b"}") or b"cluster]" in line:
            return None
        num = line[space + 1 : colon]
        if len(num) > MAX_DIGITS or not num.isdigit():  # as marker(): not a step number
            return None
        if line.startswith(b"step", space - 4, space):
            kind, begin = "step", space - 4
        elif line.startswith(b"perf", space - 4, space):
            kind, begin = "perf", space - 4
        elif line.startswith(b"rollout", space - 7, space):
            kind, begin = "rollout", space - 7
        else:
            return None
        if begin and _NOT_BOUNDARY[line[begin - 1]]:
            return None  # a word ending in the kind (or `critic-step`): the slow path judges
        payload = line[colon + 2 :]
        if b"\x1b" in payload:
            return None
        stats = self.stats
        if kind == "rollout" or (kind == "perf" and _TRAIN_RE.search(payload) is None):
            stats.metric_lines += 1
            if kind == "rollout":
                stats.rollout_lines += 1
            else:
                stats.rollout_perf_lines += 1
            return _NOTHING
        step = int(num)
        perf = kind == "perf"
        key = step << 1 | perf
        text = payload.decode("ascii")
        texts = self._texts
        if texts.get(key) == text:
            stats.duplicates += 1
            return _NOTHING
        if step <= self._released_upto or key in texts:
            return None
        found = self._layouts[perf].match(payload)
        if found is None:
            return None
        tmpl, m = found
        values = None
        if perf:
            values = perf_values(tmpl, m)
            if values is None:
                return None
        rec = self._pending.get(step)
        if rec is None:
            rec = self._pending[step] = StepRecord(step=step)
        stats.metric_lines += 1
        texts[key] = text
        if values is not None:
            stats.train_perf_lines += 1
            (rec.step_time, rec.actor_train_time, rec.tflops, rec.logged_mfu) = values[:4]
            rec.logged_peak_tflops = values[4]
            tokens = values[5]
            if tokens is not False:
                rec.tokens = tokens
        else:
            stats.step_lines += 1
            rec.loss = float(m.group(tmpl.loss)) if tmpl.loss else None
            rec.grad_norm = float(m.group(tmpl.grad_norm)) if tmpl.grad_norm else None
            rec.lr = float(m.group(tmpl.lr)) if tmpl.lr else None
        rec.arrived = self.clock.t if not perf or rec.arrived is None else rec.arrived
        if not perf or rec.timestamp is None:
            found_stamp = stamp_bytes(line)
            if found_stamp is not None:
                rec.timestamp = found_stamp[0]
                if not found_stamp[1]:
                    stats.coarse_stamps += 1
        if step > self._max_step:
            self._max_step = step
            return self._release(step - _RELEASE_LAG)
        return _NOTHING

    def continuation(self, line: str, last: bool = False) -> list[StepRecord]:
        """A line read while a dict or an arguments listing is open."""
        if self._args is not None:
            return self._argument_line(line, last)
        text = strip_prefix(line)
        if not continues_dict(text) or len(self._open) >= _MAX_DICT_LINES:
            self._abandon()  # the dict never closed; this line is read afresh
            if ": {" in line or BARE in line or ARGS_BEGIN in line:
                return self.candidate(line, last)
            self.other(line)
            return []
        self._open.append(text)
        self._open_depth += depth(text)
        if self._open_depth <= 0:
            kind, step, head = self._open_head
            payload = "\n".join(self._open)
            self._open, self.busy = [], False
            self.stats.multiline += 1
            return self._metric(kind, step, payload, head, last)
        if last:  # the log ends inside the dict: the run was killed mid-print
            self.stats.truncated += 1
            self._open, self.busy = [], False
        return []

    def _abandon(self) -> None:
        head = self._open_head[2]
        self._open, self.busy = [], False
        self._bad(head, last=False)

    def _argument_line(self, line: str, last: bool) -> list[StepRecord]:
        if ARGS_END in line or self._args_lines >= _MAX_ARG_LINES:
            self._close_args()
            return []
        self._args_lines += 1
        found = argument(line)
        if found is not None and self._args is not None:
            self._args[found[0]] = found[1]
        elif ": {" in line or BARE in line:  # another process's metric line, interleaved
            return self.candidate(line, last)
        return []

    def _close_args(self) -> None:
        block, self._args, self.busy = self._args or {}, None, False
        known = self.stats.arguments
        if not known:
            known.update(block)
            return
        for name in checked_dests():
            if name in block and name in known and block[name] != known[name]:
                self._conflict(-1, f"printed argument {name}", known[name], block[name])

    # -- one metric dict -------------------------------------------------------------------------
    def _metric(
        self, kind: str | None, step: int | None, payload: str, line: str, last: bool
    ) -> list[StepRecord]:
        stats = self.stats
        if kind is None or step is None:
            try:
                metrics = parse_payload(payload)
            except (ValueError, TypeError, RecursionError, MemoryError):
                if "perf/" in payload or "train/" in payload:
                    self._bad(line, last)
                return []
            kind = kind_of(metrics)
            if kind is None:
                return []  # some other dict (Memory-Usage, ...): not ours
            stats.unmarked += 1
            if kind == "rollout-perf":
                stats.metric_lines += 1
                stats.rollout_perf_lines += 1
                return []
            step = self._unmarked_step(kind, metrics, payload.strip())
            if step is None:
                stats.duplicates += 1
                return []
            return self._apply(kind, step, metrics, payload.strip(), line)
        if kind == ROLE_STEP:  # a critic's step: checked whole, counted, not the actor's
            if not payload.rstrip().endswith("}"):
                self._bad(line, last)
                return []
            stats.metric_lines += 1
            stats.role_step_lines += 1
            return []
        # The RolloutManager's: its perf line, and `rollout N:` whatever its keys (never a step's).
        if kind == "rollout" or not (kind == "step" or is_train_perf(payload)):
            if not payload.rstrip().endswith("}"):
                self._bad(line, last)
                return []
            stats.metric_lines += 1
            if kind == "rollout":
                stats.rollout_lines += 1
            else:
                stats.rollout_perf_lines += 1
            return []
        text = payload.strip()
        if self._texts.get(step << 1 | (kind == "perf")) == text:
            stats.duplicates += 1  # the doubled step line: same content, no parse
            return []
        try:
            metrics = parse_payload(payload)
        except (ValueError, TypeError, RecursionError, MemoryError):
            self._bad(line, last)
            return []
        return self._apply(kind, step, metrics, text, line)

    def _unmarked_step(self, kind: str, metrics: Metrics, text: str) -> int | None:
        """The step of a dict logged without a marker: its step field, else its place in the
        order of such dicts. None for a repeat of the previous one (the doubled line)."""
        for key in _STEP_FIELDS[kind]:
            value = metrics.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if math.isfinite(value) and value >= 0 and value == int(value):
                    return int(value)
        if self._last_unmarked.get(kind) == text:
            return None
        self._last_unmarked[kind] = text
        step = self._ordinal[kind]
        self._ordinal[kind] += 1
        return step

    def _apply(
        self, kind: str, step: int, metrics: Metrics, text: str, line: str
    ) -> list[StepRecord]:
        stats = self.stats
        perf = kind == "perf"
        apply = self._apply_perf if perf else apply_step
        key = step << 1 | perf
        if step <= self._released_upto or key in self._texts:
            probe = StepRecord(step=step)
            (apply_perf if perf else apply_step)(probe, metrics)
            if step > self._released_upto:  # a second, different line for this step
                self._compare(self._values(self._pending[step]), probe, kind)
                return []
            stats.late += 1
            done = self._done.get(step)
            if done is None:
                stats.late_unchecked += 1
            else:
                self._compare(done, probe, kind)
            return []
        stats.metric_lines += 1
        if perf:
            stats.train_perf_lines += 1
        else:
            stats.step_lines += 1
        self._texts[key] = text
        rec = self._record(step)
        apply(rec, metrics)
        rec.arrived = self.clock.t if not perf or rec.arrived is None else rec.arrived  # as below
        if not perf or rec.timestamp is None:  # the step line's stamp, else the perf line's
            found = stamp(line)
            if found is not None:
                rec.timestamp = found[0]
                if not found[1]:
                    stats.coarse_stamps += 1
        if step > self._max_step:
            self._max_step = step
            return self._release(self._max_step - _RELEASE_LAG)
        return []

    @staticmethod
    def _values(rec: StepRecord) -> Compared:
        """The values two lines for one step must agree on (the order of _COMPARED)."""
        return (
            rec.step,
            rec.loss,
            rec.grad_norm,
            rec.lr,
            rec.step_time,
            rec.actor_train_time,
            rec.tokens,
        )

    def _compare(self, have: Compared, new: StepRecord, kind: str) -> None:
        """Two lines for one step: the same values are a duplicate, others a conflict."""
        theirs = self._values(new)
        differ = [i for i in _COMPARED[kind] if not same(have[i], theirs[i])]
        if not differ:
            self.stats.duplicates += 1
            return
        for i in differ:
            self._conflict(new.step, _VALUE_NAMES[i], have[i], theirs[i])

    def _conflict(self, step: int, metric: str, first: Value, second: Value) -> None:
        self.stats.conflicts += 1
        if len(self.stats.conflict_examples) < _EXAMPLES:
            self.stats.conflict_examples.append(
                {"step": step, "metric": metric, "first": first, "second": second}
            )

    def _bad(self, line: str, last: bool) -> None:
        """A metric line that cannot be read: the cut last line of a killed run, or unparseable."""
        if last and not line.rstrip().endswith("}"):
            self.stats.truncated += 1
            return
        self.stats.unparseable += 1
        if len(self.stats.unparseable_examples) < _EXAMPLES:
            self.stats.unparseable_examples.append(line.rstrip("\r\n")[:200])

    # -- assembling records --------------------------------------------------------------------
    def _record(self, step: int) -> StepRecord:
        rec = self._pending.get(step)
        if rec is None:
            rec = self._pending[step] = StepRecord(step=step)
        return rec

    def _apply_perf(self, rec: StepRecord, metrics: Metrics) -> None:
        """The train perf dict into `rec`, fail closed: a dict with no step time this parser
        knows, or one whose step time is not its parts' sum, is counted and shown."""
        problem = apply_perf(rec, metrics)
        stats = self.stats
        if problem is None and rec.step_time is None:
            keys = ", ".join(sorted(str(k) for k in metrics))[:160]
            problem = f"step {rec.step}: a train perf dict with no step time known here ({keys})"
            stats.no_step_time += 1
        elif problem is not None:
            problem = f"step {rec.step}: {problem}"
            stats.inconsistent += 1
        if problem is not None and len(stats.half_read_examples) < _EXAMPLES:
            stats.half_read_examples.append(problem)

    def _release(self, upto: int) -> list[StepRecord]:
        if upto <= self._released_upto or not self._pending:
            return []
        ready = sorted(s for s in self._pending if s <= upto)
        out = [self._pending.pop(s) for s in ready]
        for rec in out:
            self._keep(rec)
            self._texts.pop(rec.step << 1, None)
            self._texts.pop(rec.step << 1 | 1, None)
        self._released_upto = upto
        return out

    def _keep(self, rec: StepRecord) -> None:
        self._done[rec.step] = self._values(rec)
        self._done.pop(rec.step - _KEEP_DONE, None)  # released in step order: the oldest goes

    def finish(self) -> list[StepRecord]:
        """Release everything still pending (end of log)."""
        if self._open:  # the log ended inside a dict
            self.stats.truncated += 1
            self._open, self.busy = [], False
        if self._args is not None:
            self._close_args()
        out = [self._pending.pop(s) for s in sorted(self._pending)]
        for rec in out:
            self._keep(rec)
        self._texts.clear()
        self.stats.clock_lines, self.stats.clock_refused = self.clock.lines, self.clock.refused
        if out:
            self._released_upto = max(self._released_upto, out[-1].step)
        return out


def count_repeated(stats: ParseStats, line: str) -> None:
    rep = repeated(line)
    if rep:
        stats.repeated += 1
        stats.repeated_collapsed += rep[1]


def note_first(stats: ParseStats, lines: Iterable[str]) -> None:
    for line in lines:
        text = shown(line)
        if text.strip():
            stats.first_lines.append(text)


def parse_lines(
    lines: Iterable[str], stats: ParseStats | None = None, nonce: str | None = None
) -> Iterator[StepRecord]:
    """Yield one StepRecord per step, in step order, from an iterable of log lines.

    Pass a ParseStats to read the counters afterwards; `nonce`: the run's (its host's clock). The
    last line is known to be last (one line of look-ahead), so a cut final line is truncated.
    """
    parser = MilesLogParser(stats, nonce)
    stats = parser.stats
    candidate, continuation, other = parser.candidate, parser.continuation, parser.other
    it = iter(lines)
    head = list(islice(it, FIRST_LINES))
    note_first(stats, head)
    it = chain(head, it)
    count = 0
    first = next(it, None)
    if first is None:  # an empty log
        yield from parser.finish()
        return
    prev: str = first
    unmarked, listing = BARE, ARGS_BEGIN
    for line in it:  # the hot loop: three substring tests per line, the rest only on candidates
        count += 1
        if "cluster]" in prev:
            count_repeated(stats, prev)
        if parser.busy:
            released = continuation(prev)
        elif ": {" in prev or unmarked in prev or listing in prev:
            released = candidate(prev)
        else:
            other(prev)  # the host's clock, or a failure line
            prev = line
            continue
        if released:
            yield from released
        prev = line
    count += 1
    if "cluster]" in prev:
        count_repeated(stats, prev)
    if parser.busy:
        yield from continuation(prev, last=True)
    elif wanted(prev):
        yield from candidate(prev, last=True)
    else:
        other(prev)
    stats.lines += count
    yield from parser.finish()
