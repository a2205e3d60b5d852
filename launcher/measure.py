"""StepRecords + the recipe + the run timeline -> the recipe's `result` figures, computed its way.

Why each formula is what it is: measurement.md. Every formula here reproduces the seed recipe's
own figures from its own inputs (tests/test_measure.py shows it), so a reproduction and a claim
can be compared number to number. Measurement is a pure function: re-running it on a saved run
directory gives the same answer.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path

from launcher import prices
from launcher.errors import BadInput
from launcher.parse.miles import ParseStats, StepRecord
from launcher.prices import Price, instance_type_of

# Dense bf16 peak per GPU (FLOP/s). 989 TFLOP/s is NVIDIA's H100/H200 SXM figure and the value
# miles logs as perf/mfu_peak_tflops.
PEAK_FLOPS_BF16: dict[str, float] = {"H100": 989e12, "H200": 989e12}
MFU_FORMULA = "6 x N_active x tokens/s per GPU / peak (no attention term)"
STD_KIND = "population"
# A step-time from timestamps that differs from perf/step_time by more than this is reported.
CROSS_CHECK_TOLERANCE = 0.05


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
    window_gpu_hours: float | None = None
    failed_stages: list[str] = field(default_factory=list)
    no_loss_window_steps: list[int] = field(
        default_factory=list
    )  # a step time but no `step N:` line
    notes: list[str] = field(default_factory=list)
    cross_checks: dict = field(default_factory=dict)
    parse_stats: dict | None = None
    measured: str | None = None

    @property
    def ended_early(self) -> bool:
        """True when the log stops before the recipe's last step."""
        if self.steps_expected is None:
            return False
        return self.last_step is None or self.last_step < self.steps_expected - 1

    def _mfu_note(self) -> str:
        if self.mfu is None:
            return (
                "; ".join(n for n in self.notes if n.startswith("no MFU"))
                or "no MFU: no throughput"
            )
        return f"{MFU_FORMULA}; peak {self.peak_flops / 1e12:g} TFLOP/s ({self.peak_source})"

    def to_result_yaml(self) -> dict:
        """The recipe's `result` block shape (same keys, same rounding), plus provenance."""
        out: dict = {
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
            "runs": 1,
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
                "window_gpu_hours": self.window_gpu_hours,
                "steps_parsed": self.steps_parsed,
                "missing_window_steps": self.missing_window_steps,
                "nan_loss_steps": self.nan_loss_steps,
                "cross_checks": self.cross_checks,
                "notes": self.notes,
                "parse": self.parse_stats,
            },
        }
        return out

    def to_dict(self) -> dict:
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
            "window": list(self.window),
            "window_tokens": self.window_tokens,
            "steps_parsed": self.steps_parsed,
            "last_step": self.last_step,
            "missing_window_steps": self.missing_window_steps,
            "nan_loss_steps": self.nan_loss_steps,
            "mean_step_time_s": self.mean_step_time_s,
            "cross_checks": self.cross_checks,
            "notes": self.notes,
            "parse": self.parse_stats,
        }


def _round(value: float | None, digits: int) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _require(raw: dict, *keys: str):
    node = raw
    for key in keys:
        if not isinstance(node, dict) or key not in node or node[key] is None:
            raise BadInput(f"recipe has no {'.'.join(keys)}: cannot measure against it.")
        node = node[key]
    return node


def recipe_window(recipe_raw: dict) -> tuple[int, int]:
    """result.window as an inclusive (first, last) step pair; BadInput when malformed."""
    window = _require(recipe_raw, "result", "window")
    if not (
        isinstance(window, (list, tuple))
        and len(window) == 2
        and all(isinstance(w, int) for w in window)
    ):
        raise BadInput(f"recipe result.window must be [first, last] steps, got {window!r}.")
    first, last = window
    if first < 0 or last < first:
        raise BadInput(f"recipe result.window {window!r} is empty or negative.")
    return first, last


