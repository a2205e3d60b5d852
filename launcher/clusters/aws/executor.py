"""How the launch program's calls are carried out: the three modes, and what a launch knows.

Executor.read / create / poll are the only ways a step talks to AWS, so the mode alone decides
whether a call is printed (the dry run), checked with DryRun=True (`--check`) or sent (the
launch); see launcher/clusters/aws/program.py for the list of steps and docs/aws.md for the
modes. Launch is the blackboard the steps fill in, in order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from launcher.catalog import InstanceType
from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.requests import Service
from launcher.clusters.aws.session import error_code, snake, translate
from launcher.clusters.aws.settings import AwsSettings
from launcher.clusters.aws.state import AwsState
from launcher.errors import CheckFailed, InfraError

if TYPE_CHECKING:
    from botocore.client import BaseClient
    from types_boto3_ec2.type_defs import InstanceTypeDef, TagTypeDef

    from launcher.clusters.base import Node
    from launcher.inputs.recipe import Recipe

T = TypeVar("T")
Params = dict[str, Any]  # an operation's request parameters, as boto3 takes them
OverBudget = Callable[[], str | None]


class Mode(Enum):
    PRINT = "print"
    CHECK = "check"
    SEND = "send"


def stop_if_over(over_budget: OverBudget | None) -> None:
    """CheckFailed once the run's budget is reached: a boot can take half an hour, billed."""
    reason = over_budget() if over_budget is not None else None
    if reason:
        raise CheckFailed(
            f"stopped while acquiring: {reason}; everything launched is being torn down."
        )


def wait_until(
    check: Callable[[], T | None],
    deadline: float,
    what: str,
    timeout_s: float,
    poll_s: float,
    over_budget: OverBudget | None = None,
) -> T:
    """Poll `check` until it answers, or fail naming what never happened within the timeout
    (or, first, that the run's budget ran out meanwhile)."""
    while True:
        result = check()
        if result:
            return result
        stop_if_over(over_budget)
        if time.monotonic() >= deadline:
            raise InfraError(
                f"{what} within ready_timeout_s={timeout_s:g} s "
                "(everything launched is being torn down)"
            )
        time.sleep(poll_s)


class Executor:
    """Runs the program's calls in one mode (see the module docstring)."""

    def __init__(
        self,
        mode: Mode,
        settings: AwsSettings,
        client: Callable[[Service], BaseClient] | None = None,
        poll_s: float = 5.0,
        over_budget: OverBudget | None = None,
    ) -> None:
        self.mode = mode
        self.settings = settings
        self._client = client
        self.poll_s = poll_s
        self.over_budget = over_budget  # SEND: checked at every poll while acquiring
        self.printed: list[rq.ApiCall] = []  # PRINT: the calls, in order
        self.lines: list[str] = []  # CHECK: one line per lookup or call checked

    @property
    def sending(self) -> bool:
        return self.mode is Mode.SEND

    def _send(self, service: Service, operation: str, params: Params, doing: str, raw: bool) -> Any:
        assert self._client is not None, "PRINT mode sends nothing"
        method = getattr(self._client(service), snake(operation))
        try:
            return method(**params)
        except Exception as err:  # noqa: BLE001 - every AWS error gets the launcher's wording
            mine = err if raw else translate(err, doing, self.settings)
            if mine is err:  # not AWS's (an interrupt, a bug): as it is
                raise
            raise mine from err

    def read(
        self,
        service: Service,
        operation: str,
        params: Params,
        note: str,
        doing: str,
        raw: bool = False,
    ) -> Any:
        """A lookup: printed (returns None), or sent, also by --check."""
        if self.mode is Mode.PRINT:
            self.printed.append(rq.ApiCall(service, operation, params, note))
            return None
        return self._send(service, operation, params, doing, raw)

    def create(
        self,
        operation: str,
        params: Params,
        note: str,
        doing: str,
        *,
        dry_run: bool = True,
        raw: bool = False,
    ) -> Any:
        """An EC2 call that creates or changes something; its answer only when SEND.

        CHECK sends it with DryRun=True, or skips it when dry_run is False (it needs a resource
        that only a real launch would have created).
        """
        if self.mode is Mode.PRINT:
            self.printed.append(rq.ApiCall("ec2", operation, params, note))
            return None
        if self.mode is Mode.SEND:
            return self._send("ec2", operation, params, doing, raw)
        if not dry_run:
            return None
        try:
            self._send("ec2", operation, {**params, "DryRun": True}, doing, raw=True)
        except Exception as err:  # noqa: BLE001
            if error_code(err) != "DryRunOperation":
                raise translate(err, f"{operation} with DryRun=True", self.settings) from err
            self.lines.append(f"ok   {operation} (DryRun: would succeed)")
        else:
            self.lines.append(f"ok   {operation} (the endpoint accepted it without DryRun checks)")
        return None

    def poll(
        self,
        operation: str,
        params: Params,
        note: str,
        doing: str,
        until: Callable[[Any], T | None],
        what: str,
        deadline: float,
    ) -> T | None:
        """An EC2 lookup repeated until `until` answers: printed once, not sent by --check."""
        if self.mode is Mode.PRINT:
            self.printed.append(rq.ApiCall("ec2", operation, params, note))
            return None
        if self.mode is Mode.CHECK:
            return None
        return wait_until(
            lambda: until(self._send("ec2", operation, params, doing, raw=False)),
            deadline,
            what,
            self.settings.ready_timeout_s,
            self.poll_s,
            self.over_budget,
        )

    def checked(self, line: str) -> None:
        """A line of `--check`'s answer (ignored in the other modes)."""
        if self.mode is Mode.CHECK:
            self.lines.append(line)


@dataclass
class Launch:
    """What a launch knows, step by step: the settings, then each answer (or its placeholder).

    The callables are the launch's hands (SEND only): the cluster passes them in, so the steps
    stay free of SSH and of the cluster's own bookkeeping.
    """

    recipe: Recipe
    s: AwsSettings
    run_id: str
    owner: str
    now: Callable[[], datetime]
    launch_id: str = rq.placeholder("launch id")  # drawn anew for each launch (AwsCluster)
    target: str | None = None  # an existing instance: nothing is created
    region: str | None = None
    operator_cidr: str | None = None
    state: AwsState | None = None  # SEND only: every id written the moment it exists
    key_dir: Path | None = None
    log: Callable[[str], Any] = lambda _line: None
    ami_resolver: Callable[[str], str] | None = None  # stands in for SSM (tests)
    make_node: Callable[..., Node] | None = None  # (instance, index, launched, ami, identity, via=)
    wait_ssh: Callable[[list[Node], float], None] | None = None  # (nodes, deadline)
    record_launch: Callable[[], None] | None = None  # SEND: who this launch is, before creating
    bake: bool = False  # `reproduce image bake`'s own instance: no GPUs to check against the recipe
    account: str | None = None
    facts: InstanceType | None = None
    ami_id: str = ""
    root_device: str = ""
    zone: str | None = None
    subnets: list[dict[str, Any]] = field(default_factory=list)  # placeholders until SEND
    cidr: str = ""
    tags: list[TagTypeDef] = field(default_factory=list)
    group_id: str = ""
    key_name: str | None = None
    identity_file: str | None = None
    placement_group: str | None = None
    interfaces: int = 1
    instances: list[InstanceTypeDef] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    deadline: float = 0.0

    def save(self, **fields: object) -> None:
        if self.state is not None:
            self.state.set(**fields)

    @property
    def ids(self) -> list[str]:
        return [i["InstanceId"] for i in self.instances]
