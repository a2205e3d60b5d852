"""`reproduce reap`: what the launcher made, whose TTL has passed, of this owner, ended after it
was shown.

Why: a tag is a claim anyone in the account can write. A resource carrying `reproduce:run-id`
and a past `reproduce:expires-at` is not thereby the launcher's, nor the caller's: reap once
ended hand-made resources that carried those two tags, and alice's reap ended bob's kept run.
The promise, kept here (docs/aws.md, "Whose a resource is"): reap ends a resource only when

1. its expires-at has passed;
2. it carries a launch id (`reproduce:launch-id`, 12 hex) and its run id;
3. it is what that launch made, by a fact the tags alone do not give: an instance was launched
   with the launch's ClientToken (`reproduce-<launch id>-N`); a security group, key pair or
   placement group has the launch's name (`reproduce-<run id>-<launch id>`); an Elastic IP
   (which has no name) belongs to a launch that one of those, or the launcher's own record of
   the launch (its ledger, state.py), shows to be the launcher's;
4. its `reproduce:owner` is the caller's, unless `--all-owners`.

Everything else is listed as left alone, with why. What would end is listed before anything
ends; the caller confirms (the command asks at a terminal or takes --yes).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.clusters.aws import ownership
from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.session import make_session, translate
from launcher.clusters.aws.state import AwsState, launch_record, state_root
from launcher.clusters.aws.teardown import Log, safe, teardown
from launcher.errors import InfraError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from boto3.session import Session
    from types_boto3_ec2 import EC2Client
    from types_boto3_ec2.type_defs import FilterTypeDef, TagTypeDef

LAUNCH_ID = re.compile(r"[0-9a-f]{12}")
NAMED = {
    "security_group": "security group",
    "key_pair": "key pair",
    "placement_group": "placement group",
}


def _quiet(_line: str) -> None:
    return None


@dataclass
class Seen:
    """One resource the survey found under an expired `reproduce:expires-at`."""

    kind: str  # instances, addresses, security_group, key_pair, placement_group
    ident: str
    tags: dict[str, str]
    made_by_launch: bool | None  # True/False when a fact beside the tags says; None: no such fact
    record: dict[str, str | None] | None = None  # an Elastic IP's address record

    @property
    def words(self) -> str:
        return {"instances": "instance", "addresses": "Elastic IP"}.get(self.kind) or NAMED[
            self.kind
        ]


@dataclass
class ReapPlan:
    region: str
    runs: dict[tuple[str, str], AwsState] = field(default_factory=dict)
    owners: dict[tuple[str, str], str] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)  # "<resource>: why", never ended

    def listing(self) -> list[str]:
        """What would be ended, one line per launch."""
        return [
            f"run {run_id} (launch {launch_id}, owner {self.owners[(run_id, launch_id)]}): "
            + ", ".join(state.allocated())
            for (run_id, launch_id), state in sorted(self.runs.items())
        ]


def _expired(tags: dict[str, str], now: datetime) -> bool:
    when = tags.get(rq.TAG_EXPIRES)
    if not tags.get(rq.TAG_RUN_ID) or not when:
        return False
    try:
        at = datetime.strptime(when, rq.EXPIRES_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return False
    return at <= now


def survey(ec2: EC2Client, now: datetime) -> list[Seen]:
    """Every resource of the five kinds the launcher makes whose expires-at has passed."""
    has_expiry: list[FilterTypeDef] = [{"Name": "tag-key", "Values": [rq.TAG_EXPIRES]}]
    alive: list[FilterTypeDef] = [{"Name": "instance-state-name", "Values": ownership.LIVE_STATES}]
    seen: list[Seen] = []

    def keep(
        kind: str,
        ident: str,
        tags: Sequence[TagTypeDef] | None,
        made: bool | None,
        record: dict[str, str | None] | None = None,
    ) -> None:
        values = rq.tag_values(tags)
        if _expired(values, now):
            seen.append(Seen(kind, ident, values, made, record))

    for page in ec2.get_paginator("describe_instances").paginate(Filters=has_expiry + alive):
        for r in page["Reservations"]:
            for inst in r["Instances"]:
                launch = rq.tag_values(inst.get("Tags")).get(rq.TAG_LAUNCH, "")
                token = str(inst.get("ClientToken") or "")
                made = bool(launch) and token.startswith(f"reproduce-{launch}-")
                keep("instances", inst["InstanceId"], inst.get("Tags"), made)
    for addr in ec2.describe_addresses(Filters=has_expiry).get("Addresses", []):
        keep(
            "addresses",
            addr["AllocationId"],
            addr.get("Tags"),
            None,
            ownership.address_record(addr),
        )
    for group in ec2.describe_security_groups(Filters=has_expiry).get("SecurityGroups", []):
        keep("security_group", group["GroupId"], group.get("Tags"), _named(group, "GroupName"))
    for key in ec2.describe_key_pairs(Filters=has_expiry).get("KeyPairs", []):
        keep("key_pair", key["KeyName"], key.get("Tags"), _named(key, "KeyName"))
    for pg in ownership.placement_groups(ec2, has_expiry, strict=True):
        keep("placement_group", pg["GroupName"], pg.get("Tags"), _named(pg, "GroupName"))
    return seen


def _named(item: Mapping[str, Any], name_key: str) -> bool:
    tags = rq.tag_values(item.get("Tags"))
    run_id, launch = tags.get(rq.TAG_RUN_ID, ""), tags.get(rq.TAG_LAUNCH, "")
    return bool(launch) and item.get(name_key) == rq.resource_name(run_id, launch)


def reap_plan(seen: list[Seen], region: str, *, owner: str | None) -> ReapPlan:
    """The promise (module docstring) applied: what reap ends, and what it leaves, with why.
    OWNER None: every owner's (`--all-owners`)."""
    out = ReapPlan(region)
    anchored: set[tuple[str, str]] = set()
    for s in seen:
        key = (s.tags.get(rq.TAG_RUN_ID, ""), s.tags.get(rq.TAG_LAUNCH, ""))
        if s.made_by_launch and LAUNCH_ID.fullmatch(key[1]):
            anchored.add(key)
        record = launch_record(key[1]) if LAUNCH_ID.fullmatch(key[1]) else None
        if record is not None and record.get("run_id") == key[0]:
            anchored.add(key)
    for s in seen:
        run_id, launch_id = s.tags.get(rq.TAG_RUN_ID, ""), s.tags.get(rq.TAG_LAUNCH, "")
        who = s.tags.get(rq.TAG_OWNER, "")
        why = ""
        if not LAUNCH_ID.fullmatch(launch_id):
            why = f"no {rq.TAG_LAUNCH} of a launch: not made by the launcher"
        elif s.made_by_launch is False:
            why = (
                "not launched with the launch's ClientToken"
                if s.kind == "instances"
                else f"its name is not the launch's {rq.resource_name(run_id, launch_id)}"
            )
        elif (run_id, launch_id) not in anchored:
            why = (
                f"nothing else of launch {launch_id} is the launcher's (no instance of its "
                "ClientToken, no group or key pair of its name, no record of it here)"
            )
        elif owner is not None and who != owner:
            why = f"{rq.TAG_OWNER}={who or '(none)'}, not {owner} (--all-owners ends it)"
        if why:
            out.left.append(f"{s.words} {s.ident} (run {run_id or '?'}): {why}")
            continue
        state = out.runs.setdefault(
            (run_id, launch_id),
            AwsState(None, {"run_id": run_id, "launch_id": launch_id, "region": region}),
        )
        out.owners[(run_id, launch_id)] = who
        if s.kind == "instances":
            state.data["instances"].append(s.ident)
        elif s.kind == "addresses":
            state.data["addresses"].append(s.record)
        else:
            state.data[s.kind] = s.ident
    return out


