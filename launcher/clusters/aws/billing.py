"""What is billing, asked of the cloud (`reproduce runs|status --refresh`): one DescribeInstances
per region for the instances every aws run launched, the answer kept for the next plain listing.

Why apart from launcher/records/billing.py: that module reads what is known without a cloud call
(records layer); asking EC2 needs the AWS session (clusters layer), and the layering keeps the
records from importing up.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from launcher.records.atomic import write_atomic
from launcher.records.billing import LIVE_STATES, Billing, aws_facts, billing_of, refresh_path
from launcher.records.rundir import RunDir


def refresh(
    run_dirs: Iterable[Path], *, session: Any = None, now: float | None = None
) -> dict[str, Billing | None]:
    """Ask EC2 about every aws run's instances (one call per region); keep each answer in the
    state directory. {run dir: Billing, or None when none of its instances exists}."""
    from launcher.clusters.aws.session import make_session, translate

    wanted: dict[str, list[tuple[RunDir, list[str]]]] = {}
    for path in run_dirs:
        rd = RunDir(path)
        record = rd.record()
        if (record.get("cluster") or {}).get("kind") != "aws":
            continue
        facts = aws_facts(rd)
        if facts is None or not facts[0]:
            continue
        region = facts[1] or (record.get("cluster") or {}).get("region")
        if not region:
            continue
        wanted.setdefault(str(region), []).append((rd, facts[0]))
    out: dict[str, Billing | None] = {}
    for region, runs in wanted.items():
        ids = sorted({i for _rd, found in runs for i in found})
        aws = make_session(region, session, nothing="AWS was not asked (--refresh)")
        ec2 = aws.client("ec2", region_name=region)
        states: dict[str, str] = {}
        try:
            pages = ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "instance-id", "Values": ids}]
            )
            for page in pages:
                for reservation in page.get("Reservations", []):
                    for inst in reservation.get("Instances", []):
                        states[str(inst["InstanceId"])] = str(inst["State"]["Name"])
        except Exception as err:  # noqa: BLE001 - botocore's errors, in the launcher's words
            mine = translate(err, f"describing the runs' instances in {region}")
            if mine is err:
                raise
            raise mine from err
        checked = time.time() if now is None else now
        for rd, found in runs:
            mine_now = {i: states.get(i, "terminated") for i in found}  # not listed: long gone
            _keep_answer(str(rd.record().get("run_id")), region, checked, mine_now)
            live = {i: s for i, s in mine_now.items() if s in LIVE_STATES}
            out[str(rd.path)] = billing_of(rd, rd.record(), live, "cloud", checked, region, now)
    return out


def _keep_answer(run_id: str, region: str, checked: float, states: dict[str, str]) -> None:
    """The cloud's answer for the next plain listing (best effort: a listing never fails on it)."""
    path = refresh_path(run_id)
    body = json.dumps({"checked_at": checked, "region": region, "instances": states}, indent=2)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(path, body + "\n", mode=0o600)
    except OSError:
        pass  # write_atomic removed its temporary file
