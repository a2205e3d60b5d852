"""Steps + the recipe + the run timeline -> the recipe's `result` figures, computed its way.

Why each formula is what it is: docs/measurement.md. Every formula here reproduces the seed
recipe's own figures from its own inputs (tests/judge/test_measure.py shows it), so a reproduction
and a claim can be compared number to number. Measurement is a pure function (no file, no clock, no
network): re-running it on a saved run directory gives the same answer. Reading and writing run
directories is launcher/results/evaluate.py's job.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeGuard

from launcher import catalog
from launcher.catalog import Price
from launcher.errors import BadInput
from launcher.inputs.recipe import Recipe
from launcher.judge.evidence import Evidence, HostWatch, gather
from launcher.judge.failures import Findings, find_failures
from launcher.judge.flops import MEGATRON_SOURCE, per_token
from launcher.judge.parse.gpu import GpuSamples
from launcher.judge.parse.records import ParseStats, StepRecord
from launcher.judge.split import failed_stages, stage_split, stage_work
from launcher.judge.timeline import RunTimeline

MFU_FORMULA = "6 x N_active x tokens/s per GPU / peak (no attention term)"
STD_KIND = "population"
# What a log must show to be read as miles', for the message of an unreadable one.
EXPECTED_LINES = (
    "miles' metric lines, such as `step N: {'train/loss': ...}` and `perf N: {'perf/step_time': "
    "..., 'perf/actor_train_time': ...}` (with or without Ray's `(Actor pid=...)` prefix and the "
    "logging prefix `[date time] file.py:line - `), or Megatron's `arguments` listing "
    "(docs/miles-log.md)"
)


@dataclass
class Result:
    """The measured figures, with the provenance needed to audit each one."""

    tokens_per_s_per_gpu: float | None
    step_time_cv_percent: float | None
    mfu: float | None
    usd_per_million_tokens: float | None
    window: tuple[int, int]
    window_tokens: int
    tokens_per_step: int
    gpus: int
    steps_parsed: int
    steps_expected: int | None
    last_step: int | None
    window_steps_present: list[int]
    missing_window_steps: list[int]
    nan_loss_steps: list[int]
    nan_step_time_steps: list[int]
    mean_step_time_s: float | None
    std_step_time_s: float | None
    active_params: int | None
    peak_flops: float | None
    peak_source: str | None
    price: Price | None
    gpu_hours: float | None = None
    gpu_hours_source: str | None = None
    gpu_hours_by_stage: dict[str, float] = field(default_factory=dict)
    # each `parallel: a+b` part of that split -> each of its stages' own GPU-hours (the work per
    # stage, overlapped: these do not add up to the part, which counts the wall time once)
    gpu_hours_overlapped: dict[str, dict[str, float]] = field(default_factory=dict)
    window_gpu_hours: float | None = None
    failed_stages: list[str] = field(default_factory=list)
    # stages that failed after training had ended: the figures stand (judge/split.py)
    failed_after_training: list[str] = field(default_factory=list)
    no_loss_window_steps: list[int] = field(default_factory=list)  # a time but no `step N:` line
    notes: list[str] = field(default_factory=list)
    cross_checks: dict[str, Any] = field(default_factory=dict)
    parse_stats: dict[str, Any] | None = None
    measured: str | None = None
    evidence: Evidence = field(default_factory=Evidence)
    findings: Findings = field(default_factory=Findings)  # launcher/judge/failures.py: fail closed
    noise_band_percent: float | None = None  # 2 x CV / sqrt(n): a difference inside is noise
    # Megatron-LM's own FLOP count for the same run (launcher/judge/flops.py), beside the
    # recipe's MFU.
    megatron_flops_per_token: float | None = None
    megatron_mfu: float | None = None
    megatron_note: str | None = None  # why there is no Megatron figure
    unreadable: str | None = (
        None  # why the log could not be read as miles' (then nothing is judged)
    )
    runs: int = 1  # measured runs the figures are the mean of (launcher/judge/aggregate.py)
    # each measured run, the spread, how each figure aggregates
    run_summary: dict[str, Any] | None = None

    @property
    def ended_early(self) -> bool:
        """True when the log stops before the recipe's last step."""
        if self.steps_expected is None:
            return False
        return self.last_step is None or self.last_step < self.steps_expected - 1

    def _mfu_note(self) -> str:
        if self.mfu is None or self.peak_flops is None:
            return (
                "; ".join(n for n in self.notes if n.startswith("no MFU"))
                or "no MFU: no throughput"
            )
        return f"{MFU_FORMULA}; peak {self.peak_flops / 1e12:g} TFLOP/s ({self.peak_source})"

    def megatron(self) -> dict[str, Any]:
        """Megatron's count of the same run, named as such (never the recipe's `mfu`)."""
        return {
            "mfu": self.megatron_mfu,
            "flops_per_token": self.megatron_flops_per_token,
            "formula": f"{MEGATRON_SOURCE}; x tokens/s per GPU / the same peak",
            "recipe_flops_per_token": 6.0 * self.active_params if self.active_params else None,
            "not_computed": self.megatron_note,
        }

    def to_result_yaml(self) -> dict[str, Any]:
        """The recipe's `result` block shape (same keys, same rounding), plus provenance."""
        return {
            "tokens_per_s_per_gpu": _round(self.tokens_per_s_per_gpu, 2),
            "usd_per_million_tokens": _round(self.usd_per_million_tokens, 2),
            "step_time_cv_percent": _round(self.step_time_cv_percent, 2),
            "mfu": _round(self.mfu, 4),
            "mfu_note": self._mfu_note(),
            "active_params": {"count": self.active_params},
            "measured": self.measured,
            "steps_per_run": (self.last_step + 1) if self.last_step is not None else 0,
            "window": list(self.window),
            "window_tokens": self.window_tokens,
            "runs": self.runs,
            "profiler": False,
            "gpu_hours": _round(self.gpu_hours, 2),
            "gpu_hours_note": self.gpu_hours_source,
            "provenance": {
                "mfu_formula": MFU_FORMULA,
                "mfu_peak_flops": self.peak_flops,
                "mfu_peak_source": self.peak_source,
                "std_kind": STD_KIND,
                "price": self.price.to_dict() if self.price else None,
                "gpus": self.gpus,
                "tokens_per_step": self.tokens_per_step,
                "mean_step_time_s": self.mean_step_time_s,
                "std_step_time_s": self.std_step_time_s,
                "unrounded": {
                    "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                    "usd_per_million_tokens": self.usd_per_million_tokens,
                    "step_time_cv_percent": self.step_time_cv_percent,
                    "mfu": self.mfu,
                    "gpu_hours": self.gpu_hours,
                },
                "gpu_hours_by_stage": self.gpu_hours_by_stage,
                "gpu_hours_overlapped": self.gpu_hours_overlapped,
                "window_gpu_hours": self.window_gpu_hours,
                "steps_parsed": self.steps_parsed,
                "missing_window_steps": self.missing_window_steps,
                "nan_loss_steps": self.nan_loss_steps,
                "cross_checks": self.cross_checks,
                "evidence": self.evidence.to_dict(),
                "findings": asdict(self.findings),
                "noise_band_percent": self.noise_band_percent,
                "megatron_flops": self.megatron(),
                "unreadable": self.unreadable,
                "notes": self.notes,
                "parse": self.parse_stats,
                **({"measured_runs": self.run_summary} if self.run_summary else {}),
            },
        }

    def to_dict(self) -> dict[str, Any]:
        """The CLI's --json figures (unrounded)."""
        return {
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "step_time_cv_percent": self.step_time_cv_percent,
            "step_time_std_kind": STD_KIND,
            "mfu": self.mfu,
            "mfu_formula": MFU_FORMULA,
            "mfu_peak_flops": self.peak_flops,
            "usd_per_million_tokens": self.usd_per_million_tokens,
            "price": self.price.to_dict() if self.price else None,
            "gpu_hours": self.gpu_hours,
            "gpu_hours_by_stage": self.gpu_hours_by_stage,
            "gpu_hours_overlapped": self.gpu_hours_overlapped,
            "window": list(self.window),
            "window_tokens": self.window_tokens,
            "steps_parsed": self.steps_parsed,
            "last_step": self.last_step,
            "missing_window_steps": self.missing_window_steps,
            "nan_loss_steps": self.nan_loss_steps,
            "mean_step_time_s": self.mean_step_time_s,
            "cross_checks": self.cross_checks,
            "evidence": self.evidence.to_dict(),
            "findings": asdict(self.findings),
            "noise_band_percent": self.noise_band_percent,
            "megatron_flops": self.megatron(),
            "unreadable": self.unreadable,
            "notes": self.notes,
            "parse": self.parse_stats,
            **({"runs": self.runs, "measured_runs": self.run_summary} if self.run_summary else {}),
        }


