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
from typing import TYPE_CHECKING, Any

from launcher.clusters.aws import lifetime
from launcher.errors import BadInput
from launcher.records import jsonread
from launcher.records.atomic import write_atomic
from launcher.records.billing import (
    LIVE_STATES,
    Billing,
    aws_facts,
    billing_of,
    known_lifetimes,
    refresh_path,
)
from launcher.records.rundir import Files, RunDir

if TYPE_CHECKING:
    from collections.abc import Callable

    from boto3.session import Session
    from types_boto3_sts import STSClient


def refresh(
    run_dirs: Iterable[Path], *, session: Session | None = None, now: float | None = None
) -> dict[str, Billing | None]:
    """Ask EC2 about every aws run's instances (one call per region); keep each answer in the
    state directory. {run dir: Billing, or None when none of its instances exists}."""
    from launcher.clusters.aws.session import caller_account, make_session, translate

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
        _same_account(aws, region, runs, caller_account)
        ec2 = aws.client("ec2", region_name=region)
        states: dict[str, str] = {}
        lifetimes: dict[str, Any] = {}
        seen = time.time()
        try:
            pages = ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "instance-id", "Values": ids}]
            )
            for page in pages:
                lifetimes = lifetime.noted(page, lifetimes, seen)
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
            own = known_lifetimes(rd, str(rd.record().get("run_id")))
            for iid in found:  # a time once known is kept: AWS stops listing an ended one
                for key, value in lifetimes.get(iid, {}).items():
                    own.setdefault(iid, {}).setdefault(key, value)
            _keep_answer(str(rd.record().get("run_id")), region, checked, mine_now, own)
            live = {i: s for i, s in mine_now.items() if s in LIVE_STATES}
            out[str(rd.path)] = billing_of(rd, rd.record(), live, "cloud", checked, region, now)
    return out


def _same_account(
    aws: Session,
    region: str,
    runs: list[tuple[RunDir, list[str]]],
    ask: Callable[[STSClient, str], str],
) -> None:
    """Under another account's credentials EC2 lists none of a run's instances, which must never
    read as "terminated": a run whose aws.json records another account than these credentials'
    is refused (the rule `down` keeps, teardown.check_account), before EC2 is asked."""
    recorded = {str(rd.path): _recorded_account(rd) for rd, _ids in runs}
    if not any(recorded.values()):
        return
    account = ask(aws.client("sts", region_name=region), "asking which account may see the runs")
    other = {path: acc for path, acc in recorded.items() if acc and acc != account}
    if other:
        path, acc = sorted(other.items())[0]
        raise BadInput(
            f"{path}: its instances are in AWS account {acc}, and these credentials are account "
            f"{account}'s ({len(other)} run(s) so): EC2 would list none of them, which is not "
            "their end; nothing was refreshed.",
            hint=f"Refresh with account {acc}'s credentials (AWS_PROFILE=...).",
        )


def _recorded_account(rd: RunDir) -> str | None:
    try:  # written on the node's behalf: bounded, never raised
        data = jsonread.load_file(rd.path / Files.AWS)
    except (OSError, jsonread.NodeJSONError):
        return None
    account = data.get("account") if isinstance(data, dict) else None
    return account if isinstance(account, str) and account else None


def _keep_answer(
    run_id: str,
    region: str,
    checked: float,
    states: dict[str, str],
    lifetimes: dict[str, Any],
) -> None:
    """The cloud's answer for the next plain listing (best effort: a listing never fails on it),
    with each instance's launch and end as AWS stated them (its cost: lifetime.py)."""
    path = refresh_path(run_id)
    body = json.dumps(
        {"checked_at": checked, "region": region, "instances": states, lifetime.KEY: lifetimes},
        indent=2,
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(path, body + "\n", mode=0o600)
    except OSError:
        pass  # write_atomic removed its temporary file
