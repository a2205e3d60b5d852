"""Ending what a launch created: the teardown shared by release, `reproduce down` and `reap`.

Why one teardown: a paid instance must end the same way whoever ends it, the run itself, the user
later (down, from aws.json) or the reaper (by the expires-at tag). The order matters (docs/aws.md):

1. the account: other credentials see none of the run's ids, and "not found" must not read as
   "terminated", so a state recorded under another account is refused before anything;
2. what is this launch's: checked by its tags (aws.json may list what is not this launch's), then
   found by its tags (a crash may have left something out of aws.json), in ownership.py;
3. instances first, waited for until terminated, because their interfaces keep the security group
   and placement group in use; then Elastic IPs, groups and the key pair.

The state file is written as a best effort only: a full disk never stops a TerminateInstances, and
the last message says when aws.json could not be brought up to date. Log lines never stop it
either (a closed terminal makes every print raise). These functions return what is left; the
command layer prints.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.clusters.aws import lifetime, ownership
from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.ownership import not_found
from launcher.clusters.aws.session import aws_said_no, error_code, error_message, translate
from launcher.clusters.aws.state import AwsState
from launcher.errors import BadInput

if TYPE_CHECKING:
    from types_boto3_ec2 import EC2Client

    from launcher.clusters.aws.settings import AwsSettings

TERMINATE_TIMEOUT_S = 1200.0
DELETE_RETRY_S = 300.0  # security and placement groups stay "in use" for a while after termination
Log = Callable[[str], Any]


def _quiet(_line: str) -> None:
    return None


def safe(log: Log) -> Log:
    """`log` that never raises: a print to a closed terminal (EIO) must not stop a teardown."""

    def say(line: str) -> None:
        try:
            log(line)
        except Exception:  # noqa: BLE001, S110 - nothing to report to: the terminal is gone
            pass

    return say


def check_account(state: AwsState, account: str | None) -> None:
    """BadInput when these credentials belong to another account than the launch's."""
    recorded = state.data.get("account")
    if recorded and account and recorded != account:
        raise BadInput(
            f"these AWS credentials are for account {account}, but this run's resources were "
            f"created in account {recorded}; nothing was ended (in account {account} none of them "
            "exist, which must not be mistaken for their end).",
            hint="Use the launching account's credentials (AWS_PROFILE) and run it again.",
        )


def teardown(
    ec2: EC2Client,
    state: AwsState,
    *,
    account: str | None = None,
    log: Log = _quiet,
    poll_s: float = 5.0,
    key_dir: Path | None = None,
    terminate_timeout_s: float = TERMINATE_TIMEOUT_S,
    discover: bool = True,
) -> list[str]:
    """End everything this launch created (and only that); return what is still allocated.
    DISCOVER: also what carries the launch's tags but the state misses (reap has already
    judged each resource it found, and ends only those: reap.py)."""
    log = safe(log)
    check_account(state, account)
    state.strict = False  # from here a failed save is reported, never in the way
    ownership.sort_out(ec2, state, log, poll_s)  # first: what aws.json names may be anyone's
    if discover:
        ownership.discover(ec2, state, log, poll_s)
    targets = state.allocated()
    ids = state.launched_instances
    live = _terminate(ec2, state, ids, log, poll_s, terminate_timeout_s) if ids else []
    _release_addresses(ec2, state, log)
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
    _remove_key_file(state, key_dir)
    left = state.allocated() + (ownership.search_left(state) if discover else [])
    state.set(released=not left, left=left, ended=[t for t in targets if t not in left])
    if state.save_error:
        log(
            f"aws: {state.path} could not be updated ({state.save_error}): it may still list "
            "what is gone (`reproduce down` checks each against AWS before ending anything)"
        )
    if not left and targets:  # said only of what was seen: found, ended, and seen ended
        log(f"aws: everything this run created is gone (in {state.data.get('region')})")
    elif not left:
        log(
            f"aws: AWS shows nothing carrying run {state.data.get('run_id')}'s tags in "
            f"{state.data.get('region')}: nothing was ended there"
        )
    return left


def _terminate(
    ec2: EC2Client, state: AwsState, ids: list[str], log: Log, poll_s: float, timeout_s: float
) -> list[str]:
    """TerminateInstances, then wait until they are gone; return those still alive.

    InvalidInstanceID.NotFound within the consistency window of a launch means "not visible
    yet": the call is repeated (per instance) until EC2 knows the id, never counted as gone.
    """
    log(f"aws: terminating {', '.join(ids)}")
    waiting, refused = list(ids), False
    until = ownership.window_end(state)
    while waiting:
        try:
            waiting = _terminate_visible(ec2, waiting)
        except Exception as err:  # noqa: BLE001
            if not aws_said_no(err):
                raise  # not AWS's answer: the caller runs the (idempotent) teardown again
            refused = True  # waiting for a termination that was never accepted only burns money
            log(f"aws: terminate failed: {translate(err, 'terminating')}")
            break
        if not waiting or time.monotonic() >= until:
            break
        time.sleep(poll_s)
    if waiting and not refused:
        log(f"aws: EC2 does not know {', '.join(waiting)} yet; they are still counted as running")
    accepted = [i for i in ids if i not in waiting]
    deadline = time.monotonic() + (0 if refused else timeout_s)
    live = list(accepted)
    while live:
        live = _live_instances(ec2, accepted, state)
        if not live or time.monotonic() >= deadline:
            if live and not refused:
                log(f"aws: {', '.join(live)} still not terminated after {timeout_s:.0f} s")
            break
        time.sleep(poll_s)
    still = sorted(set(live) | set(waiting))
    gone = [i for i in ids if i not in still]
    lifetimes = dict(state.data.get(lifetime.KEY) or {})
    for iid in gone:  # seen gone now: the cost stops here at the latest (lifetime.py)
        entry = dict(lifetimes.get(iid) or {})
        entry.setdefault("terminated_at", time.time())
        lifetimes[iid] = entry
    state.set(
        instances=[i for i in state.data["instances"] if i not in gone],
        terminated=sorted(set(state.data.get("terminated", [])) | set(gone)),
        **{lifetime.KEY: lifetimes},
    )
    return still