def _round(value: float | None, digits: int) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def _finite(x: float | None) -> TypeGuard[float]:
    return x is not None and math.isfinite(x)


def _require(value: int | None, field: str) -> int:
    """A field measurement cannot do without; BadInput naming it when absent."""
    if value is None:
        raise BadInput(f"recipe has no {field}: cannot measure against it.")
    return value


def recipe_window(recipe: Recipe) -> tuple[int, int]:
    """result.window as an inclusive (first, last) step pair; BadInput when malformed."""
    window = recipe.claim.window
    if window is None:
        raise BadInput(
            "recipe has no result.window of [first, last] steps: cannot measure against it."
        )
    first, last = window
    if first < 0 or last < first:
        raise BadInput(f"recipe result.window {list(window)!r} is empty or negative.")
    return first, last


def pure_figures(
    tokens_per_s_per_gpu: float,
    *,
    gpus: int,
    active_params: int | None,
    peak_flops: float | None,
    usd_per_hour: float | None,
) -> tuple[float | None, float | None]:
    """(MFU, $ per 1M tokens) from a throughput: the two formulas of docs/measurement.md."""
    mfu = (
        6.0 * active_params * tokens_per_s_per_gpu / peak_flops
        if active_params and peak_flops
        else None
    )
    usd = None
    if usd_per_hour is not None and tokens_per_s_per_gpu > 0:
        usd = usd_per_hour / (tokens_per_s_per_gpu * gpus * 3600.0 / 1e6)
    return mfu, usd


