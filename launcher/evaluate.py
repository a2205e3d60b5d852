"""Measuring a run directory: the one place that reads logs and writes the measurement's files.

Why a module of its own: measure, verdict, convergence and report are pure (values in, values or
text out), so they are tested on hand-built inputs and give the same answer on a saved run; this
module is their only door to the file system. It finds and parses the logs, calls them in order
and writes what they produce:

    steps.jsonl        one parsed step per line (NaN and inf as strings)
    result.yaml        the recipe's `result` block as measured, with provenance
    verdict.json       status, signed difference, every reason
    convergence.json   only when a reference run is given
    report.md, plots/  claim beside reproduction, loss and step-time plots

The runner calls `measure_run_dir` once the logs are collected; `reproduce measure` calls
`measure_path`. docs/architecture.md shows the whole run directory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from launcher import report
from launcher.convergence import check, loss_curve
from launcher.errors import BadInput
from launcher.measure import Result, measure, measured_date
from launcher.parse.miles import ParseStats, StepRecord, parse_path
from launcher.recipe import Recipe, load_recipe
from launcher.verdict import Tolerance, Verdict, judge

RECIPE_FILE = "recipe.yaml"  # the recipe as the run used it, kept in its run directory


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


def parse_logs(paths: Sequence[Path]) -> tuple[list[StepRecord], ParseStats]:
    """Parse one or more logs into (records, stats); steps found in several logs keep the first."""
    stats = ParseStats()
    seen: dict[int, StepRecord] = {}
    for p in paths:
        for rec in parse_path(p, stats):
            seen.setdefault(rec.step, rec)
    return [seen[s] for s in sorted(seen)], stats


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


def read_timeline(path: Path) -> dict:
    """A timeline.json (the run's stage times, for GPU-hours); BadInput when unreadable."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadInput(f"timeline {path} does not exist.") from None
    except json.JSONDecodeError as err:
        raise BadInput(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path} is not a timeline object.")
    return data


def load_timeline(run_dir: Path) -> dict | None:
    """run_dir/timeline.json, or None when the run directory has none."""
    path = Path(run_dir) / "timeline.json"
    return read_timeline(path) if path.is_file() else None


def recipe_of(run_dir: Path) -> Recipe:
    """The recipe a run directory was run with (its recipe.yaml), validated."""
    path = Path(run_dir) / RECIPE_FILE
    if not path.is_file():
        raise BadInput(f"{run_dir} holds no {RECIPE_FILE}: give the recipe to measure against.")
    return load_recipe(path)


def json_safe(value: Any) -> Any:
    """Non-finite floats become None so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(json_safe(data), indent=2) + "\n")


def write_steps_jsonl(path: Path, records: Iterable[StepRecord]) -> None:
    with open(path, "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec.to_dict()) + "\n")


def write_report(
    run_dir: Path,
    result: Result,
    verdict: Verdict,
    recipe: Recipe,
    records: Sequence[StepRecord],
    convergence: Any = None,
    *,
    plots: bool = True,
) -> Path:
    """Write run_dir/report.md and run_dir/plots/*.png; return the report's path."""
    run_dir = Path(run_dir)
    names: list[str] = []
    if plots:
        step_time = report.claimed_step_time(result, recipe)
        (run_dir / "plots").mkdir(parents=True, exist_ok=True)
        for name, png in report.render_plots(records, result.window, step_time).items():
            (run_dir / "plots" / name).write_bytes(png)
            names.append(f"plots/{name}")
    path = run_dir / "report.md"
    path.write_text(report.render_markdown(result, verdict, recipe, records, convergence, names))
    return path


def _judged(
    records: list[StepRecord],
    stats: ParseStats | None,
    recipe: Recipe,
    timeline: dict | None,
    price_per_hour: float | None,
    region: str | None,
    tolerance: Tolerance | None,
) -> tuple[Result, Verdict]:
    result = measure(
        records,
        recipe,
        timeline=timeline,
        price_per_hour=price_per_hour,
        region=region,
        parse_stats=stats,
        measured=measured_date(records),
    )
    return result, judge(result, recipe, tolerance=tolerance)


def measure_run_dir(
    run_dir: Path,
    recipe: Recipe | None = None,
    *,
    price_per_hour: float | None = None,
    region: str | None = None,
    tolerance: Tolerance | None = None,
    write_plots: bool = True,
    reference: Path | None = None,
) -> tuple[Result, Verdict]:
    """Measure a run directory and write its files (steps.jsonl, result.yaml, verdict.json,
    report.md, plots/, and convergence.json when a `reference` run dir or log is given).

    `recipe` defaults to the run directory's own recipe.yaml. Returns (Result, Verdict).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BadInput(f"run directory {run_dir} does not exist.")
    recipe = recipe if recipe is not None else recipe_of(run_dir)
    records, stats = parse_logs(find_logs(run_dir))
    result, verdict = _judged(
        records, stats, recipe, load_timeline(run_dir), price_per_hour, region, tolerance
    )
    convergence = None
    if reference is not None:
        convergence = check(loss_curve(records), loss_curve(load_records(reference)[0]))
        _write_json(run_dir / "convergence.json", convergence.to_dict())
    write_steps_jsonl(run_dir / "steps.jsonl", records)
    (run_dir / "result.yaml").write_text(yaml.safe_dump(result.to_result_yaml(), sort_keys=False))
    _write_json(run_dir / "verdict.json", verdict.to_dict())
    write_report(run_dir, result, verdict, recipe, records, convergence, plots=write_plots)
    return result, verdict


def measure_path(
    path: Path,
    recipe: Recipe,
    *,
    price_per_hour: float | None = None,
    region: str | None = None,
    tolerance: Tolerance | None = None,
    timeline_path: Path | None = None,
) -> tuple[Result, Verdict]:
    """Measure a log file (nothing written) or a run directory (its files written)."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"log {path} does not exist.")
    if path.is_dir():
        return measure_run_dir(
            path, recipe, price_per_hour=price_per_hour, region=region, tolerance=tolerance
        )
    records, stats = parse_logs([path])
    timeline = read_timeline(timeline_path) if timeline_path is not None else None
    return _judged(records, stats, recipe, timeline, price_per_hour, region, tolerance)
