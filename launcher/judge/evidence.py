"""The evidence gate: is this log a run of this recipe, and do the log's own sources agree?

Why: a figure computed from a log is only worth comparing with the claim when the log is a run of
the recipe. A log of another batch size, another layout or another number of GPUs gives a
tokens/s figure that means something else, and a log whose two sources for one step disagree
gives whichever figure a parser happened to keep. So before any verdict on speed, these checks
run, each reporting every disagreement with both values (docs/measurement.md, "The evidence
gate", states each check and its tolerance):

1. arguments: what miles printed at start-up (Megatron's `arguments` listing) against the
   recipe's fields (launcher/inputs/runargs.py holds the table);
2. tokens per step: what miles logged (`actor_train_tok_per_s x actor_train_time`) against
   global_batch x row_tokens, each step within TOKENS_TOLERANCE;
3. step times: the time between consecutive step lines' logging stamps against the sum of their
   `perf/step_time`, within STEP_TIME_TOLERANCE (plus the stamps' resolution);
4. steps: the log may not hold more steps than the recipe runs;
5. one value per step: two lines for one step that differ, or two listings that differ;
6. the host's clock: the span over which the host saw the window's step lines arrive against the
   sum of their `perf/step_time`, within STEP_TIME_TOLERANCE plus the clock's resolution at both
   ends. Checks 2, 3 and 5 compare the container's words with each other; this one holds them to
   a clock the container cannot forge (launcher/judge/parse/clock.py);
7. the GPUs at work: over that same host span, the host's samples (scripts/gpu_sampler.py,
   outside every container) of as many of the node's GPUs as the recipe uses, the busiest, must
   show each busy: its median utilization.gpu at least BUSY_UTIL_PERCENT. Check 6 proves the
   lines came at the pace they claim; this one that the GPUs worked while they came
   (launcher/judge/parse/gpu.py).

A check whose evidence is absent (a log that prints no listing, no stamps, no tokens) does not
pass silently: it is listed as not checked, and the verdict says so. Pure: no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from launcher.inputs.runargs import ARGS, coerce, equal, printed_getter
from launcher.judge.parse.clock import CLOCK_GAP_S

if TYPE_CHECKING:
    from launcher.judge.parse.gpu import GpuSamples
    from launcher.judge.parse.records import ParseStats, StepRecord

# Tokens per step may differ from global_batch x row_tokens by this fraction at most. The rows
# are fixed length (workload.row_tokens), so miles' count is exact up to float rounding; a
# different batch or row length is off by far more (64 vs 128 rows: 50%).
TOKENS_TOLERANCE = 0.01
# The span of logging stamps over consecutive steps may differ from the sum of their
# perf/step_time by this fraction (perf/step_time is train wait + train time, the loop's wall
# time; what else the loop does takes well under 5% in the runs measured) ...
STEP_TIME_TOLERANCE = 0.05
# ... plus the stamps' own resolution, once per run of consecutive steps.
_STAMP_RESOLUTION_S = {True: 0.001, False: 1.0}
# Check 7: each GPU's median utilization.gpu over the window must be at least this. Why 50%, so
# low: utilization.gpu is the share of the sample period in which any kernel ran, and training at
# the seed's MFU should keep kernels running nearly all the time, its pauses (the rollout's wait,
# the optimizer step's host work) short beside a step. Assumed, not yet measured: no real miles
# run was sampled (benchmarks/device_image_figures.sh samples a card under a bf16 matmul loop).
# An idle GPU reads 0. The median, not the mean: a window that idles more than half its samples
# fails, whatever a few busy samples say. Meant to be conservative: a GPU idle for most of the
# window never passes, and a real run should stay far above it.
BUSY_UTIL_PERCENT = 50.0
# The samples must cover the window: no gap between samples of a GPU (or between the window's
# ends and its first and last sample) longer than this. The sampler asks once a second; a longer
# gap is nvidia-smi stalling on the host, and a window the host did not watch is not checked.
MAX_SAMPLE_GAP_S = 5.0


@dataclass(frozen=True)
class Disagreement:
    """One fact the evidence and the recipe (or two pieces of evidence) state differently."""

    # arguments | tokens per step | step times | steps | one value per step | host clock |
    # gpus busy
    check: str
    what: str  # the field or figure
    recipe: Any  # the recipe's value (or the first source's)
    evidence: Any  # the log's value (or the second source's)
    detail: str  # one sentence with both values

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "what": self.what,
            "recipe": self.recipe,
            "evidence": self.evidence,
            "detail": self.detail,
        }


@dataclass
class Evidence:
    """What the gate found: disagreements, the checks that ran, those that could not."""

    disagreements: list[Disagreement] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    cross: dict[str, Any] = field(default_factory=dict)  # the figures the checks compared

    @property
    def consistent(self) -> bool:
        return not self.disagreements

    def to_dict(self) -> dict[str, Any]:
        return {
            "consistent": self.consistent,
            "disagreements": [d.to_dict() for d in self.disagreements],
            "checked": list(self.checked),
            "not_checked": list(self.not_checked),
            "figures": dict(self.cross),
        }


def gather(
    raw: dict[str, Any],
    recs: Mapping[int, StepRecord],
    present: list[int],
    stats: ParseStats | None,
    gpu_samples: GpuSamples | None = None,
) -> Evidence:
    """Run every check of the gate (module docstring) on one log's steps and counters;
    `gpu_samples`: the host's samples of node 0's GPUs (None: the run has no sampler file)."""
    ev = Evidence()
    _arguments(ev, raw, stats)
    _tokens(ev, raw, recs)
    _step_times(ev, recs, present, stats)
    _steps(ev, raw, recs)
    _one_value(ev, stats)
    _host_clock(ev, recs, present)
    _gpus_busy(ev, raw, recs, present, gpu_samples)
    return ev


def logged_args_disagreements(raw: dict[str, Any], logged: Mapping[str, str]) -> list[Disagreement]:
    """The arguments miles printed against the recipe's fields (only fields the recipe states)."""
    out: list[Disagreement] = []
    for arg in ARGS:
        expected = arg.expected(raw)
        if not arg.in_log or expected is None or arg.dest not in logged:
            continue
        text = logged[arg.dest]
        try:
            got = coerce(text, arg.kind)
        except ValueError:
            got = text
        if got is None and arg.dest == "virtual_pipeline_model_parallel_size":
            got = 1  # no virtual pipeline
        if got is None and arg.dest == "expert_tensor_parallel_size":  # Megatron: tp's
            got = coerce(logged.get("tensor_model_parallel_size", "1"), int)
        if got is None and arg.derived is not None:  # miles derives it after printing None
            got, how = arg.derived(raw, printed_getter(logged))
            text = f"{text} ({how})"
        if not equal(expected, got, arg.kind):
            out.append(
                Disagreement(
                    "arguments",
                    arg.field,
                    expected,
                    text,
                    f"{arg.field} is {expected!r}, but miles printed {arg.dest} = {text}",
                )
            )
    batch, samples = logged.get("rollout_batch_size"), logged.get("n_samples_per_prompt", "1")
    try:
        rows = coerce(batch, int) * coerce(samples, int) if batch is not None else None
    except (ValueError, TypeError):
        rows = None
    global_batch = raw["workload"]["global_batch"]
    if rows is not None and rows != global_batch:
        out.append(
            Disagreement(
                "arguments",
                "workload.global_batch",
                global_batch,
                rows,
                f"workload.global_batch is {global_batch}, but miles printed rollout_batch_size "
                f"= {batch} x n_samples_per_prompt = {samples} = {rows} rows per rollout (a "
                "recipe's step is one rollout of one global batch)",
            )
        )
    return out


