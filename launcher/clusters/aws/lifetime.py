"""Each instance's own lifetime as AWS states it: what a run's node cost is measured by.

Why AWS's times and not the launcher's: a run's acquisition and release are the launcher's view,
and a node outlives them (a detached run, a `--keep` node, a cancel ended later by `down`, a node
that ended itself). AWS bills from the instance's LaunchTime to its termination, so those two
times, read from DescribeInstances wherever the launcher sees the instance (teardown waiting for
it to end, `runs|status --refresh`), are what the cost is computed from
(launcher/records/billing.py, `lifetime_cost`). A terminated instance's time is the one in its
StateTransitionReason ("User initiated (2026-12-07 14:22:23 GMT)"); without one, the first time
the launcher saw it terminated. Once every instance has both times the cost is frozen.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types_boto3_ec2.type_defs import DescribeInstancesResultTypeDef, InstanceTypeDef

KEY = "lifetimes"  # aws.json and the refresh file: {instance id: {launched_at, terminated_at}}
_REASON_TIME = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")


def _epoch(value: object) -> float | None:
    if isinstance(value, datetime):
        when = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return when.timestamp()
    return None


def ended_at(inst: InstanceTypeDef, seen: float) -> float:
    """When a terminated instance ended: its StateTransitionReason's time, else `seen`."""
    found = _REASON_TIME.search(str(inst.get("StateTransitionReason") or ""))
    if found:
        stamp = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        return min(stamp.timestamp(), seen)
    return seen


def note(known: dict[str, Any], inst: InstanceTypeDef, seen: float) -> None:
    """Fold what DescribeInstances says of `inst` into `known` (an aws.json's lifetimes): its
    launch time, and its end once it is terminated (a time once known is kept)."""
    iid = inst.get("InstanceId")
    if not isinstance(iid, str):
        return
    entry = dict(known.get(iid) or {})
    launched = _epoch(inst.get("LaunchTime"))
    if launched is not None:
        entry["launched_at"] = launched
    state = (inst.get("State") or {}).get("Name")
    if state == "terminated" and not isinstance(entry.get("terminated_at"), (int, float)):
        entry["terminated_at"] = ended_at(inst, seen)
    known[iid] = entry


def noted(
    response: DescribeInstancesResultTypeDef, known: dict[str, Any], seen: float
) -> dict[str, Any]:
    """`known` with every instance of a DescribeInstances page folded in (a new mapping)."""
    out = {k: dict(v) for k, v in known.items() if isinstance(v, dict)}
    for reservation in response.get("Reservations", []):
        for inst in reservation.get("Instances", []):
            note(out, inst, seen)
    return out
