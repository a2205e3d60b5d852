"""What is billing now: the nodes a run launched that still exist, and what they have cost so far.

Why this exists apart from a run's state: a run's state says how the *run* ended, not whether its
node did. A `--keep` run that failed, a launcher that died before its teardown finished, a run
left detached: each still has an instance at ~$63/h while its state says "failed" or
"detached". So `runs` and `status` ask, for every aws run, which instances it launched are not
known to be terminated:

- last known (no cloud call): aws.json (every instance the launch created, and the ones teardown
  saw terminated), or the answer of the last `--refresh`, whichever is newer; marked as such;
- from the cloud (`--refresh`, as `sky status -r`; launcher/clusters/aws/billing.py): one
  DescribeInstances per region for the run's instance ids; the answer is kept under
  $REPRODUCE_HOME/billing/<run id>.json, so the next plain `runs` shows it (with its time)
  instead of the older guess.

What an aws run's nodes cost is each instance's own lifetime as AWS states it, its LaunchTime to
its termination (launcher/clusters/aws/lifetime.py keeps both in aws.json and in the refresh
answer), times the price the run decided once (run.json `price`; else the cost gate's, run.json
`cost`): `lifetime_cost`. A node that still exists costs until now (a kept node bills after its
run's release); once every instance has ended the cost is frozen, whoever ended it and whenever
the run's own record stopped. Without AWS's times (an older record, a launcher killed before it
saw any) the cost runs from the run's acquisition, as before.
`cost_report` sums what every run cost, by recipe and by cluster profile.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from launcher.catalog import Price
from launcher.errors import BadInput
from launcher.records import jsonread
from launcher.records.rundir import Files, RunDir

# Every state in which an instance still exists (launcher/clusters/aws/live.py keeps the same list).
LIVE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")


@dataclass
class Billing:
    """A run's nodes that still exist (or are believed to), and their cost so far."""

    instances: dict[str, str]  # instance id -> state ("not terminated" when only believed)
    source: str  # "cloud" (asked at checked_at) or "last known" (aws.json / an older refresh)
    checked_at: float | None  # when the cloud said so; None: never asked
    region: str | None
    price_per_hour: float | None  # per node, as the cost gate showed it
    since: float | None  # the run's acquisition: the clock of what it costs
    cost_so_far: float | None

    @property
    def per_hour(self) -> float | None:
        if self.price_per_hour is None:
            return None
        return self.price_per_hour * len(self.instances)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["per_hour"] = self.per_hour
        return data

    def words(self) -> str:
        """`i-0abc running (AWS, just now)`, or the last known state marked as such."""
        nodes = ", ".join(f"{i} {s}" for i, s in sorted(self.instances.items()))
        if self.source == "cloud":
            return f"{nodes} (AWS, just now)"
        if self.checked_at is not None:
            when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.checked_at))
            return f"{nodes} (last known: AWS said so at {when}; `--refresh` asks again)"
        return f"{nodes} (last known, from aws.json: `--refresh` asks AWS)"


def refresh_path(run_id: str) -> Path:
    from launcher.records import state

    return state.home() / "billing" / f"{run_id}.json"


def aws_facts(rd: RunDir) -> tuple[list[str], str | None, float | None] | None:
    """The instances the run launched that aws.json does not say are terminated, its region,
    and when aws.json was last written; None when the run has no readable aws.json."""
    path = rd.path / Files.AWS
    try:
        data = jsonread.load_file(path)  # written on the node's behalf: bounded, never raised
        mtime = path.stat().st_mtime
    except (OSError, jsonread.NodeJSONError):
        return None
    if not isinstance(data, dict):
        return None
    ids = _texts(data.get("instances"))
    targeted, ended = set(_texts(data.get("targeted"))), set(_texts(data.get("terminated")))
    region = data.get("region") if isinstance(data.get("region"), str) else None
    return [i for i in ids if i not in targeted and i not in ended], region, mtime


def _texts(value: object) -> list[str]:
    """The texts of a list (anything else: none): aws.json read back is typed, not trusted."""
    return [i for i in value if isinstance(i, str)] if isinstance(value, list) else []


LIFETIMES = "lifetimes"  # launcher/clusters/aws/lifetime.py's KEY: named here, a layer below


def _lifetimes_in(data: object) -> dict[str, dict[str, float]]:
    """The lifetimes of an aws.json or a refresh answer, typed: {id: {launched_at, terminated_at}}
    with only finite numbers kept (a file read back is anyone's)."""
    found = data.get(LIFETIMES) if isinstance(data, dict) else None
    out: dict[str, dict[str, float]] = {}
    for iid, entry in (found if isinstance(found, dict) else {}).items():
        if not isinstance(iid, str) or not isinstance(entry, dict):
            continue
        times = {
            k: float(v)
            for k, v in entry.items()
            if k in ("launched_at", "terminated_at")
            and isinstance(v, (int, float))
            and not isinstance(v, bool)
            and v == v
            and abs(v) < 1e12
        }
        out[iid] = times
    return out


def known_lifetimes(rd: RunDir, run_id: str) -> dict[str, dict[str, float]]:
    """Every launch and end AWS stated for the run's instances: aws.json's (teardown saw them)
    and the last refresh's, a time once known kept."""
    try:
        own = jsonread.load_file(rd.path / Files.AWS)
    except jsonread.NodeJSONError:
        own = None
    merged = _lifetimes_in(own)
    for iid, times in _lifetimes_in(_refreshed(run_id)).items():
        entry = merged.setdefault(iid, {})
        for key, value in times.items():
            entry.setdefault(key, value)
    return merged


