"""`reproduce down`: one run, from its directory (`reproduce reap`, whatever has expired: reap.py).

Why `down` does not simply trust aws.json: the file sits in the run directory. It can be cut short
(a crash, a full disk), overwritten (the node's files are collected into the same directory) or
copied from another run. So who the launch is (run id, launch id, region, account) comes first
from the launcher's own record of it, kept outside every run directory (state.py), then from
aws.json, then from run.json; what is ended is checked against AWS by its tags (ownership.py);
and a corrupt aws.json falls back to finding the run's resources by tag in the recorded (or
given) region.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.clusters.aws import ownership
from launcher.clusters.aws.session import (
    CallLog,
    caller_account,
    make_session,
    recorded,
    translate,
)
from launcher.clusters.aws.state import (
    AwsState,
    CorruptState,
    launch_record,
    launch_record_for,
    state_root,
)
from launcher.clusters.aws.teardown import Log, leftover_message, safe, teardown
from launcher.errors import BadInput, InfraError
from launcher.records import jsonread
from launcher.records.rundir import Files

if TYPE_CHECKING:
    from boto3.session import Session
    from types_boto3_ec2 import EC2Client

IDENTITY = ("run_id", "launch_id", "region", "account")


def _quiet(_line: str) -> None:
    return None


def state_file(run_dir: Path) -> Path:
    """aws.json of a run directory (or the file itself); BadInput when there is none. An aws
    run whose aws.json is gone (run.json says aws) still has one to name: its resources are
    then found by their tags, as for a damaged one (load_state)."""
    run_dir = Path(run_dir)
    path = run_dir if run_dir.is_file() else run_dir / Files.AWS
    if not path.is_file() and _run_json(run_dir).get("kind") == "aws":
        return path
        raise BadInput(
            f"{run_dir}: no aws.json here; this run did not use --cluster aws "
            "(or its directory moved)."
        )
    return path


def _run_json(run_dir: Path) -> dict[str, Any]:
    """run.json's run id and cluster record, or {} when it is missing or unreadable."""
    try:
        data = jsonread.load_file(run_dir / Files.RUN)  # bounded: a run dir is anyone's
    except jsonread.NodeJSONError:
        return {}
    if not isinstance(data, dict):
        return {}
    cluster = data.get("cluster")
    if not isinstance(cluster, dict):
        cluster = {}
    found = {k: cluster[k] for k in (*IDENTITY, "kind") if isinstance(cluster.get(k), str)}
    if isinstance(data.get("run_id"), str):
        found.setdefault("run_id", data["run_id"])
    return found


def load_state(path: Path, log: Log, **given: str | None) -> AwsState:
    """The state to end, with the identity the launcher itself recorded winning over the file.

    `given` (region, run_id from the command line) fills what no record holds.
    """
    try:
        state = AwsState.load(path)
        corrupt: CorruptState | None = None
    except CorruptState as err:
        log(f"aws: {err.path} is {err.why}: finding the run's resources by their tags instead")
        state, corrupt = AwsState(None), err
    own = launch_record_for(path)
    if own is not None:
        claimed = {k: state.data.get(k) for k in ("run_id", "launch_id")}
        if corrupt is None and claimed != {k: own.get(k) for k in claimed}:
            log(
                f"aws: {path} names run {claimed['run_id']} launch {claimed['launch_id']}, but "
                f"the launcher's own record of this run directory says run {own.get('run_id')} "
                f"launch {own.get('launch_id')}: trusting the launcher's own record"
            )
        state.data.update({k: own.get(k) for k in IDENTITY if own.get(k)})
    elif corrupt is None and state.data.get("launch_id"):
        other = launch_record(str(state.data["launch_id"]))
        elsewhere = other and other.get("state_path")
        if elsewhere and Path(elsewhere) != path and Path(elsewhere).is_file():
            raise BadInput(
                f"{path} names launch {state.data['launch_id']}, which this launcher made for "
                f"{elsewhere}, not for this run directory; nothing was ended.",
                hint=f"`reproduce down {Path(elsewhere).parent}` ends that launch.",
            )
    if corrupt is not None:
        fallback = {**_run_json(path.parent), **{k: v for k, v in given.items() if v}}
        for key, value in fallback.items():
            if not state.data.get(key):
                state.data[key] = value
        missing = [k for k in ("region", "run_id") if not state.data.get(k)]
        if missing:
            raise BadInput(
                f"{corrupt.path} is {corrupt.why}, and no {' or '.join(missing)} is recorded "
                "anywhere else; nothing was ended.",
                hint="Give them: `reproduce down RUN --region REGION` (the run id is in run.json "
                "or the directory's name).",
            )
    return state


