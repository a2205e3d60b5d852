"""K measured runs in one run directory: each run's own record, then the verdict on their mean.

Why a module of its own: node.sh runs the recipe's run block K times, each one `train` stage
(launcher/plan/measured.py), so logs/train.log holds the K runs one after the other and the
timeline K `train` stages in order. A mean must never be computed from a log in which the runs
are mixed: each run is cut out of logs/node.log by its own stage markers and kept in
measured/<k>/ as a run directory's measurement in small:

    measured/<k>/logs/train.log   the lines of node.log's k-th train stage (the K files, one
                                  after the other, are logs/train.log byte for byte)
    measured/<k>/timeline.json    that stage alone: its start and end are the run's acquire
                                  and release, so its GPU-hours are its own training
    measured/<k>/steps.jsonl result.yaml verdict.json measure.json report.md plots/

Each run is measured and judged by launcher/results/evaluate.py exactly as one run is (the
evidence gate included); launcher/judge/aggregate.py then judges the mean, fail closed. Like
everything else in a run directory, measured/ is a function of node.log and timeline.json, so
`reproduce measure RUN_DIR` makes it again and reaches the same verdict.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from launcher.inputs.recipe import Recipe
from launcher.judge.aggregate import Run, judge_mean
from launcher.judge.measure import Result, gpu_hours_from_timeline
from launcher.judge.parse.records import StepRecord
from launcher.judge.split import failed_stages
from launcher.judge.timeline import RunTimeline, StageTimes
from launcher.judge.verdict import Tolerance, Verdict
from launcher.plan.markers import MAX_MARKER_LINE, SAFE_STAGE, MarkerGate
from launcher.records.atomic import write_atomic
from launcher.records.rundir import TRAIN_STAGE, Files

# A measured run's GPU-hours: its timeline is its train stage alone (run_timeline).
RUN_HOURS_NOTE = (
    "GPUs x this measured run's train stage (its start to its end): its own training; the "
    "reproduction's setup is counted once, in the run directory's result.yaml"
)
# What measures one run: (run k, its sub-directory, its timeline) -> its result, verdict, steps.
MeasureOne = Callable[[int, Path, RunTimeline], tuple[Result, Verdict, list[StepRecord]]]


def train_stages(timeline: RunTimeline | None) -> list[Mapping[str, Any]]:
    """The timeline's `train` stages in the order they ran, as written: the k-th is measured
    run k (its own timeline.json copies its stage as the run's file wrote it)."""
    stages = timeline.written.get("stages") if timeline is not None else None
    return [
        s
        for s in (stages if isinstance(stages, list) else [])
        if isinstance(s, dict) and StageTimes.of(s).name == TRAIN_STAGE
    ]


def _lines(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        yield from fh


def split_train(node_log: Path, into: Callable[[int], IO[bytes]]) -> int:
    """Write the lines of each `train` stage of node.log to into(k) (k = 1, 2, ...), by the rule
    of the log splitter (launcher/runner/stream.py): a line belongs to the innermost stage open
    when it was printed; marker lines belong to none. Returns how many train stages began."""
    open_stages: list[tuple[str, int]] = []  # (name, k for a train stage else 0)
    began = 0
    gate = MarkerGate()
    for line in _lines(node_log):
        marker = gate.marker(line.rstrip(b"\n")) if len(line) <= MAX_MARKER_LINE else None
        if marker is None:
            if open_stages and open_stages[-1][1]:
                into(open_stages[-1][1]).write(line)
            continue
        name = marker["stage"]
        if not SAFE_STAGE.match(name):
            continue
        if marker["event"] == "start":
            k = 0
            if name == TRAIN_STAGE:
                began += 1
                k = began
            open_stages.append((name, k))
        else:
            for i in range(len(open_stages) - 1, -1, -1):
                if open_stages[i][0] == name:
                    del open_stages[i]
                    break
    return began


def run_timeline(stage: Mapping[str, Any], index: int, of: int) -> dict[str, Any]:
    """Measured run k's timeline: its train stage alone, from its start to its end."""
    return {
        "acquired_at": stage.get("start"),
        "released_at": stage.get("end"),
        "release_started_at": stage.get("end"),
        "stages": [dict(stage)],
        "measured_run": {"run": index, "of": of, "from": f"train stage {index} of timeline.json"},
    }


def prepare(
    run_dir: Path, target: Path, timeline: RunTimeline | None
) -> list[tuple[int, Path, RunTimeline]]:
    """target/measured/<k>/ made afresh from run_dir's node.log and timeline: (k, dir, timeline)
    for each train stage that began."""
    stages = train_stages(timeline)
    root = Path(target) / Files.MEASURED
    if root.is_dir() and not root.is_symlink():
        shutil.rmtree(root)
    elif root.exists() or root.is_symlink():
        root.unlink()
    node_log = Path(run_dir) / Files.LOGS / Files.NODE_LOG
    handles: dict[int, IO[bytes]] = {}

    def into(k: int) -> IO[bytes]:
        if k not in handles:
            logs = Path(target) / Files.measured_run(k) / Files.LOGS
            logs.mkdir(parents=True, exist_ok=True)
            handles[k] = open(logs / f"{TRAIN_STAGE}.log", "ab")
        return handles[k]

    try:
        began = split_train(node_log, into) if node_log.is_file() else 0
    finally:
        for handle in handles.values():
            handle.close()
    count = min(began, len(stages)) if node_log.is_file() else 0
    out = []
    for k in range(1, count + 1):
        sub = Path(target) / Files.measured_run(k)
        (sub / Files.LOGS).mkdir(parents=True, exist_ok=True)
        (sub / Files.LOGS / f"{TRAIN_STAGE}.log").touch()  # a run that printed nothing
        tl = run_timeline(stages[k - 1], k, len(stages))
        write_atomic(sub / Files.TIMELINE, json.dumps(tl, indent=2) + "\n")
        out.append((k, sub, RunTimeline.of(tl)))
    return out


def measure_runs(
    run_dir: Path,
    target: Path,
    recipe: Recipe,
    *,
    expected: int,
    claimed: int,
    accepted: int | None,
    tolerance: Tolerance | None,
    timeline: RunTimeline | None,
    measure_one: MeasureOne,
) -> tuple[Result, Verdict, list[StepRecord]] | None:
    """Each measured run measured alone into target/measured/<k>/, then the mean judged; None
    when no train stage began (nothing was measured: the caller judges the empty log)."""
    pieces = prepare(run_dir, target, timeline)
    if not pieces:
        return None
    runs: list[Run] = []
    records: list[StepRecord] = []
    windows: list[float] = []
    for k, sub, tl in pieces:
        result, verdict, steps = measure_one(k, sub, tl)
        runs.append(Run(k, result, verdict, Files.measured_run(k)))
        records += steps
        windows.append(
            result.window_gpu_hours * 3600.0 / result.gpus if result.window_gpu_hours else 0.0
        )
    gpus = runs[0].result.gpus
    hours = None
    if timeline is not None and timeline.recorded:
        hours = gpu_hours_from_timeline(timeline, gpus, windows)
    mean, verdict = judge_mean(
        runs,
        recipe,
        expected=expected,
        claimed=claimed,
        accepted=accepted,
        tolerance=tolerance,
        gpu_hours=hours,
        stages=failed_stages(timeline or RunTimeline()),
    )
    return mean, verdict, records


def one_run_reason(index: int, expected: int) -> str:
    """The reason a measured run's own verdict carries: it is one of K."""
    return (
        f"measured run {index} of {expected}: judged alone; the reproduction is judged on the "
        f"mean of the runs (../../{Files.VERDICT})"
    )