def _arguments(ev: Evidence, raw: dict[str, Any], stats: ParseStats | None) -> None:
    logged = stats.arguments if stats is not None else {}
    if not logged:
        ev.not_checked.append(
            "the run's arguments: the log prints no `arguments` listing (miles prints Megatron's "
            "at start-up), so global batch, rollout batch, nodes, GPUs per node, rollouts, "
            "TP/PP/CP/EP/ETP and max tokens per GPU were not compared with the recipe"
        )
        return
    found = logged_args_disagreements(raw, logged)
    ev.disagreements += found
    compared = [
        a.dest for a in ARGS if a.in_log and a.dest in logged and a.expected(raw) is not None
    ]
    ev.checked.append(
        f"the run's arguments: {len(compared)} printed arguments compared with the recipe's "
        f"fields, {len(found)} disagree"
    )


def _span(steps: list[int]) -> str:
    if not steps:
        return "none"
    if steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 2:
        return f"{steps[0]}-{steps[-1]}"
    shown = ", ".join(map(str, steps[:8]))
    return shown + (f", ... ({len(steps)} in all)" if len(steps) > 8 else "")


def _tokens(ev: Evidence, raw: dict[str, Any], recs: Mapping[int, StepRecord]) -> None:
    workload = raw["workload"]
    expected = int(workload["global_batch"]) * int(workload["row_tokens"])
    logged = {s: r.tokens for s, r in recs.items() if r.tokens is not None}
    if not logged:
        ev.not_checked.append(
            "tokens per step: the log gives no perf/actor_train_tok_per_s with "
            "perf/actor_train_time"
        )
        return
    off = sorted(s for s, t in logged.items() if abs(t - expected) > TOKENS_TOLERANCE * expected)
    mean = sum(logged.values()) / len(logged)
    ev.cross["logged_tokens_per_step_mean"] = mean
    ev.cross["logged_tokens_vs_recipe_relative_difference"] = abs(mean - expected) / expected
    ev.checked.append(
        f"tokens per step: {len(logged)} steps' logged tokens against {expected:,} "
        f"(within {100 * TOKENS_TOLERANCE:g}%)"
    )
    if off:
        values = sorted({logged[s] for s in off})
        shown = ", ".join(f"{v:,}" for v in values[:3]) + (", ..." if len(values) > 3 else "")
        ev.disagreements.append(
            Disagreement(
                "tokens per step",
                "workload.global_batch x workload.row_tokens",
                expected,
                values[0] if len(values) == 1 else values[:3],
                f"tokens per step: the recipe implies {expected:,} (global_batch "
                f"{workload['global_batch']} x row_tokens {workload['row_tokens']}), miles logged "
                f"{shown} at {len(off)} of {len(logged)} steps (steps {_span(off)})",
            )
        )


