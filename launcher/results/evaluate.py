"""Measuring a run directory: the one place that reads logs and writes the measurement's files.

Why a module of its own: measure, verdict, convergence and report are pure (values in, values or
text out), so they are tested on hand-built inputs and give the same answer on a saved run; this
module is their only door to the file system. It finds and parses the logs, calls them in order
and writes what they produce:

    steps.jsonl        one parsed step per line (NaN and inf as strings)
    result.yaml        the recipe's `result` block as measured, with provenance
    verdict.json       status, signed difference, every reason
    convergence.json   only when a reference run is given
    measure.json       what the measurement read and with which parameters (its record: the
                       log's and recipe's sha256, the timeline as it was then, price, region,
                       tolerance, the policy's name and version), so that `reproduce verify`
                       can measure the same inputs again the same way (docs/attestation.md)
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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from launcher.catalog import Price
from launcher.clusters import trust
from launcher.errors import BadInput
from launcher.inputs.recipe import Recipe, load_recipe
from launcher.judge.assurance import Assurance, decide, weakest
from launcher.judge.convergence import ConvergenceResult, check, loss_curve
from launcher.judge.evidence import HostWatch
from launcher.judge.gate import LogEvidence, assess
from launcher.judge.measure import Result, measure, measured_date
from launcher.judge.parse.gpu import GpuSamples
from launcher.judge.parse.reader import parse_path
from launcher.judge.parse.records import ParseStats, StepRecord
from launcher.judge.timeline import RunTimeline
from launcher.judge.verdict import Tolerance, Verdict, judge
from launcher.pages import report
from launcher.records.atomic import write_atomic
from launcher.records.rundir import Files, dump_yaml
from launcher.results.measure_record import (
    _write_json,
    write_measure_record,
)
from launcher.results.readback import (
    host_watch,
    load_timeline,
    read_gpu_samples,
    read_steps,
    read_timeline,
    recorded_price,
    run_nonce,
)

RECIPE_FILE = Files.RECIPE  # the recipe as the run used it, kept in its run directory
RUN_FILE = Files.RUN  # what makes a directory a run directory
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


# The first bytes of packed files (each format's magic number), for naming an unreadable log.
_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2", b"\xfd7zXZ": "xz"}


def packed(head: bytes) -> str | None:
    """The packed format a file's first bytes name, or None."""
    return next((name for magic, name in _MAGIC.items() if head.startswith(magic)), None)


def parse_log(path: Path, nonce: str | None = None) -> tuple[list[StepRecord], ParseStats]:
    """One log's steps and the parser's counters (its arguments listing among them); `nonce`:
    the run's, whose host clock lines count (launcher/judge/parse/clock.py)."""
    stats = ParseStats()
    try:
        records = list(parse_path(path, stats, nonce))
        with open(path, "rb") as fh:
            stats.packed = packed(fh.read(6))
        return records, stats
    except OSError as err:
        raise BadInput(f"{path}: cannot read the log: {err.strerror}.") from None


def load_records(path: Path) -> tuple[list[StepRecord], ParseStats | None]:
    """Steps of a log file, or of a run directory (its logs/train.log, else its steps.jsonl)."""
    from launcher.plan.claimruns import measured_in

    path = check_input(path)
    if path.is_file():
        return parse_log(path)
    if measured_in(path) > 1:  # logs/train.log holds K runs one after the other: not one log
        raise BadInput(
            f"run directory {path} holds {measured_in(path)} measured runs; give one of them: "
            f"{path}/{Files.MEASURED}/<k>/{TRAIN_LOG}."
        )
    if (path / TRAIN_LOG).is_file():
        return parse_log(path / TRAIN_LOG, run_nonce(path))
    if (path / Files.STEPS).is_file():
        return read_steps(path / Files.STEPS), None
    raise BadInput(f"run directory {path} holds neither {TRAIN_LOG} nor steps.jsonl.")


