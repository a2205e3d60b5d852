"""The records the miles log parser produces, and its counters (launcher/judge/parse/miles.py).

A module of their own so that measurement, convergence and the run directory's steps.jsonl can
use them without the parser's machinery.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

# A value two lines for one step may give: a metric (a number, or None) or a printed argument.
Value = float | int | str | None


class Signal(TypedDict):
    """A failure line as read (shapes.SIGNALS): its kind, the last step logged before it (-1:
    none) and the line as shown."""

    kind: str
    after_step: int
    line: str


class SignalGroup(TypedDict):
    """The failure lines that follow one step: the most specific one's kind and line, and how
    many lines there were."""

    after_step: int
    kind: str
    line: str
    lines: int


class Conflict(TypedDict):
    """Two lines for one step (step -1: two `arguments` listings) that disagree on a metric."""

    step: int
    metric: str
    first: Value
    second: Value


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
    # The host's clock (launcher/judge/parse/clock.py): the time of the last trusted clock line
    # before the step line (else the perf line); the line began to arrive within CLOCK_GAP_S of it
    arrived: float | None = None

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: NaN and infinities become strings, since JSON has no spelling for them."""
        out: dict[str, object] = {}
        for key, value in asdict(self).items():
            if isinstance(value, float) and not math.isfinite(value):
                value = repr(value)  # 'nan', 'inf', '-inf'
            out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> StepRecord:
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
    metric_lines: int = 0  # step / perf / rollout dicts recognised and parsed
    step_lines: int = 0
    train_perf_lines: int = 0
    rollout_perf_lines: int = 0
    rollout_lines: int = 0
    unmarked: int = 0  # metric dicts logged without a `<kind> N:` marker
    multiline: int = 0  # metric dicts printed over several lines
    duplicates: int = 0  # the doubled `step N:` line, or any line repeating a step's content
    conflicts: int = 0  # lines for one step that contradict each other (or two listings)
    repeated: int = 0  # lines carrying `[repeated Nx across cluster]`
    repeated_collapsed: int = 0  # sum of N over those lines: lines Ray did not show
    unparseable: int = 0  # metric lines whose payload could not be read
    truncated: int = 0  # the last line, cut mid-dict
    late: int = 0  # lines for a step already released (arrived more than _RELEASE_LAG steps late)
    late_unchecked: int = 0  # of those, lines for a step too old to be checked against its values
    argument_blocks: int = 0  # Megatron `arguments` listings read
    coarse_stamps: int = 0  # logging stamps to the second only (no milliseconds)
    role_step_lines: int = 0  # `critic-step N:` lines: another model's steps, not the actor's
    no_step_time: int = 0  # train perf dicts with neither a known step time nor its two parts
    inconsistent: int = 0  # train perf dicts whose named step time is not train wait + train
    signal_lines: int = (
        0  # lines that say training failed (launcher/judge/parse/shapes.py, SIGNALS)
    )
    skipped_optimizer_steps: int = 0  # miles' `ft op=train_step ... valid_step=false` lines
    clock_lines: int = 0  # the host's clock lines that counted (parse/clock.py)
    clock_refused: int = 0  # lines that began like one and did not count (forged, no nonce)
    unparseable_examples: list[str] = field(default_factory=list)
    half_read_examples: list[str] = field(default_factory=list)  # no_step_time / inconsistent
    # The first failure lines: {"kind", "after_step" (the last step seen before it, -1: none),
    # "line"}; and the rollouts whose optimizer step miles skipped.
    signals: list[Signal] = field(default_factory=list)
    # The failure lines (skipped optimizer steps aside) grouped by the step they follow, in log
    # order: {"after_step", "kind", "line" (the group's most specific: an OOM over the bare
    # `Traceback` header), "lines"}. Which group ended training and which the run recovered from
    # is launcher/judge/failures.py's call; the last group is always kept (MAX_SIGNAL_GROUPS).
    signal_groups: list[SignalGroup] = field(default_factory=list)
    skipped_rollouts: list[int] = field(default_factory=list)
    conflict_examples: list[Conflict] = field(default_factory=list)
    first_lines: list[str] = field(default_factory=list)  # the log's first non-blank lines
    # What the file's first bytes say it is when it is packed (gzip, zstd, bzip2, xz): set by the
    # file's reader (launcher/results/evaluate.py, parse_log), so an unreadable log is named.
    packed: str | None = None
    arguments: dict[str, str] = field(default_factory=dict)  # the first listing: name -> value

    @property
    def recognised(self) -> bool:
        """Whether anything in the log was recognised as miles' (a metric dict or its arguments)."""
        return bool(self.metric_lines or self.argument_blocks)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["arguments"] = len(self.arguments)  # how many; the listing itself is not a counter
        return out


@dataclass
class ParseResult:
    records: list[StepRecord]
    stats: ParseStats


def same(a: float | int | None, b: float | int | None) -> bool:
    """Equal, NaN counting as equal to NaN: two prints of one NaN loss are the same value."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b
