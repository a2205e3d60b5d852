"""Which resources are this launch's: found by tag, and checked by tag before anything is ended.

Why: aws.json is a file in the run directory, and a file can say anything (the node can write
one, a run id can be reused, a crash can cut it short). So what teardown ends is decided by AWS's
own answer: a resource is this launch's only when it carries the run id and the launch id
(launcher/clusters/aws/requests.py, `foreign_because`). Whatever aws.json lists that does not is
refused and reported, never ended; whatever carries the tags but is missing from aws.json (a crash
between a create call and the state write) is found by tag and ended.

EC2 is eventually consistent: an instance just launched can be unknown to DescribeInstances and
TerminateInstances for a while (InvalidInstanceID.NotFound). Within CONSISTENCY_WINDOW_S of a
launch, "not found" means "not visible yet", never "gone"; see docs/aws.md, "Teardown".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.session import aws_said_no, error_code, translate
from launcher.clusters.aws.state import AwsState

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from types_boto3_ec2 import EC2Client
    from types_boto3_ec2.type_defs import (
        AddressTypeDef,
        FilterTypeDef,
        InstanceTypeDef,
        PlacementGroupTypeDef,
    )

Described = TypeVar("Described", bound="Mapping[str, Any]")  # a Describe call's item

CONSISTENCY_WINDOW_S = 120.0  # how long a just-launched instance may stay invisible
RECENT_S = 900.0  # a launch younger than this may still be invisible somewhere
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
Log = Callable[[str], Any]


NAME_KEYS = {
    "security_group": "GroupName",
    "key_pair": "KeyName",
    "placement_group": "GroupName",
}


def not_made_because(kind: str, item: Mapping[str, Any], run_id: str, launch_id: str | None) -> str:
    """Why ITEM (as a Describe call answers it) is not what launch LAUNCH_ID of RUN_ID made,
    by a fact beside its tags ('' when it is, or when no such fact exists: an Elastic IP has no
    name, and a launch id unknown leaves nothing to compare). Tags are a claim anyone in the
    account can write; an instance's ClientToken and a group's or key pair's name are set when
    it is made (requests.client_token, requests.resource_name)."""
    if not launch_id:
        return ""
    if kind == "instances":
        token = str(item.get("ClientToken") or "")
        if not token.startswith(f"reproduce-{launch_id}-"):
            return f"it was not launched with this launch's ClientToken (it has {token!r})"
        return ""
    name_key = NAME_KEYS.get(kind)
    if name_key is None:
        return ""
    want = rq.resource_name(run_id, launch_id)
    if item.get(name_key) != want:
        return f"its name is {item.get(name_key)!r}, not this launch's {want!r}"
    return ""


def not_found(err: BaseException) -> bool:
    return error_code(err).startswith("InvalidInstanceID.NotFound")


def launched_recently(state: AwsState) -> bool:
    """True while EC2 may not show this launch's instances everywhere yet."""
    at = state.data.get("launched_at")
    return isinstance(at, int | float) and time.time() - at < RECENT_S


def window_end(state: AwsState) -> float:
    """Until when (monotonic) 'not found' may still mean 'not visible yet'."""
    return time.monotonic() + (CONSISTENCY_WINDOW_S if launched_recently(state) else 0.0)


def discover(ec2: EC2Client, state: AwsState, log: Log, poll_s: float) -> None:
    """Add what AWS holds under this launch's tags but the state missed (a crash after a call).

    A RunInstances that got no answer (Ctrl-C, a dropped connection) may still have launched:
    then the search is repeated until its instances show up or the consistency window passes.
    """
    d = state.data
    run_id = d.get("run_id")
    if not run_id:
        return
    d["search_failed"] = None  # this search's own outcome: an error is never "nothing there"
    mine = rq.launch_filter(run_id, d.get("launch_id"))
    pending = bool(d.get("pending_launch"))
    until = time.monotonic() + (CONSISTENCY_WINDOW_S if pending else 0.0)
    if pending:
        log(
            "aws: a RunInstances call got no answer; looking for what it launched "
            f"(up to {CONSISTENCY_WINDOW_S:.0f} s)"
        )
    while True:
        found = _discover_instances(ec2, state, mine)
        if found or not pending or time.monotonic() >= until:
            break
        time.sleep(poll_s)
    if pending and not d.get("search_failed"):  # a failed search keeps it for the next one
        d["pending_launch"] = None
        if not found:
            log(f"aws: nothing it launched appeared within {CONSISTENCY_WINDOW_S:.0f} s")
    try:
        _discover_the_rest(ec2, state, mine)
    except Exception as err:  # noqa: BLE001 - discovery is a net; what the state names still ends
        if not aws_said_no(err):
            raise
        if error_code(err) in ("AuthFailure", "UnauthorizedOperation"):
            raise translate(err, "finding the run's resources") from err
        d["search_failed"] = f"{error_code(err) or type(err).__name__}"
    if d.get("search_failed"):
        log(
            f"aws: the search by tag for what aws.json may have missed failed "
            f"({d['search_failed']}): what it lists is ended, and the run is not said to be gone"
        )
    state.save()