def read_log(path: Path) -> LogEvidence:
    """A log file or a run directory read once, through the gate (launcher/judge/gate.py): what
    `compare` and a `--reference` use, so they see what `measure` sees."""
    records, stats = load_records(path)
    return assess(Path(path), records, stats, recipe_identity(Path(path)))


def reference_curve(path: Path) -> dict[int, float]:
    """The loss curve of a reference run; BadInput when the gate does not pass its log."""
    ref = read_log(path)
    if not ref.sound:
        raise BadInput(f"reference {path}: " + "; ".join(ref.problems()))
    return loss_curve(ref.records)


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
    from launcher.inputs.recipe import recipe_slug
    from launcher.inputs.yamlschema import read_yaml_mapping

    file = Path(path) / RECIPE_FILE
    if not (Path(path).is_dir() and file.is_file()):
        return None
    raw, _ = read_yaml_mapping(file, "recipe")
    return recipe_slug(raw)


def write_steps_jsonl(path: Path, records: Iterable[StepRecord]) -> None:
    write_atomic(path, "".join(json.dumps(rec.to_dict()) + "\n" for rec in records))


def write_report(
    run_dir: Path,
    result: Result,
    verdict: Verdict,
    recipe: Recipe,
    records: Sequence[StepRecord],
    convergence: ConvergenceResult | None = None,
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
            write_atomic(run_dir / "plots" / name, png)
            names.append(f"plots/{name}")
    path = run_dir / Files.REPORT_MD
    write_atomic(path, report.render_markdown(result, verdict, recipe, records, convergence, names))
    return path


def result_yaml(result: Result, verdict: Verdict) -> dict[str, Any]:
    """result.yaml's content: the result's figures and provenance, with the policy they were
    judged under. One function, so the file written and the one `verify` re-measures agree."""
    data = result.to_result_yaml()
    data["provenance"]["policy"] = verdict.policy
    return data


def remeasure(
    log: Path,
    recipe: Recipe,
    timeline: RunTimeline | None,
    *,
    price_per_hour: float | None = None,
    region: str | None = None,
    tolerance: Tolerance | None = None,
    runs: int | None = None,
    price: Price | None = None,
    nonce: str | None = None,
    gpu_samples: GpuSamples | None = None,
    host: HostWatch | None = None,
) -> tuple[list[StepRecord], Result, Verdict]:
    """Parse and judge one log exactly as a measurement does, writing nothing: `reproduce
    verify` checks an attested directory with it (measure into memory, never into the directory
    it checks), with the nonce the measurement recorded and the directory's GPU samples."""
    records, stats = parse_log(log, nonce)
    result, verdict = _judged(
        records,
        stats,
        recipe,
        timeline,
        price_per_hour,
        region,
        tolerance,
        runs,
        price=price,
        gpu_samples=gpu_samples,
        host=host,
    )
    return records, result, verdict


def _judged(
    records: list[StepRecord],
    stats: ParseStats | None,
    recipe: Recipe,
    timeline: RunTimeline | None,
    price_per_hour: float | None,
    region: str | None,
    tolerance: Tolerance | None,
    runs: int | None = None,
    price: Price | None = None,
    *,
    alone: bool = False,
    gpu_samples: GpuSamples | None = None,
    host: HostWatch | None = None,
) -> tuple[Result, Verdict]:
    """Measure and judge one run; `alone`: one of K measured runs, judged without the claim's
    result.runs (the mean of the K is judged by launcher/judge/aggregate.py)."""
    from launcher.plan import claimruns

    result = measure(
        records,
        recipe,
        timeline=timeline,
        price_per_hour=price_per_hour,
        region=region,
        parse_stats=stats,
        measured=measured_date(records),
        price=price,
        gpu_samples=gpu_samples,
        host=host,
    )
    verdict = judge(result, recipe, tolerance=tolerance)
    verdict.assurance = decide(result.evidence.checked, vouched=False)  # trust.mark: the kind's
    if alone:
        return result, verdict
    # the claim's result.runs against this one run (launcher/plan/claimruns.py)
    verdict = claimruns.apply(verdict, recipe, runs)
    verdict.assurance = decide(result.evidence.checked, vouched=False)
    return result, verdict


def write_outputs(
    out: Path,
    result: Result,
    verdict: Verdict,
    recipe: Recipe,
    records: Sequence[StepRecord],
    convergence: ConvergenceResult | None = None,
    *,
    plots: bool = True,
) -> None:
    """steps.jsonl, result.yaml, verdict.json, report.md, plots/ (and convergence.json) in `out`."""
    if convergence is not None:
        _write_json(out / Files.CONVERGENCE, convergence.to_dict())
    write_steps_jsonl(out / Files.STEPS, records)
    write_atomic(out / Files.RESULT, dump_yaml(result_yaml(result, verdict)))
    _write_json(out / Files.VERDICT, verdict.to_dict())
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
    runs: int | None = None,
    write_page: bool = True,
) -> tuple[Result, Verdict]:
    """Measure a run directory (its logs/train.log) and write its files there, or into `out`
    (steps.jsonl, result.yaml, verdict.json, report.md, plots/, and convergence.json when a
    `reference` run dir or log is given), and report.html in the run directory itself unless
    `write_page` is False: the runner writes the page once, at the very end of a run, so that it
    shows the release and the history row too (a page written here would be written again).

    `recipe` defaults to the run directory's own recipe.yaml; `runs` (--runs) to what the run
    was started with (plan.json). Returns (Result, Verdict).
    """
    from launcher.plan.claimruns import accepted_in, measured_in

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BadInput(f"run directory {run_dir} does not exist.")
    if not (run_dir / TRAIN_LOG).is_file():
        raise BadInput(f"run directory {run_dir} holds no {TRAIN_LOG}: nothing to measure.")
    recipe = recipe if recipe is not None else recipe_of(run_dir)
    measured = measured_in(run_dir)
    nonce, watch = run_nonce(run_dir), host_watch(run_dir)
    if runs is not None and measured > 1 and runs != measured:
        raise BadInput(
            f"--runs {runs}: run directory {run_dir} measured {measured} runs (plan.json "
            f"runs.measured); its verdict is on their mean: give no --runs, or --runs {measured}."
        )
    if runs is None:
        runs = accepted_in(run_dir)
    # The price the run used (run.json, decided once when it started) prices its $ figures,
    # offline too; --price-per-hour or --region given here price it anew.
    recorded = recorded_price(run_dir) if price_per_hour is None and region is None else None
    timeline = load_timeline(run_dir)
    target = out_dir(out) if out is not None else run_dir
    judged = None
    if measured > 1:  # K measured runs: each alone into measured/<k>/, the verdict on the mean
        judged = measure_k_runs(
            run_dir,
            target,
            recipe,
            measured,
            runs,
            timeline,
            (price_per_hour, region, tolerance, recorded),
            write_plots,
        )
    if judged is not None:
        result, verdict, records = judged
    else:
        records, stats = parse_log(run_dir / TRAIN_LOG, nonce)
        result, verdict = _judged(
            records,
            stats,
            recipe,
            timeline,
            price_per_hour,
            region,
            tolerance,
            runs,
            price=recorded,
            gpu_samples=read_gpu_samples(run_dir),
            host=watch,
        )
    kind = trust.run_kind(run_dir)
    trust.mark(verdict, kind)  # a cluster that vouched for its own checks says so
    convergence = None
    if reference is not None:
        convergence = check(loss_curve(records), reference_curve(reference))
    write_outputs(target, result, verdict, recipe, records, convergence, plots=write_plots)
    write_measure_record(
        target,
        log=run_dir / TRAIN_LOG,
        recipe=recipe,
        timeline=timeline,
        timeline_source=run_dir / Files.TIMELINE if timeline is not None else None,
        price_per_hour=price_per_hour,
        region=region,
        tolerance=tolerance,
        reference=reference,
        runs=runs,
        price=recorded,
        measured=measured,
        node_log=run_dir / Files.LOGS / Files.NODE_LOG,
        cluster=kind,
        nonce=nonce,
        host=watch,
    )
    if write_page:
        from launcher.pages import write_run_page

        if target == run_dir:
            write_run_page(run_dir)  # made from the files written above (docs/report.md)
        else:  # the same page: the measurement from `out`, the run's own record from the run dir
            write_run_page(target, also=run_dir)
    return result, verdict


