"""The evidence gate: is this log a run of this recipe, and do the log's own sources agree?

Why: a figure computed from a log is only worth comparing with the claim when the log is a run of
the recipe. A log of another batch size, another layout or another number of GPUs gives a
tokens/s figure that means something else, and a log whose two sources for one step disagree
gives whichever figure a parser happened to keep. So before any verdict on speed, these checks
run, each reporting every disagreement with both values (docs/measurement.md, "The evidence
gate", states each check and its tolerance):

1. arguments: what miles printed at start-up (Megatron's `arguments` listing) against the
   recipe's fields (launcher/inputs/runargs.py holds the table), and the model it printed
   against the recipe's (launcher/judge/identity.py); a log without the listing fails;
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

Checks 6 and 7, the host's evidence, are in launcher/judge/host_evidence.py; the records the
checks fill, in launcher/judge/evidence_records.py.

Absent evidence never passes silently: a log without the listing (which every miles version
prints) fails, as does evidence of the host's that the run owes; a check that cannot apply (no
stamps, no tokens, a bare log's host evidence) is listed as not checked. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from launcher.inputs.derived import coerce
from launcher.inputs.runargs import ARGS, equal, printed_getter
from launcher.judge.evidence_records import (
    STEP_TIME_TOLERANCE,
    Disagreement,
    Evidence,
    HostWatch,
)
from launcher.judge.host_evidence import (
    BUSY_UTIL_PERCENT,
    MAX_SAMPLE_GAP_S,
    NO_CLOCK_FOR_SAMPLES,
    NO_GPU_SAMPLES,
    NO_HOST_CLOCK,
    gpus_busy,
    host_clock,
)
from launcher.judge.identity import identity

if TYPE_CHECKING:
    from launcher.inputs.recipe import Recipe
    from launcher.judge.parse.gpu import GpuSamples
    from launcher.judge.parse.records import ParseStats, StepRecord

# Tokens per step may differ from global_batch x row_tokens by this fraction at most. The rows
# are fixed length (workload.row_tokens), so miles' count is exact up to float rounding; a
# different batch or row length is off by far more (64 vs 128 rows: 50%).
TOKENS_TOLERANCE = 0.01
# The stamps' own resolution (beside STEP_TIME_TOLERANCE), once per run of consecutive steps.
_STAMP_RESOLUTION_S = {True: 0.001, False: 1.0}
# The names the gate's readers import from here (its records and checks live in
# evidence_records.py and host_evidence.py).
__all__ = [
    "BUSY_UTIL_PERCENT",
    "MAX_SAMPLE_GAP_S",
    "NO_CLOCK_FOR_SAMPLES",
    "NO_GPU_SAMPLES",
    "NO_HOST_CLOCK",
    "STEP_TIME_TOLERANCE",
    "Disagreement",
    "Evidence",
    "HostWatch",
    "gather",
    "logged_args_disagreements",
    "one_value",
]


def gather(
    recipe: Recipe,
    recs: Mapping[int, StepRecord],
    present: list[int],
    stats: ParseStats | None,
    gpu_samples: GpuSamples | None = None,
    host: HostWatch | None = None,
) -> Evidence:
    """Run every check of the gate (module docstring) on one log's steps and counters;
    `gpu_samples`: the host's samples of node 0's GPUs (None: the run has no sampler file);
    `host`: what the run was launched with (None: not known, a bare log)."""
    ev = Evidence()
    _arguments(ev, recipe, stats)
    _tokens(ev, recipe, recs)
    _step_times(ev, recs, present, stats)
    _steps(ev, recipe, recs)
    _one_value(ev, stats)
    host_clock(ev, recs, present, host)
    gpus_busy(ev, recipe.hardware, recs, present, gpu_samples, host)
    return ev


def logged_args_disagreements(recipe: Recipe, logged: Mapping[str, str]) -> list[Disagreement]:
    """The arguments miles printed against the recipe's fields (only fields the recipe states)."""
    out: list[Disagreement] = []
    for arg in ARGS:
        expected = recipe.expected_argument(arg)
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
            got, how = recipe.derived_argument(arg, printed_getter(logged))
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
    global_batch = recipe.workload.global_batch
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


# Every miles and slime version prints Megatron's listing on the driver at start-up
# (docs/miles-log.md), so a log without one is not evidence of a run of this recipe: fails closed.
NO_LISTING = (
    "the run's arguments: the log prints no `arguments` listing (every miles version prints "
    "Megatron's at start-up), so nothing shows this is a run of the recipe's model, layout and "
    "batch: its identity is not proven"
)


def _arguments(ev: Evidence, recipe: Recipe, stats: ParseStats | None) -> None:
    logged = stats.arguments if stats is not None else {}
    if not logged:
        if stats is None:  # steps read back from steps.jsonl: the listing was judged then
            ev.not_checked.append("the run's arguments: the steps were read back, not parsed")
            return
        ev.disagreements.append(
            Disagreement("arguments", "the arguments listing", "printed", None, NO_LISTING)
        )
        return
    found = logged_args_disagreements(recipe, logged)
    ev.disagreements += found
    compared = [
        a.dest
        for a in ARGS
        if a.in_log and a.dest in logged and recipe.expected_argument(a) is not None
    ]
    ev.checked.append(
        f"the run's arguments: {len(compared)} printed arguments compared with the recipe's "
        f"fields, {len(found)} disagree"
    )
    _model(ev, recipe, logged)


def _model(ev: Evidence, recipe: Recipe, logged: Mapping[str, str]) -> None:
    """The model's identity (launcher/judge/identity.py): the printed architecture's parameter
    counts against the recipe's active_params and name. Unreadable fails closed; a model family
    the count does not cover is named as not checked."""
    found = identity(recipe.sections, logged)
    if found.not_covered is not None:
        ev.not_checked.append(f"the model: {found.not_covered}, so it was not held to the recipe")
        return
    if found.unreadable is not None or found.counts is None or found.architecture is None:
        ev.disagreements.append(
            Disagreement(
                "model",
                "the model's architecture",
                "printed",
                None,
                f"the model: {found.unreadable}, so nothing shows this is a run of the "
                "recipe's model: its identity is not proven",
            )
        )
        return
    ev.cross["model_active_params"] = found.counts.active
    ev.cross["model_total_params"] = found.counts.total
    ev.cross["model_architecture"] = found.architecture.to_dict()
    ev.checked.append(
        f"the model: the printed architecture gives {found.counts.active:,} active and "
        f"{found.counts.total:,} total parameters, held to result.active_params.count and the "
        "model's name"
    )
    for problem in found.problems:
        ev.disagreements.append(
            Disagreement("model", "result.active_params.count", None, None, problem)
        )


def _span(steps: list[int]) -> str:
    if not steps:
        return "none"
    if steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 2:
        return f"{steps[0]}-{steps[-1]}"
    shown = ", ".join(map(str, steps[:8]))
    return shown + (f", ... ({len(steps)} in all)" if len(steps) > 8 else "")


def _tokens(ev: Evidence, recipe: Recipe, recs: Mapping[int, StepRecord]) -> None:
    expected = recipe.tokens_per_step
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
                f"{recipe.global_batch} x row_tokens {recipe.row_tokens}), miles logged "
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


def _steps(ev: Evidence, recipe: Recipe, recs: Mapping[int, StepRecord]) -> None:
    expected = recipe.claim.steps_per_run
    if expected is None or not recs:
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
