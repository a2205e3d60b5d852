"""Checks 6 and 7 of the evidence gate: the host's clock and the GPUs at work, the evidence the
host gathered outside every container (docs/measurement.md, "The host's clock", "The GPUs at
work", "The host's evidence fails closed"). A run launched with them on owes their evidence
(HostWatch): missing, unreadable or cut short, it fails closed, naming which. Pure: no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from itertools import pairwise
from typing import TYPE_CHECKING

from launcher.judge.evidence_records import (
    STEP_TIME_TOLERANCE,
    Disagreement,
    Evidence,
    HostWatch,
)
from launcher.judge.parse.clock import CLOCK_GAP_S

if TYPE_CHECKING:
    from launcher.inputs.recipe import Hardware
    from launcher.judge.parse.gpu import GpuSamples
    from launcher.judge.parse.records import StepRecord

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
# gap is nvidia-smi stalling on the host (or the sampler dead): a window the host did not watch
# is named as not checked, or fails where the run owes the samples.
MAX_SAMPLE_GAP_S = 5.0


def _owed(ev: Evidence, check: str, what: str, why: str) -> None:
    """Evidence a run launched with the host's clock and sampler on must have and has not: a
    disagreement (fails closed), naming what is missing."""
    ev.disagreements.append(Disagreement(check, what, "present", None, why))


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


def host_clock(
    ev: Evidence, recs: Mapping[int, StepRecord], present: list[int], watch: HostWatch | None
) -> None:
    """Check 6: the window's first and last step lines with a host arrival bound: the host's
    span between them against the claimed perf/step_time of the steps after the first up to
    the last (a step line is printed as its step ends). Each bound lies within CLOCK_GAP_S
    before the line began to arrive, so the span is known to CLOCK_GAP_S at each end."""
    span = _host_span(recs, present)
    if span is None:
        if watch is not None and watch.clock and present:
            _owed(
                ev,
                "host clock",
                "the host's clock lines",
                "host clock: the run was launched with the host's clock on, but fewer than two of "
                "the window's step lines carry its stamp (its lines missing, or without the run's "
                "nonce), so the host never saw the window's pace: not proven",
            )
            return
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
GPU_SAMPLES_FILE = "gpu-samples.csv"  # records/rundir.py's Files.GPU_SAMPLES (a higher layer)
NO_CLOCK_FOR_SAMPLES = (
    "the GPUs at work: the log holds no host clock to place the window on the host's GPU "
    "samples, so nothing the host saw says the GPUs worked during the window"
)


def gpus_busy(
    ev: Evidence,
    gpu: Hardware,
    recs: Mapping[int, StepRecord],
    present: list[int],
    samples: GpuSamples | None,
    host: HostWatch | None = None,
) -> None:
    """Check 7: over the host span of check 6 (the window's first and last step lines' arrival
    bounds), the gpu.per_node GPUs the recipe uses on node 0 must each have samples covering the
    span (no gap over MAX_SAMPLE_GAP_S) whose median utilization.gpu is at least
    BUSY_UTIL_PERCENT. Which of the node's GPUs the run had is not assumed: a profile may give
    the container `docker.gpus: device=2,3`, and nvidia-smi's indices need not be the
    container's. So the per_node busiest GPUs the host watched over the span are the ones judged:
    a node whose every GPU idled fails whichever they are, and GPUs the run did not have, idle,
    never fail an honest run. Where fewer GPUs than that were watched over the whole span, the
    ones not covered are not checked, and said. For a run launched with the sampler on (`host`),
    each of those gaps fails closed instead: no file, an unreadable one, no samples, a file cut
    off before the sampler's end line, fewer GPUs watched over the span than the recipe uses."""
    owed = host is not None and host.sampler and bool(present)
    span = _host_span(recs, present)
    if samples is None or span is None:
        if owed and samples is None:
            _owed(
                ev,
                "gpus busy",
                "the host's GPU samples",
                "gpus busy: the run was launched with the host's GPU sampler on, but the run "
                f"directory holds no {GPU_SAMPLES_FILE} (the sampler never wrote it, or it was "
                "not collected): nothing the host saw says the GPUs worked",
            )
        elif not owed or samples is None:
            ev.not_checked.append(NO_GPU_SAMPLES if samples is None else NO_CLOCK_FOR_SAMPLES)
        # a sampler file with no host clock to place it on: check 6 failed closed already
        return
    if samples.problem is not None or not samples.samples:
        why = samples.problem or samples.why_none or "the file holds no sample in its form"
        text = (
            f"the host's GPU sampler file gives no samples ({why}; {samples.refused} line(s) "
            "refused), so nothing the host saw says the GPUs worked"
        )
        if owed:
            _owed(ev, "gpus busy", "the host's GPU samples", f"gpus busy: {text}")
        else:
            ev.not_checked.append(f"the GPUs at work: {text}")
        return
    if owed and not samples.ended:
        _owed(
            ev,
            "gpus busy",
            "the host's GPU samples",
            f"gpus busy: the host's GPU sampler file is cut off ({samples.samples} samples, no "
            "end line: the sampler died while the run went on, killed or unable to write), so "
            "what the GPUs did after its last sample is not known",
        )
    first, last, start, end = span
    per_node = gpu.per_node or gpu.count
    gpus = per_node if per_node is not None and per_node > 0 else 0
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
        text = (
            f"the host's samples of {', '.join(uncovered)} do not cover steps "
            f"{first}-{last} ({end - start:.1f} s on the host's clock; a gap of at most "
            f"{MAX_SAMPLE_GAP_S:g} s allowed), so the host did not watch them work"
        )
        if owed:
            _owed(ev, "gpus busy", "the host's GPU samples", f"gpus busy: {text}")
        else:
            ev.not_checked.append(f"the GPUs at work: {text}")
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