def reap(
    region: str,
    *,
    owner: str | None,
    now: datetime | None = None,
    dry_run: bool = False,
    confirm: Callable[[ReapPlan], bool] | None = None,
    session: Session | None = None,
    log: Log = _quiet,
    poll_s: float = 5.0,
    key_dir: Path | None = None,
) -> list[str]:
    """End what `plan` allows (OWNER's, or every owner's when None) once CONFIRM agrees (None:
    agreed); return what ended (with DRY_RUN, what would). The list and what is left alone are
    logged first."""
    log = safe(log)
    now = now or datetime.now(UTC)
    session = make_session(region, session, nothing="`reproduce reap` ended nothing")
    ec2 = session.client("ec2", region_name=region)
    try:
        found = reap_plan(survey(ec2, now), region, owner=owner)
    except Exception as err:  # noqa: BLE001
        raise translate(err, f"listing the launcher's resources in {region}") from err
    for line in found.left:
        log(f"aws: left alone: {line}")
    if not found.runs:
        whose = "of anyone's" if owner is None else f"of {owner}'s"
        log(f"aws: nothing {whose} made by the launcher is past its expires-at in {region}")
        return []
    for line in found.listing():
        log(f"aws: {'would end' if dry_run else 'past its expires-at, to end:'} {line}")
    if dry_run:
        return [t for state in found.runs.values() for t in state.allocated()]
    if confirm is not None and not confirm(found):
        log("aws: nothing was ended")
        return []
    ended: list[str] = []
    left: list[str] = []
    for (run_id, launch_id), state in sorted(found.runs.items()):
        log(f"aws: ending run {run_id} (launch {launch_id}): {', '.join(state.allocated())}")
        left += teardown(
            ec2,
            state,
            log=log,
            poll_s=poll_s,
            key_dir=key_dir or state_root() / "keys",
            discover=False,
        )
        ended += list(state.data.get("ended", []))
    if left:
        raise InfraError(
            f"reap could not end: {', '.join(left)} (in {region}); run `reproduce reap` again "
            "or end them in the EC2 console."
        )
    return ended