def measure_k_runs(
    run_dir: Path,
    target: Path,
    recipe: Recipe,
    expected: int,
    accepted: int | None,
    timeline: RunTimeline | None,
    pricing: tuple[float | None, str | None, Tolerance | None, Price | None],
    write_plots: bool,
) -> tuple[Result, Verdict, list[StepRecord]] | None:
    """K measured runs (launcher/results/measured_runs.py): each measured here exactly as one
    run is, into target's measured/<k>/; the mean judged there. None: no train stage began.
    `verify` calls it too, into a scratch directory (launcher/results/attest_verify.py)."""
    from launcher.plan.claimruns import claimed_runs
    from launcher.results import measured_runs as mr

    price_per_hour, region, tolerance, price = pricing
    nonce = run_nonce(run_dir)  # each run's log is cut from run_dir's node.log
    samples = read_gpu_samples(run_dir)  # one sampler for the K runs: each its own span of it
    watch = host_watch(run_dir)
    levels: list[Assurance | None] = []

    def one(k: int, sub: Path, tl: RunTimeline) -> tuple[Result, Verdict, list[StepRecord]]:
        records, stats = parse_log(sub / TRAIN_LOG, nonce)
        result, verdict = _judged(
            records,
            stats,
            recipe,
            tl,
            price_per_hour,
            region,
            tolerance,
            price=price,
            alone=True,
            gpu_samples=samples,
            host=watch,
        )
        verdict.reasons.append(mr.one_run_reason(k, expected))
        levels.append(verdict.assurance)
        if result.gpu_hours is not None:
            result.gpu_hours_source = mr.RUN_HOURS_NOTE
        write_outputs(sub, result, verdict, recipe, records, plots=write_plots)
        write_measure_record(
            sub,
            log=sub / TRAIN_LOG,
            recipe=recipe,
            timeline=tl,
            timeline_source=sub / Files.TIMELINE,
            price_per_hour=price_per_hour,
            region=region,
            tolerance=tolerance,
            price=price,
            nonce=nonce,
            host=watch,
        )
        return result, verdict, records

    judged = mr.measure_runs(
        run_dir,
        target,
        recipe,
        expected=expected,
        claimed=claimed_runs(recipe),
        accepted=accepted,
        tolerance=tolerance,
        timeline=timeline,
        measure_one=one,
    )
    if judged is not None:  # the mean's evidence is as strong as its weakest run's
        judged[1].assurance = weakest(levels)
    return judged


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
    runs: int | None = None,
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
            runs=runs,
        )
    records, stats = parse_log(path)
    timeline = read_timeline(timeline_path) if timeline_path is not None else None
    result, verdict = _judged(
        records, stats, recipe, timeline, price_per_hour, region, tolerance, runs
    )
    if out is not None:
        target = out_dir(out)
        write_outputs(target, result, verdict, recipe, records)
        write_measure_record(
            target,
            log=path,
            recipe=recipe,
            timeline=timeline,
            timeline_source=timeline_path,
            price_per_hour=price_per_hour,
            region=region,
            tolerance=tolerance,
            runs=runs,
        )
        _write_log_page(target, recipe, timeline_path)
    return result, verdict


def _write_log_page(out: Path, recipe: Recipe, timeline_path: Path | None) -> None:
    """report.html for a measured log (`measure LOG --out DIR`): the page a run directory gets,
    from what DIR holds: the measurement, and the recipe and timeline it was measured with
    (copied byte for byte, unless DIR has its own)."""
    from launcher.pages import write_run_page

    if not (out / RECIPE_FILE).exists():
        write_atomic(out / RECIPE_FILE, recipe.text)
    if timeline_path is not None and not (out / Files.TIMELINE).exists():
        write_atomic(out / Files.TIMELINE, Path(timeline_path).read_bytes())
    write_run_page(out)