def lifetime_cost(
    rd: RunDir, run_id: str, price: float | None, alive: Iterable[str], now: float
) -> float | None:
    """The run's nodes' cost: sum of each launched instance's lifetime (AWS's LaunchTime to its
    termination; to `now` for one in `alive`) x `price` per node-hour. None when a launched
    instance's launch, or the end of one not alive, is not known: the caller then falls back."""
    if price is None:
        return None
    try:
        own = jsonread.load_file(rd.path / Files.AWS)
    except jsonread.NodeJSONError:
        return None
    if not isinstance(own, dict):
        return None
    targeted = set(_texts(own.get("targeted")))
    launched = [
        i for i in dict.fromkeys(_texts(own.get("instances")) + _texts(own.get("terminated")))
        if i not in targeted
    ]  # fmt: skip
    if not launched:
        return None
    times = known_lifetimes(rd, run_id)
    living = set(alive)
    seconds = 0.0
    for iid in launched:
        entry = times.get(iid, {})
        start = entry.get("launched_at")
        end = now if iid in living else entry.get("terminated_at")
        if start is None or end is None:
            return None
        seconds += max(0.0, end - start)
    return seconds / 3600.0 * price


def _refreshed(run_id: str) -> dict[str, Any] | None:
    try:
        data = jsonread.load_file(refresh_path(run_id))
    except jsonread.NodeJSONError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("instances"), dict):
        return None
    if not isinstance(data.get("checked_at"), (int, float)):
        return None
    return data


def last_known(rd: RunDir, now: float | None = None) -> Billing | None:
    """The run's nodes believed to exist, without asking the cloud; None when none is."""
    record = rd.record()
    if jsonread.Fields(record).obj("cluster").text("kind") != "aws":  # typed: anyone's file
        return None
    facts = aws_facts(rd)
    if facts is None:
        return None
    alive, region, written = facts
    instances = dict.fromkeys(alive, "not terminated")
    source, checked = "last known", None
    asked = _refreshed(str(record.get("run_id")))
    if asked is not None and (written is None or asked["checked_at"] >= written):
        instances = {str(i): str(s) for i, s in asked["instances"].items() if str(s) in LIVE_STATES}
        source, checked = "last known", float(asked["checked_at"])
    return billing_of(rd, record, instances, source, checked, region, now)


def billing_of(
    rd: RunDir,
    record: dict[str, Any],
    instances: dict[str, str],
    source: str,
    checked: float | None,
    region: str | None,
    now: float | None,
) -> Billing | None:
    """The Billing of `instances` (None when there are none), priced as `runs` prices the run:
    the price it decided once (run.json `price`), else the cost gate's (run.json `cost`)."""
    if not instances:
        return None
    now = time.time() if now is None else now
    recorded = Price.from_dict(record.get("price"))
    price = (
        recorded.value
        if recorded is not None
        else jsonread.Fields(record).obj("cost").raw("price_per_hour")
    )
    price = (
        float(price) if isinstance(price, (int, float)) and not isinstance(price, bool) else None
    )
    since = rd.timeline().acquired_at
    so_far = lifetime_cost(rd, str(record.get("run_id")), price, instances, now)
    if so_far is None and price is not None and since is not None:
        so_far = max(0.0, now - since) / 3600.0 * price * len(instances)
    return Billing(instances, source, checked, region, price, since, so_far)


# --- what was paid: `reproduce runs --cost` -----------------------------------------------------


@dataclass
class CostLine:
    key: str
    runs: int
    gpu_hours: float
    usd: float
    unpriced: int  # runs without a recorded price (their cost is unknown, not zero)
    billing: int  # runs whose node still exists (their cost is still growing)


def cost_report(summaries: Iterable[Any]) -> dict[str, Any]:
    """Per run, in total, by recipe and by cluster: what every run cost (so far, for one whose
    node still exists). `summaries`: RunSummary objects (launcher/records/runs.py)."""
    items = list(summaries)
    if not items:
        return {"runs": [], "total": asdict(_line("total", [])), "by_recipe": [], "by_cluster": []}

    def group(attr: str) -> list[dict[str, Any]]:
        keys = sorted({str(getattr(s, attr) or "-") for s in items})
        return [
            asdict(_line(k, [s for s in items if str(getattr(s, attr) or "-") == k])) for k in keys
        ]

    return {
        "runs": [
            {
                "run_id": s.run_id,
                "recipe": s.recipe,
                "cluster": s.target,
                "state": s.state,
                "gpu_hours": s.gpu_hours,
                "cost_usd": s.cost_usd,
                "billing": s.billing is not None,
            }
            for s in items
        ],
        "total": asdict(_line("total", items)),
        "by_recipe": group("recipe"),
        "by_cluster": group("target"),
    }


def _line(key: str, items: list[Any]) -> CostLine:
    return CostLine(
        key=key,
        runs=len(items),
        gpu_hours=sum(s.gpu_hours or 0.0 for s in items),
        usd=sum(s.cost_usd or 0.0 for s in items),
        unpriced=sum(s.cost_usd is None for s in items),
        billing=sum(s.billing is not None for s in items),
    )


def check_refresh_args(live: bool, refresh_asked: bool) -> None:
    if live and refresh_asked:
        raise BadInput("--refresh and --live: --live always asks AWS; give one of them.")
