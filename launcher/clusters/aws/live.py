"""`reproduce runs --live`: the instances this tool launched that still exist, asked of AWS by tag.

Why AWS and not the run directories: an instance outlives the launcher that started it (a crash,
a closed laptop, --keep), and a run directory on another machine is invisible here; every instance
the launcher launches carries its reproduce:run-id tag (launcher/clusters/aws/requests.py), so the
region itself says what is still billed. A targeted instance (--instance-id) is never tagged and
never listed. The cost so far is the on-demand price (launcher/catalog.py) times the time since
launch.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from boto3.session import Session
    from types_boto3_ec2.type_defs import InstanceTypeDef

# Every state in which an instance still exists; stopped ones bill their volumes only.
LIVE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")


@dataclass
class LiveInstance:
    instance_id: str
    instance_type: str
    state: str
    region: str
    run_id: str | None
    recipe: str | None
    owner: str | None
    launched_at: float | None
    expires_at: str | None
    uptime_s: float | None
    price_per_hour: float | None
    cost_usd: float | None  # since launch, on-demand (None: no price known)
    run_dir: str | None  # the run directory under this runs root, when there is one

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def live_instances(
    region: str,
    *,
    runs_root: Path | None = None,
    session: Session | None = None,
    now: float | None = None,
) -> list[LiveInstance]:
    """The launcher's instances in `region` that are not terminated, oldest first."""
    from launcher.clusters.aws import requests as rq
    from launcher.clusters.aws.session import make_session, translate

    session = make_session(region, session)
    ec2 = session.client("ec2", region_name=region)
    now = time.time() if now is None else now
    found: list[LiveInstance] = []
    try:
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": "tag-key", "Values": [rq.TAG_RUN_ID]},
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            ]
        )
        for page in pages:
            for reservation in page.get("Reservations", []):
                for inst in reservation.get("Instances", []):
                    found.append(_one(inst, region, now, runs_root))
    except Exception as err:  # noqa: BLE001 - botocore's errors, in the launcher's words
        mine = translate(err, f"listing the launcher's instances in {region}")
        if mine is err:
            raise
        raise mine from err
    return sorted(found, key=lambda i: (i.launched_at or 0.0, i.instance_id))


def _one(inst: InstanceTypeDef, region: str, now: float, runs_root: Path | None) -> LiveInstance:
    from launcher.catalog import instance
    from launcher.clusters.aws import requests as rq
    from launcher.records.rundir import RunDir

    tags = rq.tag_values(inst.get("Tags"))
    launched = inst.get("LaunchTime")
    at = launched.timestamp() if isinstance(launched, datetime) else None
    itype = str(inst.get("InstanceType", "?"))
    entry = instance(itype)
    prices = entry.on_demand_usd_per_hour if entry is not None else None
    price = (prices or {}).get(region)
    state = str((inst.get("State") or {}).get("Name", "?"))
    uptime = max(0.0, now - at) if at is not None else None
    run_id = tags.get(rq.TAG_RUN_ID)
    run_dir = None
    if run_id and runs_root is not None:
        hits = RunDir.existing(runs_root, run_id)
        run_dir = str(hits[0]) if len(hits) == 1 else None
    return LiveInstance(
        instance_id=str(inst.get("InstanceId", "?")),
        instance_type=itype,
        state=state,
        region=region,
        run_id=run_id,
        recipe=tags.get(rq.TAG_RECIPE),
        owner=tags.get(rq.TAG_OWNER),
        launched_at=at,
        expires_at=tags.get(rq.TAG_EXPIRES),
        uptime_s=uptime,
        price_per_hour=price,
        cost_usd=(uptime / 3600.0 * price) if uptime is not None and price else None,
        run_dir=run_dir,
    )