def _adopt_launch(ec2: EC2Client, state: AwsState, log: Log) -> None:
    """Without a launch id (aws.json lost): the run's only launch, or refuse to guess."""
    if state.data.get("launch_id"):
        return
    run_id = str(state.data["run_id"])
    try:
        launches = ownership.launches_of_run(ec2, run_id)
    except Exception as err:  # noqa: BLE001
        raise translate(err, f"finding the instances of run {run_id}") from err
    if len(launches) > 1:
        found = "; ".join(f"launch {k or '(none)'}: {', '.join(v)}" for k, v in launches.items())
        raise BadInput(
            f"run id {run_id} has instances of several launches ({found}) and this run's "
            "aws.json cannot say which is its own; nothing was ended.",
            hint="End the right one in the EC2 console, or wait for `reproduce reap`.",
        )
    if launches:
        launch = next(iter(launches))
        state.data["launch_id"] = launch or None
        log(f"aws: run {run_id} has one launch ({launch or 'without a launch id'}): ending it")


def down(
    run_dir: Path,
    *,
    session: Session | None = None,
    log: Log = _quiet,
    poll_s: float = 5.0,
    key_dir: Path | None = None,
    region: str | None = None,
    run_id: str | None = None,
) -> list[str]:
    """End what a run launched (a kept node, or what a crash left), from run_dir/aws.json.

    Returns what was ended; raises BadInput for other credentials (another account) or a state
    that names no region, InfraError naming what could not be ended.
    """
    log = safe(log)
    path = state_file(run_dir)
    state = load_state(path, log, region=region, run_id=run_id)
    if state.data.get("targeted") and not state.launched_instances:
        log(
            f"aws: {', '.join(state.data['targeted'])} was only targeted by this run; "
            "the launcher never ends it"
        )
    # no record of the launcher's own and an aws.json it cannot read: the region came from
    # run.json or the command line, so nothing found there is not proof of anything
    guessed = launch_record_for(path) is None and not _readable(path)
    where = state.data.get("region") or region
    session = make_session(
        where,
        session,
        nothing="`reproduce down` ended nothing: whatever the run still holds is still there "
        "(and billing, if it is an instance)",
    )
    where = where or session.region_name
    state.data["region"] = where
    account = caller_account(
        session.client("sts", region_name=where), "finding the account of these credentials"
    )
    calls = CallLog(path.with_name(Files.AWS_CALLS))
    ec2 = recorded(session.client("ec2", region_name=where), "ec2", calls)
    _adopt_launch(ec2, state, log)
    left = teardown(
        ec2,
        state,
        account=account,
        log=log,
        poll_s=poll_s,
        key_dir=key_dir or state_root() / "keys",
    )
    if left:
        raise InfraError(leftover_message(left, path, where))
    ended = list(state.data.get("ended", []))
    if not ended and guessed:
        ended = _down_elsewhere(session, state, str(where), account, log, poll_s, key_dir, calls)
    return ended


def _readable(path: Path) -> bool:
    try:
        AwsState.load(path)
    except CorruptState:
        return False
    return True


def _down_elsewhere(
    session: Session,
    state: AwsState,
    looked: str,
    account: str | None,
    log: Log,
    poll_s: float,
    key_dir: Path | None,
    calls: CallLog,
) -> list[str]:
    """The run's resources found by its run-id tag in every other region, ended there; an
    InfraError when none carries it anywhere (never "gone": nothing was seen end)."""
    run_id = str(state.data["run_id"])
    log(f"aws: nothing carrying run {run_id}'s tags in {looked}; looking in every region")
    try:
        regions = [
            r["RegionName"]
            for r in session.client("ec2", region_name=looked).describe_regions()["Regions"]
        ]
    except Exception as err:  # noqa: BLE001
        raise translate(err, "listing the regions") from err
    ended: list[str] = []
    for here in sorted(set(regions) - {looked}):
        ec2 = recorded(session.client("ec2", region_name=here), "ec2", calls)
        try:
            if not ownership.launches_of_run(ec2, run_id):
                continue
        except Exception as err:  # noqa: BLE001 - a region this account cannot use
            log(f"aws: {here}: {translate(err, 'finding the run by its tag')}")
            continue
        log(f"aws: run {run_id} has instances in {here}: ending what carries its tags there")
        found = AwsState(None, {**dict(state.data), "region": here, "launch_id": None})
        _adopt_launch(ec2, found, log)
        left = teardown(
            ec2,
            found,
            account=account,
            log=log,
            poll_s=poll_s,
            key_dir=key_dir or state_root() / "keys",
        )
        if left:
            raise InfraError(leftover_message(left, state.path or Path(Files.AWS), here))
        ended += list(found.data.get("ended", []))
    if not ended:
        raise InfraError(
            f"found no resource tagged with run {run_id} in any region ({len(regions)} "
            f"regions of account {account}); nothing was ended, and with its aws.json "
            "unreadable and no launch record here, this run's resources are not seen gone "
            "either.",
            hint="If the run id is another one (see the run directory's name), give it: "
            "`reproduce down RUN --run-id ID --region REGION`.",
        )
    return ended