def pure_figures(
    tokens_per_s_per_gpu: float,
    *,
    gpus: int,
    active_params: int | None,
    peak_flops: float | None,
    usd_per_hour: float | None,
) -> tuple[float | None, float | None]:
    """(MFU, $ per 1M tokens) from a throughput: the two formulas of measurement.md, in one place."""
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
    timeline: dict, gpus: int
) -> tuple[float | None, str, dict[str, float], list[str]]:
    """GPU-hours = GPUs x (released_at - acquired_at) / 3600, plus the split per stage.

    A run still held (released_at null) is counted up to its last recorded stage time, and the
    note says so: an open-ended figure would be a guess.
    """
    by_stage: dict[str, float] = {}
    failed: list[str] = []
    last_seen = None
    for stage in timeline.get("stages") or []:
        start, end = stage.get("start"), stage.get("end")
        for t in (start, end):
            if isinstance(t, (int, float)):
                last_seen = t if last_seen is None else max(last_seen, t)
        if stage.get("status") == "failed":
            failed.append(str(stage.get("name")))
        if isinstance(start, (int, float)) and isinstance(end, (int, float)) and end >= start:
            name = str(stage.get("name"))
            by_stage[name] = by_stage.get(name, 0.0) + gpus * (end - start) / 3600.0
    acquired, released = timeline.get("acquired_at"), timeline.get("released_at")
    if not isinstance(acquired, (int, float)):
        return None, "timeline has no acquired_at: no GPU-hours", by_stage, failed
    if isinstance(released, (int, float)):
        return (
            gpus * (released - acquired) / 3600.0,
            "GPUs x (node acquired to node released), from the run timeline, including startup",
            by_stage,
            failed,
        )
    if last_seen is None:
        return (
            None,
            "timeline has no release time and no stage times: no GPU-hours",
            by_stage,
            failed,
        )
    return (
        gpus * (last_seen - acquired) / 3600.0,
        "GPUs x (node acquired to last recorded stage time): release not recorded, so a lower bound",
        by_stage,
        failed,
    )


