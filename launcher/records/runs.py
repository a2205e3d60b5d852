"""What was run and what is running: every run directory under a runs root, read back.

Why from the run directories: they are the record (docs/architecture.md), written while a run is
followed, so `reproduce runs` and `reproduce status` need no server and no connection to a node,
and show runs of every recipe (the history is keyed by recipe and only holds finished runs). The
cost so far is the run's wall-clock node-hours since it was acquired, times the price the run
decided once and the cost gate showed (run.json `price` and `cost`, launcher/cost/costgate.py).
"""

from __future__ import annotations

import fcntl
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from launcher.catalog import Price
from launcher.errors import BadInput
from launcher.excerpt import open_regular
from launcher.inputs.recipe import Sections
from launcher.judge.timeline import RunTimeline
from launcher.records.billing import Billing, last_known, lifetime_cost
from launcher.records.jsonread import Fields
from launcher.records.plan_record import RecordedPlan
from launcher.records.result_record import RecordedResult
from launcher.records.rundir import FINAL_STATES, TRAIN_STAGE, Files, RunDir, read_yaml
from launcher.records.verdict_record import RecordedVerdict

TAIL_BYTES = 1 << 20  # the end of train.log read for the last step (a log may be gigabytes)


@dataclass
class RunSummary:
    """One run as `reproduce runs` lists it and `reproduce status` describes it."""

    run_id: str
    recipe: str
    target: str | None  # the cluster profile's name
    kind: str | None
    state: str
    verdict: str | None
    started_at: float | None  # acquired (or created, before that)
    ended_at: float | None
    elapsed_s: float | None  # since acquired: until released, or until now while it runs
    gpu_hours: float | None  # measured when judged, else wall-clock so far
    cost_usd: float | None  # so far (or in all, once released); None: no price recorded
    stage: str | None  # the stage running now (or the last one)
    step: int | None  # optimizer steps done (from train.log)
    steps_total: int | None
    detail: str | None
    run_dir: str
    logs: str
    followed: bool  # a reproduce process follows it now (holds its follow lock)
    # the nodes it launched that still exist (launcher/records/billing.py); None: nothing bills
    billing: Billing | None = None
    progress_from: str = "run directory"  # where step/stage were read ("node": its log now)
    price_per_hour: float | None = None  # one node, the price the run used
    price_source: str | None = None  # where that price came from (launcher.catalog.Price)
    # what its cluster vouched for itself (launcher/clusters/trust.py, a layer above this one:
    # the commands fill it in, `vouched`); None: the launcher held its boundary
    unverified: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["billing"] = self.billing.to_dict() if self.billing is not None else None
        return data

    @property
    def holds_node(self) -> bool:
        """Its node bills although no run is followed there: ended, detached, or unfollowed."""
        return self.billing is not None and (
            self.state in FINAL_STATES or self.state == "detached" or not self.followed
        )

    def with_billing(self, billing: Billing | None) -> RunSummary:
        """This summary with `billing` (a node still there costs until now, past the release)."""
        self.billing = billing
        if billing is not None and billing.cost_so_far is not None:
            self.cost_usd = max(self.cost_usd or 0.0, billing.cost_so_far)
        return self


def cluster_kind(record: Fields) -> str:
    return record.obj("cluster").text("kind") or ""


def run_dirs(root: Path) -> list[Path]:
    """Every run directory under the runs root (<root>/<recipe slug>/<run>/run.json), oldest
    first by name (run directory names start with their UTC start time)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((p.parent for p in root.glob("**/run.json")), key=lambda p: (p.name, str(p)))


def summarize(path: Path, now: float | None = None) -> RunSummary:
    """A run directory's summary; BadInput when it is not one (no run.json with a run id)."""
    rd = RunDir(Path(path))
    # every value typed (jsonread.Fields): a run directory copied in from anyone holds whatever
    # types at these keys, and a wrong one is that value missing, never an AttributeError
    record = Fields(rd.record())
    if not record.word("run_id"):
        raise BadInput(f"{path} is not a run directory (no run.json with a run_id).")
    now = time.time() if now is None else now
    status = Fields(rd.status())
    state = status.word("state") or "unknown"
    timeline = Fields(rd.read_json(Files.TIMELINE, {}))
    plan = RecordedPlan.of(rd.read_json(Files.PLAN, {}))
    verdict = RecordedVerdict.of(rd.read_json(Files.VERDICT, {}))
    cost = record.obj("cost")
    acquired = _num(timeline.raw("acquired_at"))
    released = _num(timeline.raw("released_at"))
    ended = released
    if ended is None and state in FINAL_STATES:
        ended = _num(status.raw("updated_at"))
    elapsed = None
    if acquired is not None:
        until = released if released is not None else (ended if ended is not None else now)
        elapsed = max(0.0, until - acquired)
    nodes = _count(cost.raw("nodes")) or _count(plan.nodes) or 1
    gpus = _count(cost.raw("gpus_per_node")) or _count(plan.gpus_per_node) or 0
    recorded = Price.from_dict(record.raw("price"))  # the price the run decided once
    price = recorded.value if recorded is not None else _num(cost.raw("price_per_hour"))
    price_source = recorded.describe() if recorded is not None else cost.text("price_source")
    measured = _measured_gpu_hours(rd)
    gpu_hours = measured
    if gpu_hours is None and elapsed is not None and gpus:
        gpu_hours = elapsed / 3600.0 * nodes * gpus
    usd = None if price is None or elapsed is None else elapsed / 3600.0 * nodes * price
    if cluster_kind(record) == "aws":  # the instances' own lifetimes, as AWS states them
        believed = last_known(rd, now)
        alive = believed.instances if believed is not None else {}
        by_aws = lifetime_cost(rd, record.word("run_id"), price, alive, now)
        usd = by_aws if by_aws is not None else usd
    step, total = train_progress(rd)
    cluster = record.obj("cluster")
    return RunSummary(
        run_id=record.word("run_id"),
        recipe=record.word("slug") or plan.slug or "?",
        target=plan.profile_name or cluster.text("kind"),
        kind=plan.profile_kind or cluster.text("kind"),
        state=state,
        verdict=verdict.status,
        started_at=acquired if acquired is not None else _num(record.raw("created_at")),
        ended_at=ended,
        elapsed_s=elapsed,
        gpu_hours=gpu_hours,
        cost_usd=usd,
        stage=current_stage(RunTimeline.of(timeline.mapping())),
        step=step,
        steps_total=total,
        detail=status.text("detail"),
        run_dir=str(rd.path),
        logs=str(rd.logs),
        followed=is_followed(rd.path),
        price_per_hour=price,
        price_source=str(price_source) if price_source else None,
    ).with_billing(last_known(rd, now))