def gpu_hours_from_timeline(
    timeline: RunTimeline, gpus: int, window_s: float | Sequence[float] | None = None
) -> tuple[float | None, str, dict[str, float]]:
    """GPU-hours = GPUs x (released_at - acquired_at) / 3600, plus where they went (stage_split).

    A run still held (released_at null) is counted up to its last recorded stage time, and the
    note says so: an open-ended figure would be a guess.
    """
    times = [t for s in timeline.stages for t in (s.start, s.end) if t is not None]
    last_seen = max(times) if times else None
    by_stage = {k: gpus * v / 3600.0 for k, v in stage_split(timeline, window_s).items()}
    acquired, released = timeline.acquired_at, timeline.released_at
    if acquired is None:
        return None, "timeline has no acquired_at: no GPU-hours", by_stage
    if released is not None and released < acquired:
        return None, "timeline's released_at is before its acquired_at: no GPU-hours", by_stage
    if released is not None:
        return (
            gpus * (released - acquired) / 3600.0,
            "GPUs x (node acquired to node released), from the run timeline, including startup",
            by_stage,
        )
    if last_seen is None:
        return (
            None,
            "timeline has no release time and no stage times: no GPU-hours",
            by_stage,
        )
    return (
        gpus * (last_seen - acquired) / 3600.0,
        "GPUs x (node acquired to last recorded stage time): release not recorded, "
        "so a lower bound",
        by_stage,
    )


def measured_date(records: Sequence[StepRecord]) -> str | None:
    """The UTC date of the last step (the recipe's `measured` is the date of the run)."""
    stamps = [r.timestamp for r in records if r.timestamp is not None]
    if not stamps:
        return None
    return datetime.fromtimestamp(max(stamps), tz=UTC).date().isoformat()


def _peak(
    recipe: Recipe, recs: dict[int, StepRecord], present: list[int]
) -> tuple[float | None, str | None]:
    """The GPU's dense bf16 peak from the catalog, else the one miles logged: (FLOP/s, source)."""
    spec = recipe.gpu_spec
    if spec is not None and spec.peak_bf16_flops:
        return spec.peak_bf16_flops, f"dense bf16 peak of {spec.name} SXM"
    logged = [t for t in (recs[s].logged_peak_tflops for s in present) if _finite(t)]
    if logged:
        return logged[0] * 1e12, "perf/mfu_peak_tflops as logged by miles"
    return None, None