def _step_times(
    ev: Evidence, recs: Mapping[int, StepRecord], present: list[int], stats: ParseStats | None
) -> None:
    """Stamps against perf/step_time over chains of consecutive steps (their spans telescope, so
    the stamps' resolution counts once per chain, not once per step)."""
    span = perf = 0.0
    chains = pairs = 0
    previous = None
    for s in present:
        now = recs[s].timestamp
        before = recs[s - 1].timestamp if (s - 1) in recs else None
        step_time = recs[s].step_time
        if now is None or before is None or step_time is None or not math.isfinite(step_time):
            previous = None
            continue
        if previous != s - 1:
            chains += 1
        span += now - before
        perf += step_time
        pairs += 1
        previous = s
    if not pairs:
        ev.not_checked.append(
            "step times: the log's step lines carry no logging stamps (or no window step has "
            "one before it), so perf/step_time was not checked against the clock"
        )
        return
    fine = stats is None or not stats.coarse_stamps  # stamps to the millisecond
    allowed = STEP_TIME_TOLERANCE * perf + chains * _STAMP_RESOLUTION_S[fine]
    ev.cross.update(
        {
            "timestamp_mean_step_time_s": span / pairs,
            "perf_mean_step_time_s": perf / pairs,
            "timestamp_vs_perf_relative_difference": abs(span - perf) / perf if perf else None,
        }
    )
    ev.checked.append(
        f"step times: logging stamps against perf/step_time over {pairs} steps (within "
        f"{100 * STEP_TIME_TOLERANCE:g}% plus the stamps' resolution)"
    )
    if abs(span - perf) > allowed:
        ev.disagreements.append(
            Disagreement(
                "step times",
                "perf/step_time",
                round(perf / pairs, 3),
                round(span / pairs, 3),
                f"step times: the logging stamps give {span / pairs:.3f} s per step, "
                f"perf/step_time {perf / pairs:.3f} s ({100 * abs(span - perf) / perf:.1f}% "
                f"apart over {pairs} steps; allowed {100 * STEP_TIME_TOLERANCE:g}%)",
            )
        )


# Where a log has no host clock: what the verdict says instead of the check (the kinds of run
# without one: docs/measurement.md, "The evidence gate").
NO_HOST_CLOCK = (
    "the host's clock: the log holds no host clock lines with the run's nonce before the "
    "window's steps (a run on a Ray cluster, with runtime: host or with docker.host_clock off, a "
    "log measured apart from its run directory, or a run of an older launcher), so "
    "perf/step_time was held only to the container's own logging stamps"
)


def _host_span(
    recs: Mapping[int, StepRecord], present: list[int]
) -> tuple[int, int, float, float] | None:
    """The window's host span, which checks 6 and 7 share: its first and last step lines with a
    host arrival bound, and those bounds (None: fewer than two such lines)."""
    clocked = [s for s in sorted(present) if recs[s].arrived is not None]
    if len(clocked) < 2:
        return None
    first, last = clocked[0], clocked[-1]
    start, end = recs[first].arrived, recs[last].arrived
    assert start is not None and end is not None  # clocked
    return first, last, start, end