def list_runs(root: Path, now: float | None = None) -> tuple[list[RunSummary], list[str]]:
    """Every run under the root, and a line for each directory that could not be read."""
    found, skipped = [], []
    for path in run_dirs(root):
        try:
            found.append(summarize(path, now))
        except BadInput as err:
            skipped.append(f"{path}: {err}")
    return found, skipped


def indexed_runs(root: Path | None, now: float | None = None) -> tuple[list[RunSummary], list[str]]:
    """Every run this user made: the user's index (launcher/records/state.py) and, when given, a
    runs root's run directories (one not yet indexed, e.g. made before the index existed), each
    run once, oldest first; and a line for each that could not be read."""
    from launcher.records import state

    paths: dict[Path, Path] = {}
    skipped: list[str] = []
    entries, bad = state.entries()
    skipped.extend(bad)
    for entry in entries:
        if entry.present:
            paths.setdefault(entry.run_dir.resolve(), entry.run_dir)
        else:
            skipped.append(
                f"{entry.run_id}: its run directory {entry.run_dir} is gone (index entry "
                f"{entry.source}; delete it to forget the run)"
            )
    for path in run_dirs(root) if root is not None else []:
        paths.setdefault(path.resolve(), path)
    found = []
    for path in paths.values():
        try:
            found.append(summarize(path, now))
        except BadInput as err:
            skipped.append(f"{path}: {err}")
    found.sort(key=lambda s: (s.started_at or 0.0, s.run_id))
    return found, skipped


def current_stage(timeline: RunTimeline) -> str | None:
    """The innermost stage still running, else the last stage that started."""
    stages = [s.name for s in timeline.stages if s.name]
    running = [s.name for s in timeline.stages if s.name and s.status == "running"]
    return running[-1] if running else (stages[-1] if stages else None)


def train_progress(rd: RunDir) -> tuple[int | None, int | None]:
    """(steps done, steps the recipe runs): the last step line of train.log's tail."""
    from launcher.judge.parse.lines import last_step

    log = rd.logs / f"{TRAIN_STAGE}.log"
    step = None
    try:
        with open_regular(log) as fh:  # never blocked by a FIFO, never through a link
            size = fh.seek(0, 2)
            fh.seek(max(0, size - TAIL_BYTES))
            last = last_step(fh.read(TAIL_BYTES))
            step = last + 1 if last is not None else None
    except OSError:
        pass
    return step, _steps_per_run(rd.path / Files.RECIPE)


def is_followed(path: Path) -> bool:
    """Does a reproduce process follow this run now? (It holds the run's follow lock.)"""
    lock = Path(path) / ".follow.lock"
    if not lock.exists():
        return False
    try:
        with open(lock, "rb") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
    except OSError:
        return False
    return False


def ended_message(rd: RunDir, record: dict[str, Any], status: dict[str, Any]) -> str:
    """What `reproduce cancel` says of a run that already ended: nothing was stopped."""
    state = status.get("state")
    when = _num(status.get("updated_at"))
    ago = f" {_ago(time.time() - when)} ago" if when is not None else ""
    detail = f" ({status['detail']})" if status.get("detail") else ""
    text = f"run {rd.path} had already ended{ago}: {state}{detail}; nothing was stopped."
    cluster = record.get("cluster") or {}
    if cluster.get("kind") == "aws" and cluster.get("keep"):
        text += f" Its instance was kept (--keep): `reproduce down {rd.path}` ends it."
    return text


def _ago(seconds: float) -> str:
    return duration(max(0.0, seconds))


def duration(seconds: float | None) -> str:
    """12s, 4m05s, 3h07m: the elapsed times of the listings."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _measured_gpu_hours(rd: RunDir) -> float | None:
    try:
        return RecordedResult.read(rd.path / Files.RESULT).rounded.get("gpu_hours")
    except BadInput:
        return None


def _steps_per_run(recipe_file: Path) -> int | None:
    try:
        raw = read_yaml(recipe_file)
    except BadInput:
        return None
    return Sections.of(raw).claim.steps_per_run if isinstance(raw, dict) else None


def _count(value: object) -> int | None:
    """A whole number of nodes or GPUs, >= 1 (a float that is one, too); None for anything else."""
    number = _num(value)
    return int(number) if number is not None and number >= 1 and number == int(number) else None


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