def _recipe_notes(recipe: Recipe, window: tuple[int, int], tokens_per_step: int) -> list[str]:
    """The recipe's consistency with itself, as far as the figures depend on it."""
    first, last = window
    claim = recipe.claim
    notes: list[str] = []
    steps = last - first + 1
    expected_window_tokens = steps * tokens_per_step
    claimed_wt = claim.window_tokens
    if claimed_wt is not None and claimed_wt != expected_window_tokens:
        notes.append(
            f"recipe inconsistent: result.window_tokens {claimed_wt} != {steps} steps x "
            f"{tokens_per_step} tokens = {expected_window_tokens}"
        )
    steps_expected = claim.steps_per_run
    if steps_expected is not None and steps_expected <= last:
        notes.append(
            f"recipe inconsistent: steps_per_run {steps_expected} does not cover window end {last}"
        )
    return notes


def measure(
    records: Iterable[StepRecord],
    recipe: Recipe,
    *,
    timeline: RunTimeline | None = None,
    price_per_hour: float | None = None,
    region: str | None = None,
    parse_stats: ParseStats | None = None,
    measured: str | None = None,
    price: Price | None = None,
    gpu_samples: GpuSamples | None = None,
    host: HostWatch | None = None,
) -> Result:
    """Compute the recipe's `result` figures from parsed steps. Pure: no I/O.

    `gpu_samples`: the host's samples of the node's GPUs (the evidence gate's check 7); None
    where the run has no sampler file. `host`: whether the run was launched with the host's clock
    and sampler on (then their evidence is owed: launcher/judge/evidence.py, HostWatch).

    `price` is the price the run used (run.json's, decided once when it started); without it,
    `price_per_hour` (--price-per-hour) or the catalog's for `region` prices the $ figure."""
    hardware, workload = recipe.hardware, recipe.workload
    gpus = _require(hardware.count, "gpu.count")
    row_tokens = _require(workload.row_tokens, "workload.row_tokens")
    tokens_per_step = _require(workload.global_batch, "workload.global_batch") * row_tokens
    first, last = recipe_window(recipe)
    notes = _recipe_notes(recipe, (first, last), tokens_per_step)

    recs: dict[int, StepRecord] = {}
    for rec in records:
        recs.setdefault(rec.step, rec)
    steps = sorted(recs)
    window_steps = list(range(first, last + 1))
    present = [
        s
        for s in window_steps
        if s in recs and _finite(recs[s].step_time) and (recs[s].step_time or 0.0) > 0
    ]
    missing = [s for s in window_steps if s not in present]
    nan_loss = [s for s in steps if recs[s].loss is not None and not _finite(recs[s].loss)]
    nan_time = [
        s for s in steps if recs[s].step_time is not None and not _finite(recs[s].step_time)
    ]
    no_loss = [s for s in present if recs[s].loss is None]

    times = [recs[s].step_time or 0.0 for s in present]
    window_tokens = len(present) * tokens_per_step
    tps = cv = mean = std = None
    if times:
        total = sum(times)
        tps = window_tokens / total / gpus
        mean = total / len(times)
        std = statistics.pstdev(times) if len(times) > 1 else 0.0
        cv = 100.0 * std / mean

    peak, peak_source = _peak(recipe, recs, present)
    active = recipe.active_params
    if active is None:
        notes.append("no MFU: recipe gives no result.active_params.count")
    elif peak is None:
        gpu_type = hardware.type or ""
        notes.append(f"no MFU: no known peak for GPU type {gpu_type!r}")

    instance = catalog.instance_type_of(hardware.instance)
    if price is None or price_per_hour is not None:
        price = catalog.price_per_hour(instance, region, price_per_hour)
    if price is None:
        notes.append(
            f"no $/1M tokens: no price known for instance {instance!r}; pass --price-per-hour"
        )
    # The price is per node (instance); a multi-node recipe pays it once per node.
    per_node = hardware.per_node
    nodes = max(1, -(-gpus // per_node)) if per_node is not None and per_node > 0 else 1
    if price is not None and nodes > 1:
        notes.append(f"$/1M tokens priced for {nodes} nodes: {nodes} x ${price.value:g}/h")

    mfu = usd = None
    if tps is not None:
        mfu, usd = pure_figures(
            tps,
            gpus=gpus,
            active_params=active,
            peak_flops=peak,
            usd_per_hour=price.value * nodes if price else None,
        )

    evidence = gather(recipe, recs, present, parse_stats, gpu_samples, host)
    megatron = per_token(parse_stats.arguments if parse_stats else {}, row_tokens)
    megatron_mfu = (
        megatron.flops_per_token * tps / peak
        if megatron.flops_per_token is not None and tps is not None and peak
        else None
    )

    gpu_hours = None
    gpu_hours_source = "no run timeline: no GPU-hours"
    by_stage: dict[str, float] = {}
    failed, failed_after = failed_stages(timeline or RunTimeline())
    if timeline is not None and timeline.recorded:
        gpu_hours, gpu_hours_source, by_stage = gpu_hours_from_timeline(
            timeline, gpus, sum(times) if times else None
        )

    expected = recipe.claim.steps_per_run
    noise = 2.0 * cv / math.sqrt(len(times)) if cv is not None and len(times) > 1 else None
    findings = find_failures(recs, parse_stats, expected, first)
    return Result(
        tokens_per_s_per_gpu=tps,
        step_time_cv_percent=cv,
        mfu=mfu,
        usd_per_million_tokens=usd,
        window=(first, last),
        window_tokens=window_tokens,
        tokens_per_step=tokens_per_step,
        gpus=gpus,
        steps_parsed=len(steps),
        steps_expected=expected,
        last_step=steps[-1] if steps else None,
        window_steps_present=present,
        missing_window_steps=missing,
        nan_loss_steps=nan_loss,
        nan_step_time_steps=nan_time,
        mean_step_time_s=mean,
        std_step_time_s=std,
        active_params=active,
        peak_flops=peak,
        peak_source=peak_source,
        price=price,
        gpu_hours=gpu_hours,
        gpu_hours_source=gpu_hours_source,
        gpu_hours_by_stage=by_stage,
        gpu_hours_overlapped={
            part: {k: gpus * v / 3600.0 for k, v in work.items()}
            for part, work in stage_work(timeline or RunTimeline()).items()
        },
        window_gpu_hours=(gpus * sum(times) / 3600.0) if times else None,
        failed_stages=failed,
        failed_after_training=failed_after,
        no_loss_window_steps=no_loss,
        notes=notes,
        cross_checks=evidence.cross,
        parse_stats=parse_stats.to_dict() if parse_stats else None,
        measured=measured,
        evidence=evidence,
        findings=findings,
        noise_band_percent=noise,
        megatron_flops_per_token=megatron.flops_per_token,
        megatron_mfu=megatron_mfu,
        megatron_note=megatron.reason,
        unreadable=unreadable(recs, parse_stats, failed, findings),
    )


_UNPACK = {"gzip": "gunzip", "zstd": "zstd -d", "bzip2": "bunzip2", "xz": "unxz"}


def unreadable(
    recs: dict[int, StepRecord],
    stats: ParseStats | None,
    failed_stages: list[str],
    findings: Findings,
) -> str | None:
    """Why the log cannot be read as miles' (None when it can): nothing in it was recognised,
    or its steps carry no step time at all. A run whose stage failed, or whose log shows training
    failing (an OOM at step 0 leaves a step with no step time), is judged failed instead: its log
    was read, and ends before training logged what would be measured."""
    if failed_stages or findings.failed or stats is None:
        return None
    if not recs and not stats.recognised and stats.packed:
        what = (
            f"it is {stats.packed}-compressed data, not text (decompress it first, e.g. "
            f"{_UNPACK.get(stats.packed, 'with its tool')}, and measure the text)"
        )
    elif not recs and not stats.recognised:
        what = "no line of it was recognised"
    elif (
        recs
        and all(r.step_time is None for r in recs.values())
        and (stats.train_perf_lines == 0 or stats.no_step_time)
    ):
        half = "; ".join(stats.half_read_examples[:2])
        what = (
            f"its {len(recs)} step(s) carry no step time (no train `perf` dict with a step time "
            "this launcher knows: perf/step_time, perf/total_train_time, or perf/train_wait_time "
            "+ perf/train_time)" + (f": {half}" if half else "")
        )
    else:
        return None
    shown = "; ".join(repr(line) for line in stats.first_lines) or "(the log is empty)"
    examples = "; ".join(repr(e) for e in stats.unparseable_examples[:3])
    bad = f" {stats.unparseable} metric line(s) did not parse: {examples}." if examples else ""
    return (
        f"not a log this launcher can read: {what}. Expected {EXPECTED_LINES}. It has "
        f"{stats.lines} line(s); the first: {shown}.{bad}"
    )