def _host_clock(ev: Evidence, recs: Mapping[int, StepRecord], present: list[int]) -> None:
    """Check 6: the window's first and last step lines with a host arrival bound: the host's
    span between them against the claimed perf/step_time of the steps after the first up to
    the last (a step line is printed as its step ends). Each bound lies within CLOCK_GAP_S
    before the line began to arrive, so the span is known to CLOCK_GAP_S at each end."""
    span = _host_span(recs, present)
    if span is None:
        ev.not_checked.append(NO_HOST_CLOCK)
        return
    first, last, start, end = span
    times = [recs[s].step_time if s in recs else None for s in range(first + 1, last + 1)]
    claims = [t for t in times if t is not None and math.isfinite(t)]
    if len(claims) != len(times):
        ev.not_checked.append(
            f"the host's clock: a step between {first} and {last} has no step time, so their "
            "claimed span is not known"
        )
        return
    host, claimed = end - start, sum(claims)
    allowed = STEP_TIME_TOLERANCE * claimed + 2 * CLOCK_GAP_S
    ev.cross.update(
        {
            "host_clock_steps": [first, last],
            "host_clock_span_s": host,
            "host_clock_claimed_s": claimed,
        }
    )
    ev.checked.append(
        f"the host's clock: steps {first}-{last} arrived over {host:.3f} s of the host's clock, "
        f"perf/step_time claims {claimed:.3f} s (within {100 * STEP_TIME_TOLERANCE:g}% plus "
        f"{CLOCK_GAP_S:g} s at each end)"
    )
    if abs(host - claimed) > allowed:
        apart = f"{100 * abs(host - claimed) / claimed:.1f}% apart" if claimed > 0 else "apart"
        ev.disagreements.append(
            Disagreement(
                "host clock",
                "perf/step_time",
                round(claimed, 3),
                round(host, 3),
                f"host clock: steps {first} to {last} arrived {host:.3f} s apart on the host's "
                f"clock, but their perf/step_time adds up to {claimed:.3f} s ({apart}; allowed "
                f"{100 * STEP_TIME_TOLERANCE:g}% plus {2 * CLOCK_GAP_S:g} s)",
            )
        )


# Where check 7 cannot run: no sampler file (the kinds of run without one), or no host clock to
# place the window on the samples.
NO_GPU_SAMPLES = (
    "the GPUs at work: the run directory holds no GPU sampler file (gpu-samples.csv: a run on a "
    "Ray cluster, with runtime: host or with docker.host_clock off, a log measured apart from its "
    "run directory, or a run of an older launcher), so nothing the host saw says the GPUs worked "
    "during the window"
)
NO_CLOCK_FOR_SAMPLES = (
    "the GPUs at work: the log holds no host clock to place the window on the host's GPU "
    "samples, so nothing the host saw says the GPUs worked during the window"
)


