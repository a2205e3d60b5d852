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
    report.html        the same, as one self-contained page (launcher/pages/, docs/report.md)

The runner calls `measure_run_dir` once the logs are collected; `reproduce measure` calls
`measure_path`, which takes one log file or one run directory (a directory holding run.json) and
nothing else: a directory of assorted logs is not one run, and merging them would pick among
conflicting values without saying so. Outputs go to the run directory, or to the directory the
caller names for a bare log, never next to an arbitrary input. docs/architecture.md shows the
whole run directory.
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
from launcher.gate import LogEvidence, assess
from launcher.measure import Result, measure, measured_date
from launcher.parse.miles import ParseStats, StepRecord, parse_path
from launcher.recipe import Recipe, load_recipe
from launcher.verdict import Tolerance, Verdict, judge

RECIPE_FILE = "recipe.yaml"  # the recipe as the run used it, kept in its run directory
RUN_FILE = "run.json"  # what makes a directory a run directory
TRAIN_LOG = Path("logs") / "train.log"


def is_run_dir(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / RUN_FILE).is_file()


def check_input(path: Path) -> Path:
    """A log file or a run directory; BadInput naming what was given otherwise."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"{path} does not exist; expected a log file or a run directory.")
    if path.is_dir() and not is_run_dir(path):
        raise BadInput(
            f"{path} is a directory without {RUN_FILE}, so not a run directory; expected one "
            "log file (e.g. its logs/train.log) or a run directory made by `reproduce`."
        )
    if not path.is_dir() and not path.is_file():
        raise BadInput(f"{path} is not a regular file; expected a log file or a run directory.")
    return path


def parse_log(path: Path) -> tuple[list[StepRecord], ParseStats]:
    """One log's steps and the parser's counters (its arguments listing among them)."""
    stats = ParseStats()
    try:
        return list(parse_path(path, stats)), stats
    except OSError as err:
        raise BadInput(f"{path}: cannot read the log: {err.strerror}.") from None


def load_records(path: Path) -> tuple[list[StepRecord], ParseStats | None]:
    """Steps of a log file, or of a run directory (its logs/train.log, else its steps.jsonl)."""
    path = check_input(path)
    if path.is_file():
        return parse_log(path)
    if (path / TRAIN_LOG).is_file():
        return parse_log(path / TRAIN_LOG)
    if (path / "steps.jsonl").is_file():
        with open(path / "steps.jsonl") as fh:
            return [StepRecord.from_dict(json.loads(line)) for line in fh if line.strip()], None
    raise BadInput(f"run directory {path} holds neither {TRAIN_LOG} nor steps.jsonl.")


def read_log(path: Path) -> LogEvidence:
    """A log file or a run directory read once, through the gate (launcher/gate.py): what
    `compare` and a `--reference` use, so they see what `measure` sees."""
    records, stats = load_records(path)
    return assess(Path(path), records, stats, recipe_identity(Path(path)))


def reference_curve(path: Path) -> dict[int, float]:
    """The loss curve of a reference run; BadInput when the gate does not pass its log."""
    ref = read_log(path)
    if not ref.sound:
        raise BadInput(f"reference {path}: " + "; ".join(ref.problems()))
    return loss_curve(ref.records)


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


def recipe_identity(path: Path) -> str | None:
    """The slug of the recipe a run directory ran (from its recipe.yaml's content), or None for
    a bare log, which does not say. Read without validating: an old run's recipe may predate
    today's schema, and its identity is still its content."""
    from launcher.recipe import recipe_slug
    from launcher.yamlschema import read_yaml_mapping

    file = Path(path) / RECIPE_FILE
    if not (Path(path).is_dir() and file.is_file()):
        return None
    raw, _ = read_yaml_mapping(file, "recipe")
    return recipe_slug(raw)


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


def write_outputs(
    out: Path,
    result: Result,
    verdict: Verdict,
    recipe: Recipe,
    records: Sequence[StepRecord],
    convergence: Any = None,
    *,
    plots: bool = True,
) -> None:
    """steps.jsonl, result.yaml, verdict.json, report.md, plots/ (and convergence.json) in `out`."""
    if convergence is not None:
        _write_json(out / "convergence.json", convergence.to_dict())
    write_steps_jsonl(out / "steps.jsonl", records)
    data = result.to_result_yaml()
    data["provenance"]["policy"] = verdict.policy  # the rules the figures were judged under
    (out / "result.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    _write_json(out / "verdict.json", verdict.to_dict())
    write_report(out, result, verdict, recipe, records, convergence, plots=plots)


def measure_run_dir(
    run_dir: Path,
    recipe: Recipe | None = None,
    *,
    price_per_hour: float | None = None,
    region: str | None = None,
    tolerance: Tolerance | None = None,
    write_plots: bool = True,
    reference: Path | None = None,
    out: Path | None = None,
) -> tuple[Result, Verdict]:
    """Measure a run directory (its logs/train.log) and write its files there, or into `out`
    (steps.jsonl, result.yaml, verdict.json, report.md, plots/, and convergence.json when a
    `reference` run dir or log is given).

    `recipe` defaults to the run directory's own recipe.yaml. Returns (Result, Verdict).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BadInput(f"run directory {run_dir} does not exist.")
    if not (run_dir / TRAIN_LOG).is_file():
        raise BadInput(f"run directory {run_dir} holds no {TRAIN_LOG}: nothing to measure.")
    recipe = recipe if recipe is not None else recipe_of(run_dir)
    records, stats = parse_log(run_dir / TRAIN_LOG)
    result, verdict = _judged(
        records, stats, recipe, load_timeline(run_dir), price_per_hour, region, tolerance
    )
    convergence = None
    if reference is not None:
        convergence = check(loss_curve(records), reference_curve(reference))
    target = out_dir(out) if out is not None else run_dir
    write_outputs(target, result, verdict, recipe, records, convergence, plots=write_plots)
    if target == run_dir:
        from launcher.pages import write_run_page

        write_run_page(run_dir)  # made from the files written above (docs/report.md)
    return result, verdict


def out_dir(path: Path) -> Path:
    """The directory a measurement is written to, made when missing; BadInput when impossible."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise BadInput(f"--out {path} exists and is not a directory.") from None
    except OSError as err:
        raise BadInput(f"--out {path}: cannot make the directory: {err.strerror}.") from None
    return path


def measure_path(
    path: Path,
    recipe: Recipe,
    *,
    price_per_hour: float | None = None,
    region: str | None = None,
    tolerance: Tolerance | None = None,
    timeline_path: Path | None = None,
    out: Path | None = None,
) -> tuple[Result, Verdict]:
    """Measure a log file or a run directory (check_input). A run directory's files are written
    into it (or `out`); a log's only into `out`, and nowhere when no `out` is given."""
    path = check_input(path)
    if path.is_dir():
        if timeline_path is not None:
            raise BadInput("--timeline is for a log file; a run directory has its timeline.json.")
        return measure_run_dir(
            path,
            recipe,
            price_per_hour=price_per_hour,
            region=region,
            tolerance=tolerance,
            out=out,
        )
    records, stats = parse_log(path)
    timeline = read_timeline(timeline_path) if timeline_path is not None else None
    result, verdict = _judged(records, stats, recipe, timeline, price_per_hour, region, tolerance)
    if out is not None:
        write_outputs(out_dir(out), result, verdict, recipe, records)
    return result, verdict