def search_left(state: AwsState) -> list[str]:
    """What teardown reports as left when its search by tag failed: not a resource, but the
    fact that what aws.json missed was not looked for (`reproduce down` searches again)."""
    why = state.data.get("search_failed")
    return [f"whatever aws.json missed (the search by tag failed: {why})"] if why else []


def _discover_instances(ec2: EC2Client, state: AwsState, mine: list[FilterTypeDef]) -> int:
    d = state.data
    alive: list[FilterTypeDef] = [{"Name": "instance-state-name", "Values": LIVE_STATES}]
    try:
        resp = ec2.describe_instances(Filters=mine + alive)
    except Exception as err:  # noqa: BLE001
        if not aws_said_no(err):
            raise
        if error_code(err) in ("AuthFailure", "UnauthorizedOperation"):
            raise translate(err, "finding the run's instances") from err
        d["search_failed"] = f"{error_code(err) or type(err).__name__}"
        return 0
    found = 0
    for r in resp.get("Reservations", []):
        for inst in r.get("Instances", []):
            if not_made_because("instances", inst, d["run_id"], d.get("launch_id")):
                continue  # tagged like ours, not launched by us
            found += 1
            iid = inst["InstanceId"]
            if iid not in d["targeted"] and iid not in d["instances"]:
                d["instances"].append(iid)
    return found


def _discover_the_rest(ec2: EC2Client, state: AwsState, mine: list[FilterTypeDef]) -> None:
    d = state.data
    known = {a["allocation_id"] for a in d["addresses"]}
    for addr in ec2.describe_addresses(Filters=mine).get("Addresses", []):
        if addr["AllocationId"] not in known:
            d["addresses"].append(address_record(addr))
    run_id, launch_id = d["run_id"], d.get("launch_id")

    def made(kind: str, items: Sequence[Described]) -> list[Described]:
        return [i for i in items if not not_made_because(kind, i, run_id, launch_id)]

    if not d["security_group"]:
        groups = made(
            "security_group", ec2.describe_security_groups(Filters=mine).get("SecurityGroups", [])
        )
        if groups:
            d["security_group"] = groups[0]["GroupId"]
    if not d["key_pair"]:
        keys = made("key_pair", ec2.describe_key_pairs(Filters=mine).get("KeyPairs", []))
        if keys:
            d["key_pair"] = keys[0]["KeyName"]
    if not d["placement_group"]:
        pgs = made("placement_group", placement_groups(ec2, mine))
        if pgs:
            d["placement_group"] = pgs[0]["GroupName"]


def placement_groups(
    ec2: EC2Client, filters: Sequence[FilterTypeDef], *, strict: bool = False
) -> list[PlacementGroupTypeDef]:
    """The placement groups FILTERS find. An AWS error reads as none unless STRICT: a net
    (teardown's discovery) may go on without them, a listing that decides what ends (reap)
    may not, since an error there is not an empty account."""
    try:
        return ec2.describe_placement_groups(Filters=filters).get("PlacementGroups", [])
    except Exception as err:  # noqa: BLE001 - not every endpoint (moto) implements them
        if strict or not aws_said_no(err):
            raise
        return []


def address_record(addr: AddressTypeDef) -> dict[str, str | None]:
    return {
        "allocation_id": addr["AllocationId"],
        "public_ip": addr.get("PublicIp"),
        "association_id": addr.get("AssociationId"),
    }


# ------------------------------------------------------------------------------------------------
# The check before anything is ended


