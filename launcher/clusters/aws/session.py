"""Sessions, credentials, regions and AWS errors in the launcher's words; the record of calls sent.

Why one place: every AWS entry point (a launch, `--check`, down, reap, capacity) must refuse the
same way before anything is created: no credentials, no region, an unknown region. And every
boto error must become a BadInput (the user can fix the profile; exit 2) or an InfraError (AWS
or the account said no; exit 3) with the same wording. boto3 and botocore are imported only
inside the functions, so the dry run can import this module without them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from launcher.clusters.aws.requests import Service
from launcher.errors import BadInput, InfraError
from launcher.records import jsonread

if TYPE_CHECKING:
    from boto3.session import Session
    from botocore.client import BaseClient
    from botocore.loaders import Loader
    from types_boto3_sts import STSClient

    from launcher.clusters.aws.settings import AwsSettings

CAPACITY_CODES = ("InsufficientInstanceCapacity", "InsufficientCapacity")
ClientT = TypeVar("ClientT", bound="BaseClient")

_DATA_LOADER: Loader | None = None  # botocore's loader of this process, shared by every session


def new_session(region: str | None) -> Session:
    """A boto3 Session on botocore's data loader of this process.

    Why: botocore reads and parses a service's JSON model (EC2's: a few MB) and its endpoint
    table once per loader, and every new Session brings a new loader, so a process that makes
    several sessions (a nightly's launches, `down` then `reap`, a price lookup beside a launch)
    parsed the same files each time: about 0.2 CPU-s each (cProfile of tests/clusters/aws/
    test_aws_quota.py: docs/testing.md). The loader holds only what it read from
    botocore's (and boto3's) own data files, so sharing it changes nothing but that time.
    """
    import boto3
    import botocore.session

    global _DATA_LOADER
    core = botocore.session.get_session()
    if _DATA_LOADER is None:
        _DATA_LOADER = core.get_component("data_loader")
    else:
        core.register_component("data_loader", _DATA_LOADER)
    session = boto3.Session(region_name=region, botocore_session=core)
    paths = _DATA_LOADER.search_paths  # boto3 adds its own folder for every session: keep it once
    paths[:] = list(dict.fromkeys(paths))
    return session


def make_session(
    region: str | None, session: Session | None = None, *, nothing: str = "nothing was launched"
) -> Session:
    """A boto3 session with credentials and a known region, or BadInput saying what is missing.

    `nothing` says what did not happen for want of them, in the caller's words (a launch: nothing
    was launched; `down`: nothing was ended), so no command borrows another's message.
    boto3 honours AWS_ENDPOINT_URL, so the same code can be pointed at a moto server.
    """
    if session is None:
        try:
            session = new_session(region or None)
        except Exception as err:  # noqa: BLE001 - a broken AWS config file or profile name
            raise BadInput(f"cannot read the AWS configuration: {err}") from err
    try:
        creds = session.get_credentials()
    except Exception as err:  # noqa: BLE001 - e.g. a profile whose SSO session expired
        raise BadInput(f"cannot load AWS credentials: {err}") from err
    if creds is None:
        raise BadInput(
            f"no AWS credentials found, so {nothing}.",
            hint="Set AWS_PROFILE (after `aws sso login` or `aws configure`), or "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and try again.",
        )
    chosen = region or session.region_name
    if not chosen:
        raise BadInput(
            f"no AWS region: set `region` in the aws profile (or AWS_REGION); {nothing}."
        )
    check_region(session, chosen, nothing)
    return session


def check_region(session: Session, region: str, nothing: str = "nothing was launched") -> None:
    """Refuse a region botocore does not know (a typo would otherwise fail later and obscurely)."""
    known: set[str] = set()
    for partition in session.get_available_partitions():
        known.update(session.get_available_regions("ec2", partition_name=partition))
    if known and region not in known:
        close = sorted(r for r in known if r.split("-")[0] == region.split("-")[0])[:8]
        raise BadInput(
            f"unknown AWS region {region!r}; {nothing}.",
            hint=f"Expected a region such as {', '.join(close or sorted(known)[:8])}.",
        )


def caller_account(sts: STSClient, doing: str) -> str:
    """The AWS account of these credentials (sts GetCallerIdentity; needs no permission).

    Recorded at launch and checked by `down`: under another account's credentials every id of the
    run is "not found", which must never read as "terminated".
    """
    try:
        return str(sts.get_caller_identity()["Account"])
    except Exception as err:  # noqa: BLE001
        mine = translate(err, doing)
        if mine is err:
            raise
        raise mine from err


def aws_said_no(err: BaseException) -> bool:
    """True for AWS's (or botocore's) own errors; False for anything else, such as an OSError
    raised by a signal handler's print in the middle of a call, which must not read as AWS's
    refusal (teardown then goes again instead of giving up on a resource)."""
    from botocore.exceptions import BotoCoreError, ClientError
    from botocore.parsers import ResponseParserError  # an endpoint's error page

    return isinstance(err, BotoCoreError | ClientError | ResponseParserError)


def error_code(err: BaseException) -> str:
    """The AWS error code of a botocore ClientError ('' for anything else)."""
    response = getattr(err, "response", None)
    return str((response or {}).get("Error", {}).get("Code", "")) if response is not None else ""


def error_message(err: BaseException) -> str:
    response = getattr(err, "response", None)
    if response is None:
        return str(err)
    return str(response.get("Error", {}).get("Message", str(err)))


def capacity_alternatives(s: AwsSettings, tried_zones: list[str] | None = None) -> str:
    zones = f" (tried {', '.join(tried_zones)})" if tried_zones else ""
    return (
        f"AWS has no {s.instance_type} capacity for this request{zones}. Alternatives: "
        "buy a Capacity Block (`reproduce capacity RECIPE --cluster aws` lists offerings with "
        "prices and start times, then set capacity: {type: capacity-block, reservation_id: "
        "cr-...}); use an existing capacity reservation (capacity: {type: reservation, "
        "reservation_id: cr-...}); try spot (capacity: {type: spot}); or another region or "
        "subnet (region, subnet_id)."
    )


_CREDENTIAL_CODES = (
    "AuthFailure",
    "InvalidClientTokenId",
    "ExpiredToken",
    "SignatureDoesNotMatch",
    "RequestExpired",
)
_USER_FIXABLE_PREFIXES = (
    "InvalidAMIID",
    "InvalidSubnetID",
    "InvalidKeyPair",
    "InvalidCapacityReservationId",
    "InvalidParameterValue",
    "ParameterNotFound",
    "InvalidInstanceID",
)


def translate(err: Exception, doing: str, s: AwsSettings | None = None) -> Exception:
    """A boto error as the launcher's own.

    BadInput for what the user can fix in the profile, InfraError for the rest.
    """
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    if isinstance(err, NoCredentialsError):
        return BadInput(
            f"{doing}: no AWS credentials found.",
            hint="Set AWS_PROFILE or run `aws configure`.",
        )
    if isinstance(err, ClientError):
        code, msg = error_code(err), error_message(err)
        if code in (*CAPACITY_CODES, "InsufficientReservedInstanceCapacity"):
            return InfraError(
                f"{doing}: {code}: {msg}", hint=capacity_alternatives(s) if s else None
            )
        if code in ("InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"):
            return InfraError(
                f"{doing}: {code}: {msg}",
                hint="Ask AWS for a higher quota "
                "(Service Quotas: 'Running On-Demand P instances').",
            )
        if code in _CREDENTIAL_CODES:
            return BadInput(f"{doing}: AWS rejected the credentials ({code}): {msg}")
        if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
            return InfraError(
                f"{doing}: the credentials may not do this ({code}). "
                "Grant the permission and retry."
            )
        if code.startswith(_USER_FIXABLE_PREFIXES):
            return BadInput(f"{doing}: {code}: {msg}")
        return InfraError(f"{doing}: {code or 'error'}: {msg}")
    if isinstance(err, BotoCoreError):
        return InfraError(f"{doing}: {err}")
    return err


# ------------------------------------------------------------------------------------------------
# The record of the calls really sent


def snake(operation: str) -> str:
    """'RunInstances' -> 'run_instances' (boto3's method name for an operation)."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in operation).lstrip("_")


def camel(method: str) -> str:
    """'run_instances' -> 'RunInstances' (the operation name the dry run prints)."""
    return "".join(part.title() for part in method.split("_"))


_NEVER_RECORDED = ("KeyMaterial", "PrivateKey", "Password", "Secret")


def _recordable(value: object) -> object:
    """Request parameters minus any that could hold key material or a secret.

    No call sends one today; this keeps a future call from writing one into the run directory.
    """
    if isinstance(value, dict):
        return {
            k: "<not recorded>"
            if any(word in str(k) for word in _NEVER_RECORDED)
            else _recordable(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_recordable(v) for v in value]
    return value


class CallLog:
    """run_dir/aws-calls.jsonl: one line per AWS call sent (service, operation, params, outcome).

    Why: the dry run shows what a launch would send; this shows what it did send, for audit and
    for the test that compares the two. Only request parameters are written, never a response
    (CreateKeyPair's answer holds the private key). Writing it never stops a call: a full disk
    loses a line, not a teardown.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = Path(path) if path else None

    def write(self, service: str, operation: str, params: dict[str, Any], error: str) -> None:
        if self.path is None:
            return
        line = {"at": round(time.time(), 3), "service": service, "operation": operation}
        line.update({"params": _recordable(params), "error": error or None})
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, default=str, sort_keys=False) + "\n")
        except OSError:
            pass

    def read(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.is_file():
            return []
        text = jsonread.read_text(self.path, max_bytes=64 * jsonread.MAX_BYTES) or ""
        return [jsonread.loads(x) for x in text.splitlines() if x]


class RecordedClient:
    """A boto3 client whose every call is written to a CallLog (then answered as usual)."""

    def __init__(self, client: BaseClient, service: str, log: CallLog) -> None:
        self._client = client
        self._service = service
        self._log = log
        self.meta = getattr(client, "meta", None)
        self._operations = getattr(self.meta, "method_to_api_mapping", None) or {}

    def get_paginator(self, name: str) -> Any:
        return self._client.get_paginator(name)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not callable(method) or name.startswith("_"):
            return method

        def call(**params: object) -> Any:
            error = ""
            try:
                return method(**params)
            except BaseException as err:
                error = error_code(err) or type(err).__name__
                raise
            finally:
                operation = self._operations.get(name) or camel(name)
                self._log.write(self._service, operation, params, error)

        return call


def recorded(client: ClientT, service: Service, log: CallLog) -> ClientT:
    """`client` with every call written to `log`, typed as the client it wraps (a proxy, so
    mypy checks each call against the service's stubs)."""
    return cast("ClientT", RecordedClient(client, service, log))


def recorded_client(session: Session, service: Service, region: str, log: CallLog) -> BaseClient:
    return recorded(session.client(service, region_name=region), service, log)