def _gpus_busy(
    ev: Evidence,
    raw: dict[str, Any],
    recs: Mapping[int, StepRecord],
    present: list[int],
    samples: GpuSamples | None,
) -> None:
    """Check 7: over the host span of check 6 (the window's first and last step lines' arrival
    bounds), the gpu.per_node GPUs the recipe uses on node 0 must each have samples covering the
    span (no gap over MAX_SAMPLE_GAP_S) whose median utilization.gpu is at least
    BUSY_UTIL_PERCENT. Which of the node's GPUs the run had is not assumed: a profile may give
    the container `docker.gpus: device=2,3`, and nvidia-smi's indices need not be the
    container's. So the per_node busiest GPUs the host watched over the span are the ones judged:
    a node whose every GPU idled fails whichever they are, and GPUs the run did not have, idle,
    never fail an honest run. Where fewer GPUs than that were watched over the whole span, the
    ones not covered are not checked, and said."""
    span = _host_span(recs, present)
    if samples is None or span is None:
        ev.not_checked.append(NO_GPU_SAMPLES if samples is None else NO_CLOCK_FOR_SAMPLES)
        return
    if samples.problem is not None or not samples.samples:
        why = samples.problem or samples.why_none or "the file holds no sample in its form"
        ev.not_checked.append(
            f"the GPUs at work: the host's GPU sampler file gives no samples ({why}; "
            f"{samples.refused} line(s) refused), so nothing the host saw says the GPUs worked"
        )
        return
    first, last, start, end = span
    gpu = raw.get("gpu") or {}
    per_node = gpu.get("per_node") or gpu.get("count")
    gpus = int(per_node) if isinstance(per_node, int) and per_node > 0 else 0
    covered: dict[int, float] = {}
    uncovered: list[str] = []
    for index in sorted(set(samples.by_gpu) | set(range(gpus))):
        seen = [(t, u) for t, u in samples.by_gpu.get(index, []) if start <= t <= end]
        edges = [start, *(t for t, _ in seen), end]
        gap = max(b - a for a, b in pairwise(edges))
        if not seen or gap > MAX_SAMPLE_GAP_S:
            uncovered.append(f"GPU {index} ({len(seen)} samples, a gap of {gap:.1f} s)")
            continue
        covered[index] = statistics.median(u for _, u in seen)
    # the per_node busiest of the GPUs watched, in index order (see the docstring)
    busiest = sorted(covered, key=lambda i: (-covered[i], i))[:gpus]
    medians = {i: covered[i] for i in sorted(busiest)}
    if uncovered and len(covered) < gpus:
        ev.not_checked.append(
            f"the GPUs at work: the host's samples of {', '.join(uncovered)} do not cover steps "
            f"{first}-{last} ({end - start:.1f} s on the host's clock; a gap of at most "
            f"{MAX_SAMPLE_GAP_S:g} s allowed), so the host did not watch them work"
        )
    if not medians:
        return
    ev.cross["gpu_busy_median_percent"] = {str(i): m for i, m in medians.items()}
    shown = ", ".join(f"GPU {i} {m:g}%" for i, m in medians.items())
    ev.checked.append(
        f"the GPUs at work: the host's samples over steps {first}-{last} ({end - start:.1f} s "
        f"on its clock) give median utilization {shown} (at least {BUSY_UTIL_PERCENT:g}% each)"
    )
    for index, median in medians.items():
        if median < BUSY_UTIL_PERCENT:
            ev.disagreements.append(
                Disagreement(
                    "gpus busy",
                    f"GPU {index} utilization.gpu",
                    BUSY_UTIL_PERCENT,
                    median,
                    f"gpus busy: GPU {index}'s median utilization.gpu over steps {first} to "
                    f"{last} ({end - start:.1f} s on the host's clock) is {median:g}%, under "
                    f"the {BUSY_UTIL_PERCENT:g}% a GPU doing the claimed work shows: the host "
                    "saw it idle while the step lines came",
                )
            )


def _steps(ev: Evidence, raw: dict[str, Any], recs: Mapping[int, StepRecord]) -> None:
    expected = (raw.get("result") or {}).get("steps_per_run")
    if not isinstance(expected, int) or not recs:
        return
    last = max(recs)
    ev.checked.append(f"steps: the log's steps against result.steps_per_run {expected}")
    if last >= expected:
        ev.disagreements.append(
            Disagreement(
                "steps",
                "result.steps_per_run",
                expected,
                last + 1,
                f"steps: the log has steps up to {last} ({len(recs)} steps), the recipe runs "
                f"result.steps_per_run {expected} (steps 0-{expected - 1})",
            )
        )


def _one_value(ev: Evidence, stats: ParseStats | None) -> None:
    if stats is None:
        ev.not_checked.append("one value per step: the steps were read back, not parsed")
        return
    ev.checked.append("one value per step: every step's lines agree with each other")
    for c in stats.conflict_examples:
        where = "two `arguments` listings" if c["step"] < 0 else f"step {c['step']}"
        ev.disagreements.append(
            Disagreement(
                "one value per step",
                c["metric"],
                c["first"],
                c["second"],
                f"{where}: two lines give {c['metric']} {c['first']!r} and {c['second']!r}; "
                "the log holds two sources that disagree, and neither is picked",
            )
        )
    if stats.conflicts > len(stats.conflict_examples):
        ev.disagreements.append(
            Disagreement(
                "one value per step",
                "lines",
                None,
                stats.conflicts,
                f"{stats.conflicts} disagreeing values in all (the first "
                f"{len(stats.conflict_examples)} shown)",
            )
        )
    if stats.late_unchecked:
        ev.disagreements.append(
            Disagreement(
                "one value per step",
                "late lines",
                None,
                stats.late_unchecked,
                f"{stats.late_unchecked} metric line(s) for steps long complete could not be "
                "checked against them (two logs joined into one?)",
            )
        )


def one_value(stats: ParseStats | None) -> list[Disagreement]:
    """Check 5 alone (two lines for one step that differ, two listings that differ, late lines
    not checked): what `compare` asks of each log, by the same rule as the verdict."""
    ev = Evidence()
    _one_value(ev, stats)
    return ev.disagreements