def measure(
    records: Iterable[StepRecord],
    recipe_raw: dict,
    *,
    timeline: dict | None = None,
    price_per_hour: float | None = None,
    region: str | None = None,
    parse_stats: ParseStats | None = None,
    measured: str | None = None,
) -> Result:
    """Compute the recipe's `result` figures from parsed steps. Pure: no I/O."""
    gpus = int(_require(recipe_raw, "gpu", "count"))
    global_batch = int(_require(recipe_raw, "workload", "global_batch"))
    row_tokens = int(_require(recipe_raw, "workload", "row_tokens"))
    first, last = recipe_window(recipe_raw)
    claim = recipe_raw.get("result") or {}
    tokens_per_step = global_batch * row_tokens
    notes: list[str] = []

    recs: dict[int, StepRecord] = {}
    for rec in records:
        recs.setdefault(rec.step, rec)
    steps = sorted(recs)
    window_steps = list(range(first, last + 1))
    present = [
        s
        for s in window_steps
        if s in recs and _finite(recs[s].step_time) and recs[s].step_time > 0
    ]
    missing = [s for s in window_steps if s not in present]
    nan_loss = [s for s in steps if recs[s].loss is not None and not math.isfinite(recs[s].loss)]
    nan_time = [
        s for s in steps if recs[s].step_time is not None and not math.isfinite(recs[s].step_time)
    ]
    no_loss = [s for s in present if recs[s].loss is None]

    # Recipe self-consistency: window_tokens must equal window length x tokens per step.
    expected_window_tokens = len(window_steps) * tokens_per_step
    claimed_wt = claim.get("window_tokens")
    if claimed_wt is not None and claimed_wt != expected_window_tokens:
        notes.append(
            f"recipe inconsistent: result.window_tokens {claimed_wt} != {len(window_steps)} steps x "
            f"{tokens_per_step} tokens = {expected_window_tokens}"
        )
    steps_expected = claim.get("steps_per_run")
    if isinstance(steps_expected, int) and steps_expected <= last:
        notes.append(
            f"recipe inconsistent: steps_per_run {steps_expected} does not cover window end {last}"
        )

    times = [recs[s].step_time for s in present]
    window_tokens = len(present) * tokens_per_step
    tps = cv = mean = std = None
    if times:
        total = sum(times)
        tps = window_tokens / total / gpus
        mean = total / len(times)
        std = statistics.pstdev(times) if len(times) > 1 else 0.0
        cv = 100.0 * std / mean

    # Peak: the GPU type's datasheet figure, else what miles logged.
    gpu_type = str((recipe_raw.get("gpu") or {}).get("type") or "")
    peak = PEAK_FLOPS_BF16.get(gpu_type.upper())
    peak_source = f"dense bf16 peak of {gpu_type} SXM" if peak else None
    if peak is None:
        logged = [
            recs[s].logged_peak_tflops for s in present if _finite(recs[s].logged_peak_tflops)
        ]
        if logged:
            peak, peak_source = logged[0] * 1e12, "perf/mfu_peak_tflops as logged by miles"
    active = (
        (claim.get("active_params") or {}).get("count")
        if isinstance(claim.get("active_params"), dict)
        else None
    )
    if active is None:
        notes.append("no MFU: recipe gives no result.active_params.count")
    elif peak is None:
        notes.append(f"no MFU: no known peak for GPU type {gpu_type!r}")

    instance = instance_type_of((recipe_raw.get("gpu") or {}).get("instance"))
    price = prices.price_per_hour(instance, region, price_per_hour)
    if price is None:
        notes.append(
            f"no $/1M tokens: no price known for instance {instance!r}; pass --price-per-hour"
        )

    # The price is per node (instance); a multi-node recipe pays it once per node.
    per_node = (recipe_raw.get("gpu") or {}).get("per_node")
    nodes = max(1, -(-gpus // int(per_node))) if isinstance(per_node, int) and per_node > 0 else 1
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

    # Cross-checks (reported, not used in the figures).
    cross: dict = {}
    stamped = [
        s
        for s in present
        if recs[s].timestamp is not None and (s - 1) in recs and recs[s - 1].timestamp is not None
    ]
    if stamped:
        deltas = [recs[s].timestamp - recs[s - 1].timestamp for s in stamped]
        logged = [recs[s].step_time for s in stamped]
        cross["timestamp_mean_step_time_s"] = sum(deltas) / len(deltas)
        cross["perf_mean_step_time_s"] = sum(logged) / len(logged)
        rel = (
            abs(cross["timestamp_mean_step_time_s"] - cross["perf_mean_step_time_s"])
            / cross["perf_mean_step_time_s"]
        )
        cross["timestamp_vs_perf_relative_difference"] = rel
        if rel > CROSS_CHECK_TOLERANCE:
            notes.append(
                f"cross-check: step times from timestamps ({cross['timestamp_mean_step_time_s']:.3f} s) and "
                f"perf/step_time ({cross['perf_mean_step_time_s']:.3f} s) differ by {100 * rel:.1f}%"
            )
    logged_tokens = [recs[s].tokens for s in present if recs[s].tokens is not None]
    if logged_tokens:
        mean_tokens = sum(logged_tokens) / len(logged_tokens)
        cross["logged_tokens_per_step_mean"] = mean_tokens
        rel = abs(mean_tokens - tokens_per_step) / tokens_per_step
        cross["logged_tokens_vs_recipe_relative_difference"] = rel
        if rel > CROSS_CHECK_TOLERANCE:
            notes.append(
                f"cross-check: miles logged {mean_tokens:.0f} tokens per step, the recipe implies "
                f"{tokens_per_step} (global_batch x row_tokens)"
            )

    gpu_hours = None
    gpu_hours_source = "no run timeline: no GPU-hours"
    by_stage: dict[str, float] = {}
    failed: list[str] = []
    if timeline:
        gpu_hours, gpu_hours_source, by_stage, failed = gpu_hours_from_timeline(timeline, gpus)

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
        steps_expected=steps_expected if isinstance(steps_expected, int) else None,
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
        window_gpu_hours=(gpus * sum(times) / 3600.0) if times else None,
        failed_stages=failed,
        no_loss_window_steps=no_loss,
        notes=notes,
        cross_checks=cross,
        parse_stats=parse_stats.to_dict() if parse_stats else None,
        measured=measured,
    )


# ---------------------------------------------------------------------------------------------
# Run directories


def find_logs(path: Path) -> list[Path]:
    """The logs to parse: the file itself, or a run dir's logs/train.log, else every logs/*.log."""
    if path.is_file():
        return [path]
    logs_dir = path / "logs" if (path / "logs").is_dir() else path
    train = logs_dir / "train.log"
    if train.is_file():
        return [train]
    found = sorted(p for p in logs_dir.glob("*.log") if p.is_file())
    if not found:
        raise BadInput(f"no log to measure in {path} (expected logs/train.log or logs/*.log).")
    return found


def parse_logs(paths: Sequence[Path]):
    """Parse one or more logs into (records, stats); steps found in several logs keep the first."""
    from launcher.parse.miles import ParseStats, parse_path

    stats = ParseStats()
    seen: dict[int, StepRecord] = {}
    for p in paths:
        for rec in parse_path(p, stats):
            seen.setdefault(rec.step, rec)
    return [seen[s] for s in sorted(seen)], stats


def load_timeline(run_dir: Path) -> dict | None:
    """run_dir/timeline.json, or None when the run directory has none."""
    path = Path(run_dir) / "timeline.json"
    return read_timeline(path) if path.is_file() else None


def read_timeline(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadInput(f"timeline {path} does not exist.") from None
    except json.JSONDecodeError as err:
        raise BadInput(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path} is not a timeline object.")
    return data


def write_steps_jsonl(path: Path, records: Iterable[StepRecord]) -> None:
    with open(path, "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec.to_dict()) + "\n")


def measure_run_dir(
    run_dir: Path,
    recipe_raw: dict,
    *,
    price_per_hour: float | None = None,
    region: str | None = None,
    tolerance=None,
    write_plots: bool = True,
    reference: Path | None = None,
):
    """Measure a run directory and write its artifacts: steps.jsonl, result.yaml, verdict.json,
    report.md and plots/ (and convergence.json when a `reference` run dir or log is given).
    Returns (Result, Verdict). Called by the run path after collecting logs, and by
    `reproduce measure RUN_DIR`.
    """
    import yaml

    from launcher.report import write_report
    from launcher.verdict import judge

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BadInput(f"run directory {run_dir} does not exist.")
    records, stats = parse_logs(find_logs(run_dir))
    timeline = load_timeline(run_dir)
    result = measure(
        records,
        recipe_raw,
        timeline=timeline,
        price_per_hour=price_per_hour,
        region=region,
        parse_stats=stats,
        measured=_measured_date(records),
    )
    verdict = judge(
        result, recipe_raw, **({"tolerance": tolerance} if tolerance is not None else {})
    )
    convergence = None
    if reference is not None:
        from launcher.convergence import check, loss_curve

        convergence = check(loss_curve(records), loss_curve(load_records(reference)[0]))
        (run_dir / "convergence.json").write_text(
            json.dumps(json_safe(convergence.to_dict()), indent=2) + "\n"
        )
    write_steps_jsonl(run_dir / "steps.jsonl", records)
    (run_dir / "result.yaml").write_text(yaml.safe_dump(result.to_result_yaml(), sort_keys=False))
    (run_dir / "verdict.json").write_text(json.dumps(json_safe(verdict.to_dict()), indent=2) + "\n")
    write_report(run_dir, result, verdict, recipe_raw, records, convergence, plots=write_plots)
    return result, verdict


def _measured_date(records: Sequence[StepRecord]) -> str | None:
    """The UTC date of the last step (the recipe's `measured` is the date of the run)."""
    from datetime import datetime

    stamps = [r.timestamp for r in records if r.timestamp is not None]
    if not stamps:
        return None
    return datetime.fromtimestamp(max(stamps), tz=UTC).date().isoformat()


def load_records(path: Path) -> tuple[list[StepRecord], ParseStats | None]:
    """Steps of a run directory or a log file: parsed from the logs, else read from steps.jsonl."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"{path} does not exist.")
    if (
        path.is_dir()
        and not any((path / "logs").glob("*.log"))
        and (path / "steps.jsonl").is_file()
    ):
        with open(path / "steps.jsonl") as fh:
            return [StepRecord.from_dict(json.loads(line)) for line in fh if line.strip()], None
    return parse_logs(find_logs(path))


def load_recipe_raw(path: Path) -> dict:
    """The recipe as a raw mapping: through the lead's validating loader when present."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"recipe {path} does not exist.")
    try:
        from launcher.recipe import load_recipe
    except ImportError:
        load_recipe = None
    if load_recipe is not None:
        return load_recipe(path).raw
    import yaml

    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise BadInput(f"recipe {path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise BadInput(f"recipe {path} is not a mapping.")
    return raw


def measure_path(
    path: Path,
    recipe_raw: dict,
    *,
    price_per_hour: float | None = None,
    region: str | None = None,
    tolerance=None,
    timeline_path: Path | None = None,
):
    """Measure a log file (nothing written) or a run directory (its artifacts written)."""
    from launcher.verdict import judge

    path = Path(path)
    if not path.exists():
        raise BadInput(f"log {path} does not exist.")
    if path.is_dir():
        return measure_run_dir(
            path, recipe_raw, price_per_hour=price_per_hour, region=region, tolerance=tolerance
        )
    records, stats = parse_logs([path])
    timeline = read_timeline(timeline_path) if timeline_path is not None else None
    result = measure(
        records,
        recipe_raw,
        timeline=timeline,
        price_per_hour=price_per_hour,
        region=region,
        parse_stats=stats,
        measured=_measured_date(records),
    )
    verdict = judge(
        result, recipe_raw, **({"tolerance": tolerance} if tolerance is not None else {})
    )
    return result, verdict


def json_safe(value):
    """Non-finite floats become None so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