def _terminate_visible(ec2: EC2Client, ids: list[str]) -> list[str]:
    """Terminate what EC2 knows of `ids`; return the ids it does not know yet."""
    try:
        ec2.terminate_instances(InstanceIds=ids)
        return []
    except Exception as err:  # noqa: BLE001
        if not not_found(err):
            raise
    unknown = []
    for iid in ids:  # one unknown id fails the whole call: find out which
        try:
            ec2.terminate_instances(InstanceIds=[iid])
        except Exception as err:  # noqa: BLE001
            if not not_found(err):
                raise
            unknown.append(iid)
    return unknown


def _live_instances(ec2: EC2Client, ids: list[str], state: AwsState | None = None) -> list[str]:
    """Those of `ids` not yet terminated (an id EC2 no longer shows has ended); each one's launch
    and end as AWS states them kept in `state` (the run's cost: lifetime.py)."""
    try:
        resp = ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": list(ids)}])
    except Exception as err:  # noqa: BLE001
        raise translate(err, "describing instances being terminated") from err
    if state is not None:
        state.data[lifetime.KEY] = lifetime.noted(
            resp, dict(state.data.get(lifetime.KEY) or {}), time.time()
        )
    return [
        i["InstanceId"]
        for r in resp["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] != "terminated"
    ]


def _release_addresses(ec2: EC2Client, state: AwsState, log: Log) -> None:
    for addr in list(state.data["addresses"]):
        try:
            if addr.get("association_id"):
                try:
                    ec2.disassociate_address(AssociationId=addr["association_id"])
                except Exception:  # noqa: BLE001, S110 - termination usually removed it already
                    pass
            ec2.release_address(AllocationId=addr["allocation_id"])
        except Exception as err:  # noqa: BLE001
            if not aws_said_no(err):
                raise
            if not error_code(err).startswith("InvalidAllocationID.NotFound"):
                why = error_message(err)
                log(f"aws: releasing Elastic IP {addr['allocation_id']} failed: {why}")
                continue
        state.data["addresses"].remove(addr)
        state.save()


def _remove_key_file(state: AwsState, key_dir: Path | None) -> None:
    """Delete the run's private key: only a file named for this launch's key pair.

    aws.json's `key_file` is used only when its name is that one: a forged aws.json could
    otherwise name any file of the operator's.
    """
    run_id, launch_id = state.data.get("run_id"), state.data.get("launch_id")
    if state.data["key_pair"] or not run_id:
        return
    name = f"{rq.resource_name(run_id, launch_id) if launch_id else f'reproduce-{run_id}'}.pem"
    recorded = state.data.get("key_file")
    if isinstance(recorded, str) and Path(recorded).name == name:
        path: Path | None = Path(recorded)
    else:
        path = key_dir / name if key_dir else None
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as err:
            state.data.setdefault("refused", []).append(f"key file {path}: {err}")
    state.set(key_file=None)


def _deleter(ec2: EC2Client, key: str, value: str) -> Callable[[], Any]:
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
            if not aws_said_no(err):
                raise
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


def leftover_message(left: list[str], state_path: Path | None, region: str | None) -> str:
    where = state_path.parent if state_path else "RUN"
    return (
        f"teardown did not finish; still allocated in {region}: {', '.join(left)}. "
        f"End them with `reproduce down {where}` (or in the EC2 console); they are tagged "
        f"{rq.TAG_RUN_ID} and `reproduce reap` ends them after their expires-at."
    )


def after_run_message(grace: float | None, keep: bool, down_command: str) -> str:
    """What happens to a launched node once nobody follows its run: it ends itself `grace`
    seconds after the run ends (requests.py's user data; None: it does not), is kept, or waits
    for its TTL."""
    if grace is not None:
        span = f"{grace / 60:g} min" if grace >= 120 else f"{grace:g} s"
        return (
            f"it ends itself {span} after the run ends (`reproduce attach` within that "
            "collects the results, and the node waits while it reads; after it, the node is gone)"
        )
    if keep:
        return f"it is kept (--keep): it bills until `{down_command}`"
    return f"it bills until `{down_command}`, `reproduce cancel`, or its TTL (ttl_hours)"


def unfound_message(
    ids: list[str], path: Path | None, region: str | None, run_dir: Path | None
) -> str:
    """A recorded run whose aws.json is not where its record says: what it may still hold (the
    instances run.json names) and the command that finds and ends it by its tags."""
    what = f"instance {', '.join(ids)}" if ids else "its instance (no id recorded)"
    where = f" in {region}" if isinstance(region, str) else ""
    option = f" --region {region}" if isinstance(region, str) else ""
    return (
        f"cannot find this run's AWS record ({path or 'no aws.json recorded'}): nothing was "
        f"ended, and {what}{where} may still be running and billing. End it with "
        f"`reproduce down {run_dir or 'RUN'}{option}` (it finds the run's resources by their "
        "tags)."
    )


def kept_message(state: AwsState, down_command: str, settings: AwsSettings | None) -> str:
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
