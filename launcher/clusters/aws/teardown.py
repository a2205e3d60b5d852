"""Ending what a run created: the teardown shared by release, `reproduce down` and `reproduce reap`.

Why one teardown: a paid instance must end the same way whoever ends it, the run itself, the user
later (down, from aws.json) or the reaper (by the expires-at tag). The order matters (docs/aws.md):
instances first, waited for until terminated, because their interfaces keep the security group
and placement group in use; then Elastic IPs, groups and the key pair. These functions report
through a `log` callback and return what is left; the command layer prints.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.session import (
    CallLog,
    RecordedClient,
    error_code,
    error_message,
    make_session,
    translate,
)
from launcher.clusters.aws.state import AwsState, state_root
from launcher.errors import BadInput, InfraError

TERMINATE_TIMEOUT_S = 1200.0
DELETE_RETRY_S = 300.0  # security and placement groups stay "in use" for a while after termination
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
Log = Callable[[str], Any]


def _quiet(_line: str) -> None:
    return None


def teardown(
    ec2: Any,
    state: AwsState,
    *,
    log: Log = _quiet,
    poll_s: float = 5.0,
    key_dir: Path | None = None,
    terminate_timeout_s: float = TERMINATE_TIMEOUT_S,
) -> list[str]:
    """End everything the state (and the run's tags) name; return what is still allocated."""
    run_id = state.data.get("run_id")
    if run_id:
        _discover(ec2, state, run_id)
    ids = state.launched_instances
    live = _terminate(ec2, state, ids, log, poll_s, terminate_timeout_s) if ids else []
    for addr in list(state.data["addresses"]):
        try:
            if addr.get("association_id"):
                try:
                    ec2.disassociate_address(AssociationId=addr["association_id"])
                except Exception:  # noqa: BLE001, S110 - termination usually removed it already
                    pass
            ec2.release_address(AllocationId=addr["allocation_id"])
        except Exception as err:  # noqa: BLE001
            if not error_code(err).startswith("InvalidAllocationID.NotFound"):
                why = error_message(err)
                log(f"aws: releasing Elastic IP {addr['allocation_id']} failed: {why}")
                continue
        state.data["addresses"].remove(addr)
        state.save()
    # groups stay "in use" a while after their instances terminate; none left running: retry longer
    deadline = time.monotonic() + (
        DELETE_RETRY_S if ids and not live else 30.0 if not live else 0.0
    )
    deletions = (
        ("placement_group", "placement group", "InvalidPlacementGroup.Unknown"),
        ("security_group", "security group", "InvalidGroup.NotFound"),
        ("key_pair", "key pair", "InvalidKeyPair.NotFound"),
    )
    for key, what, gone in deletions:
        if state.data[key] and _delete_retrying(
            _deleter(ec2, key, state.data[key]), (gone,), deadline, poll_s, log, what
        ):
            state.set(**{key: None})
    key_file = state.data.get("key_file") or (
        str(key_dir / f"{rq.resource_name(run_id)}.pem") if key_dir and run_id else None
    )
    if key_file and not state.data["key_pair"]:
        try:
            os.unlink(key_file)
        except FileNotFoundError:
            pass
        state.set(key_file=None)
    left = state.allocated()
    state.set(released=not left, left=left)
    if not left:
        log("aws: everything this run created is gone")
    return left


def _terminate(
    ec2: Any, state: AwsState, ids: list[str], log: Log, poll_s: float, timeout_s: float
) -> list[str]:
    """TerminateInstances, then wait until they are gone; return those still alive."""
    log(f"aws: terminating {', '.join(ids)}")
    refused = False
    try:
        ec2.terminate_instances(InstanceIds=ids)
    except Exception as err:  # noqa: BLE001
        if not error_code(err).startswith("InvalidInstanceID.NotFound"):
            refused = True  # waiting for a termination that was never accepted only burns money
            log(f"aws: terminate failed: {translate(err, 'terminating')}")
    deadline = time.monotonic() + (0 if refused else timeout_s)
    while True:
        live = _live_instances(ec2, ids)
        if not live:
            break
        if time.monotonic() >= deadline:
            if not refused:
                log(f"aws: {', '.join(live)} still not terminated after {timeout_s:.0f} s")
            break
        time.sleep(poll_s)
    gone = [i for i in ids if i not in live]
    state.set(
        instances=[i for i in state.data["instances"] if i not in gone],
        terminated=sorted(set(state.data.get("terminated", []) + gone)),
    )
    return live


def _deleter(ec2: Any, key: str, value: str) -> Callable[[], Any]:
    if key == "placement_group":
        return lambda: ec2.delete_placement_group(GroupName=value)
    if key == "security_group":
        return lambda: ec2.delete_security_group(GroupId=value)
    return lambda: ec2.delete_key_pair(KeyName=value)


def _delete_retrying(
    call: Callable[[], Any],
    gone_codes: tuple[str, ...],
    deadline: float,
    poll_s: float,
    log: Log,
    what: str,
) -> bool:
    busy = ("DependencyViolation", "InvalidPlacementGroup.InUse", "RequestLimitExceeded")
    while True:
        try:
            call()
            return True
        except Exception as err:  # noqa: BLE001
            code = error_code(err)
            if code.startswith(gone_codes):
                return True
            if code not in busy or time.monotonic() >= deadline:
                log(
                    f"aws: deleting the {what} failed: "
                    f"{code or type(err).__name__}: {error_message(err)}"
                )
                return False
        time.sleep(poll_s)


def _live_instances(ec2: Any, ids: list[str]) -> list[str]:
    try:
        resp = ec2.describe_instances(InstanceIds=ids)
    except Exception as err:  # noqa: BLE001
        if error_code(err).startswith("InvalidInstanceID.NotFound"):
            return []
        raise translate(err, "describing instances being terminated") from err
    return [
        i["InstanceId"]
        for r in resp["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    ]


def _discover(ec2: Any, state: AwsState, run_id: str) -> None:
    """Add what AWS holds under the run's tag but the state missed (a crash after a call)."""
    mine = rq.run_id_filter(run_id)
    d = state.data
    try:
        alive = [{"Name": "instance-state-name", "Values": LIVE_STATES}]
        for r in ec2.describe_instances(Filters=mine + alive)["Reservations"]:
            for inst in r["Instances"]:
                iid = inst["InstanceId"]
                if iid not in d["targeted"] and iid not in d["instances"]:
                    d["instances"].append(iid)
        known = {a["allocation_id"] for a in d["addresses"]}
        for addr in ec2.describe_addresses(Filters=mine).get("Addresses", []):
            if addr["AllocationId"] not in known:
                d["addresses"].append(_address_record(addr))
        if not d["security_group"]:
            groups = ec2.describe_security_groups(Filters=mine).get("SecurityGroups", [])
            if groups:
                d["security_group"] = groups[0]["GroupId"]
        if not d["key_pair"]:
            keys = ec2.describe_key_pairs(Filters=mine).get("KeyPairs", [])
            if keys:
                d["key_pair"] = keys[0]["KeyName"]
        if not d["placement_group"]:
            pgs = _placement_groups(ec2, mine)
            if pgs:
                d["placement_group"] = pgs[0]["GroupName"]
    except Exception as err:  # noqa: BLE001 - discovery is a safety net; the state drives teardown
        if error_code(err) in ("AuthFailure", "UnauthorizedOperation"):
            raise translate(err, "finding the run's resources") from err
    state.save()


def _placement_groups(ec2: Any, filters: list[dict]) -> list[dict]:
    try:
        return ec2.describe_placement_groups(Filters=filters).get("PlacementGroups", [])
    except Exception:  # noqa: BLE001 - not every endpoint (moto) implements placement groups
        return []


def _address_record(addr: dict) -> dict:
    return {
        "allocation_id": addr["AllocationId"],
        "public_ip": addr.get("PublicIp"),
        "association_id": addr.get("AssociationId"),
    }


def leftover_message(left: list[str], state_path: Path | None, region: str | None) -> str:
    where = state_path.parent if state_path else "RUN"
    return (
        f"teardown did not finish; still allocated in {region}: {', '.join(left)}. "
        f"End them with `reproduce down {where}` (or in the EC2 console); they are tagged "
        f"{rq.TAG_RUN_ID} and `reproduce reap` ends them after their expires-at."
    )


def kept_message(state: AwsState, down_command: str, settings: Any) -> str:
    """What a --keep run leaves running, what it costs, and how it ends."""
    price = state.data.get("price_per_hour")
    kept = state.launched_instances
    n = len(kept)
    cost = (
        f"${price * n:.2f}/h ({n} x ${price:.3f}/h)"
        if price
        else "an unknown $/h (no price for this type/region)"
    )
    powers_off = settings is None or settings.self_terminate
    return (
        f"aws: kept {', '.join(kept)} (--keep): it costs {cost} until you end it with "
        f"`{down_command}`; `reproduce reap` ends it after {state.data.get('expires_at')}"
        + (" (and it powers itself off then: self_terminate)." if powers_off else ".")
    )


# ------------------------------------------------------------------------------------------------
# down and reap


def state_file(run_dir: Path) -> Path:
    """aws.json of a run directory (or the file itself); BadInput when there is none."""
    run_dir = Path(run_dir)
    path = run_dir if run_dir.is_file() else run_dir / "aws.json"
    if not path.is_file():
        raise BadInput(
            f"{run_dir}: no aws.json here; this run did not use --cluster aws "
            "(or its directory moved)."
        )
    return path


def down(
    run_dir: Path,
    *,
    session: Any = None,
    log: Log = _quiet,
    poll_s: float = 5.0,
    key_dir: Path | None = None,
) -> list[str]:
    """End what a run launched (a kept node, or what a crash left), from run_dir/aws.json.

    Returns what was allocated before; raises InfraError naming what could not be ended.
    """
    path = state_file(run_dir)
    state = AwsState.load(path)
    before = state.allocated()
    if state.data.get("targeted") and not state.launched_instances:
        log(
            f"aws: {', '.join(state.data['targeted'])} was only targeted by this run; "
            "the launcher never ends it"
        )
    region = state.data.get("region")
    session = make_session(region, session)
    raw = session.client("ec2", region_name=region or session.region_name)
    ec2 = RecordedClient(raw, "ec2", CallLog(path.with_name("aws-calls.jsonl")))
    left = teardown(ec2, state, log=log, poll_s=poll_s, key_dir=key_dir or state_root() / "keys")
    if left:
        raise InfraError(leftover_message(left, path, region))
    return before


def _expired(tags: list[dict] | None, now: datetime) -> tuple[str, str] | None:
    """(run id, expires-at) of a resource whose expiry has passed, else None."""
    values = {t["Key"]: t["Value"] for t in tags or []}
    run_id, when = values.get(rq.TAG_RUN_ID), values.get(rq.TAG_EXPIRES)
    if not run_id or not when:
        return None
    try:
        at = datetime.strptime(when, rq.EXPIRES_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None
    return (run_id, when) if at <= now else None


def expired_runs(ec2: Any, region: str, now: datetime) -> dict[str, AwsState]:
    """What the launcher tagged and whose expires-at has passed, grouped by run id."""
    has_expiry = [{"Name": "tag-key", "Values": [rq.TAG_EXPIRES]}]
    runs: dict[str, AwsState] = {}

    def state_for(tags: list[dict] | None) -> AwsState | None:
        hit = _expired(tags, now)
        if not hit:
            return None
        return runs.setdefault(hit[0], AwsState(None, {"run_id": hit[0], "region": region}))

    alive = [{"Name": "instance-state-name", "Values": LIVE_STATES}]
    for page in ec2.get_paginator("describe_instances").paginate(Filters=has_expiry + alive):
        for r in page["Reservations"]:
            for inst in r["Instances"]:
                if st := state_for(inst.get("Tags")):
                    st.data["instances"].append(inst["InstanceId"])
    for addr in ec2.describe_addresses(Filters=has_expiry).get("Addresses", []):
        if st := state_for(addr.get("Tags")):
            st.data["addresses"].append(_address_record(addr))
    for group in ec2.describe_security_groups(Filters=has_expiry).get("SecurityGroups", []):
        if st := state_for(group.get("Tags")):
            st.data["security_group"] = group["GroupId"]
    for key in ec2.describe_key_pairs(Filters=has_expiry).get("KeyPairs", []):
        if st := state_for(key.get("Tags")):
            st.data["key_pair"] = key["KeyName"]
    for pg in _placement_groups(ec2, has_expiry):
        if st := state_for(pg.get("Tags")):
            st.data["placement_group"] = pg["GroupName"]
    return runs


def reap(
    region: str,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    session: Any = None,
    log: Log = _quiet,
    poll_s: float = 5.0,
    key_dir: Path | None = None,
) -> list[str]:
    """End every resource the launcher tagged whose expires-at has passed; return what ended.

    Only resources carrying the launcher's run-id and expires-at tags are touched, so a targeted
    instance (never tagged) or anything made by hand is safe.
    """
    now = now or datetime.now(UTC)
    session = make_session(region, session)
    ec2 = session.client("ec2", region_name=region)
    try:
        runs = expired_runs(ec2, region, now)
    except Exception as err:  # noqa: BLE001
        raise translate(err, f"listing the launcher's resources in {region}") from err
    ended: list[str] = []
    left: list[str] = []
    for run_id, state in sorted(runs.items()):
        things = state.allocated()
        if dry_run:
            log(f"aws: would end run {run_id}: {', '.join(things)}")
            ended += things
            continue
        log(f"aws: run {run_id} is past its expires-at: ending {', '.join(things)}")
        left += teardown(
            ec2, state, log=log, poll_s=poll_s, key_dir=key_dir or state_root() / "keys"
        )
        ended += [t for t in things if t not in left]
    if not runs:
        log(f"aws: nothing of the launcher's is past its expires-at in {region}")
    if left:
        raise InfraError(
            f"reap could not end: {', '.join(left)} (in {region}); run `reproduce reap` again "
            "or end them in the EC2 console."
        )
    return ended