def sort_out(ec2: EC2Client, state: AwsState, log: Log, poll_s: float) -> None:
    """Keep in the state only what carries this launch's tags; refuse and report the rest.

    What AWS no longer knows is dropped as gone, except an instance of a recent launch, which is
    looked for until the consistency window passes (it may just not be visible yet).
    """
    d = state.data
    run_id, launch_id = str(d.get("run_id") or ""), d.get("launch_id")
    where = f"{d.get('region')} (account {d.get('account') or '?'})"

    def judge(kind: str, what: str, item: Mapping[str, Any]) -> bool:
        why = rq.foreign_because(item.get("Tags"), run_id, launch_id) or not_made_because(
            kind, item, run_id, launch_id
        )
        if why:
            refuse(state, kind, what, why, log)
        return not why

    _sort_out_instances(ec2, state, judge, log, poll_s, where)
    for addr in list(d["addresses"]):
        aid = addr.get("allocation_id")
        found = _one(ec2.describe_addresses, "Addresses", "allocation-id", aid)
        if found is None:
            d["addresses"].remove(addr)  # released already
        elif not judge("addresses", aid, found):
            d["addresses"].remove(addr)
    checks = (
        ("security_group", ec2.describe_security_groups, "SecurityGroups", "group-id"),
        ("key_pair", ec2.describe_key_pairs, "KeyPairs", "key-name"),
        ("placement_group", None, "PlacementGroups", "group-name"),
    )
    for key, describe, listed, name in checks:
        value = d.get(key)
        if not value:
            continue
        if describe is None:
            groups = placement_groups(ec2, [{"Name": name, "Values": [value]}])
            found = groups[0] if groups else None
        else:
            found = _one(describe, listed, name, value)
        if found is None or not judge(key, value, found):
            d[key] = None
    state.save()


def _sort_out_instances(
    ec2: EC2Client, state: AwsState, judge: Callable[..., bool], log: Log, poll_s: float, where: str
) -> None:
    d = state.data
    unseen = list(state.launched_instances)
    until = window_end(state)
    while unseen:
        for inst in _instances(ec2, unseen):
            iid = inst["InstanceId"]
            unseen.remove(iid)
            if not judge("instances", iid, inst):
                d["instances"].remove(iid)
            elif inst["State"]["Name"] == "terminated":  # a lost node (spot, by hand): ended
                d["instances"].remove(iid)
                d["terminated"] = sorted(set(d.get("terminated", [])) | {iid})
        if not unseen or time.monotonic() >= until:
            break
        time.sleep(poll_s)
    for iid in unseen:
        log(f"aws: instance {iid} is not known in {where}: it ended long ago (counted as gone)")
        d["instances"].remove(iid)
        d["terminated"] = sorted(set(d.get("terminated", [])) | {iid})


def _instances(ec2: EC2Client, ids: list[str]) -> list[InstanceTypeDef]:
    """The instances AWS shows among `ids` (a filter: an unknown id is no error, just absent)."""
    try:
        resp = ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": list(ids)}])
    except Exception as err:  # noqa: BLE001
        raise translate(err, "describing the run's instances") from err
    return [i for r in resp.get("Reservations", []) for i in r.get("Instances", [])]


def _one(
    describe: Callable[..., Any], listed: str, name: str, value: str
) -> Mapping[str, Any] | None:
    try:
        found = describe(Filters=[{"Name": name, "Values": [value]}]).get(listed, [])
    except Exception as err:  # noqa: BLE001
        raise translate(err, f"describing {value}") from err
    return found[0] if found else None


def refuse(state: AwsState, kind: str, what: str, why: str, log: Log) -> None:
    words = {"instances": "instance", "addresses": "Elastic IP"}.get(kind, kind.replace("_", " "))
    state.data.setdefault("refused", [])
    entry = f"{words} {what}: {why}"
    if entry not in state.data["refused"]:
        state.data["refused"].append(entry)
    log(f"aws: {words} {what} is listed in aws.json but is not this launch's ({why}): not ended")


def launches_of_run(ec2: EC2Client, run_id: str) -> dict[str, list[str]]:
    """The launch ids found under a run id, each with its instances (when aws.json is lost)."""
    alive: list[FilterTypeDef] = [{"Name": "instance-state-name", "Values": LIVE_STATES}]
    resp = ec2.describe_instances(Filters=rq.launch_filter(run_id, None) + alive)
    found: dict[str, list[str]] = {}
    for r in resp.get("Reservations", []):
        for inst in r.get("Instances", []):
            launch = rq.tag_values(inst.get("Tags")).get(rq.TAG_LAUNCH, "")
            found.setdefault(launch, []).append(inst["InstanceId"])
    return found
