"""The runner's release on the paths where money leaks, driven through the real run path
(`Runner.execute`, `attach`, `cancel`): the paid node is released on success, failure, Ctrl-C and
a failed cancel; a teardown interrupted by Ctrl-C is finished; one that cannot finish says what is
left and how to end it, without hiding why the run failed. A paid cluster stand-in on this host
(the node is a local process group; its release is recorded), no network."""

from __future__ import annotations

import os
import signal
import sys
import types
from pathlib import Path

import pytest
from support.measure import seed_raw, standin_words
from support.nodescript import job
from support.paths import TESTS

from launcher import clusters
from launcher.clusters.base import CommandResult, Node
from launcher.clusters.contract import Backend, WithDownCommand, WithLeftovers
from launcher.clusters.local import LocalCluster, LocalTransport
from launcher.cost.budget import Budget
from launcher.errors import CheckFailed, InfraError, Interrupted
from launcher.plan import protocol
from launcher.runner.runner import Runner

SLEEPER = "_mark train start\nsleep 300\n"


class StubbornTransport(LocalTransport):
    """The node's cancel leaves the run's container behind (docker rm failed), so the cancel fails."""

    def run(
        self, command: str, *, timeout_s: float | None = None, check: bool = True
    ) -> CommandResult:
        if f"touch {protocol.CANCEL_MARK}" in command:
            return CommandResult(0, "left: container reproduce-x\n", "")
        return super().run(command, timeout_s=timeout_s, check=check)


class CtrlCTransport(LocalTransport):
    """The user presses Ctrl-C while the runner polls the running script (the first poll only)."""

    pressed = 0

    def run(
        self, command: str, *, timeout_s: float | None = None, check: bool = True
    ) -> CommandResult:
        if "echo alive" in command and not CtrlCTransport.pressed:
            CtrlCTransport.pressed += 1
            raise KeyboardInterrupt
        return super().run(command, timeout_s=timeout_s, check=check)


class StubbornCtrlCTransport(CtrlCTransport, StubbornTransport):
    pass


class LostTransport(LocalTransport):
    """Once the script runs, the node stops answering (the connection is gone)."""

    def run(
        self, command: str, *, timeout_s: float | None = None, check: bool = True
    ) -> CommandResult:
        if "echo alive" in command:
            raise InfraError("the connection to node0 was lost")
        return super().run(command, timeout_s=timeout_s, check=check)

    def read_from(self, remote: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        raise InfraError("the connection to node0 was lost")


class UnreachableTransport(LocalTransport):
    def run(
        self, command: str, *, timeout_s: float | None = None, check: bool = True
    ) -> CommandResult:
        raise InfraError("cannot connect to 203.0.113.9:22: timed out")


class PaidCluster(LocalCluster, WithLeftovers):
    """A node that costs money until release() ends it (as an AWS instance does)."""

    name = "paid"

    def __init__(
        self,
        transport_cls=LocalTransport,
        acquire_error=None,
        release_errors=(),
        left=(),
    ) -> None:
        super().__init__()
        self.released = 0  # release() calls
        self.ended = False  # a release() went through
        self.transport_cls = transport_cls
        self.acquire_error = acquire_error
        self.release_errors = list(release_errors)
        self.left = list(left)

    def acquire(self) -> list[Node]:
        if self.acquire_error:
            raise self.acquire_error
        return super().acquire()

    def transport(self, node: Node):
        return self.transport_cls(node.name)

    def release(self) -> None:
        self.released += 1
        if self.release_errors:  # one error per call, in order; then releases go through
            raise self.release_errors.pop(0)
        self.ended = True

    def leftovers(self) -> list[str]:
        return [] if self.ended else self.left

    def to_record(self) -> dict:
        return {"kind": "paid"}


class BilledCluster(PaidCluster, WithDownCommand):
    def down_command(self) -> str:
        return "reproduce down RUN"


@pytest.fixture(autouse=True)
def _fresh_ctrl_c():
    CtrlCTransport.pressed = 0


def _register(monkeypatch, later: PaidCluster) -> None:
    """Runs recorded with kind "paid" are found again (attach, cancel) as `later`."""

    class PaidBackend(Backend):
        kind = "paid"
        record_fields = {}  # noqa: RUF012 - its record is its kind alone

        def from_plan(self, plan, options, run_dir):
            raise AssertionError("a paid run is only found again here")

        def from_record(self, record, run_dir=None):
            return later

    backend = types.ModuleType("paid_backend")
    backend.BACKEND = PaidBackend()
    monkeypatch.setitem(sys.modules, "paid_backend", backend)
    monkeypatch.setitem(clusters.BACKENDS, "paid", "paid_backend")


def _job(tmp_path: Path, body: str = SLEEPER):
    return job(tmp_path / "runs", tmp_path / "node", body, slug="test/paid")


def _runner(**settings) -> Runner:
    settings.setdefault("measure", False)
    return Runner(poll_s=0.05, **settings)


def _kill_node_run(node_dir: str) -> None:
    try:
        pid = int(Path(node_dir, "pid").read_text())
        os.killpg(pid, signal.SIGKILL)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        pass


def test_the_paid_node_is_released_when_the_run_succeeds_and_when_it_fails(tmp_path):
    rd, plan = _job(tmp_path, "_mark train start\necho hi\n")
    ok = PaidCluster()
    assert _runner().execute(plan, rd, ok).state == "done"
    assert ok.ended and rd.timeline().released_at is not None
    rd, plan = _job(tmp_path, "_mark train start\necho 'CUDA error' >&2; exit 9\n")
    failing = PaidCluster()
    with pytest.raises(CheckFailed, match="exit code 9"):
        _runner().execute(plan, rd, failing)
    assert failing.ended


def test_budget_reached_and_cancel_failing_still_ends_the_paid_node(tmp_path):
    rd, plan = _job(tmp_path)
    cluster = PaidCluster(StubbornTransport)
    budget = Budget(max_usd=None, max_hours=1e-9, price_per_hour=63.296)
    try:
        with pytest.raises(InfraError):
            _runner().execute(plan, rd, cluster, budget=budget)
    finally:
        _kill_node_run(plan.node_run_dir)
    assert cluster.ended  # past --max-hours: the node is ended, not kept running at $63/h


def test_a_chosen_cancel_that_fails_still_ends_the_paid_node(tmp_path):
    rd, plan = _job(tmp_path)
    cluster = PaidCluster(StubbornCtrlCTransport)
    try:
        with pytest.raises(InfraError):
            _runner(on_interrupt="cancel").execute(plan, rd, cluster)
    finally:
        _kill_node_run(plan.node_run_dir)
    assert CtrlCTransport.pressed == 1
    assert cluster.ended  # the user chose cancel, not detach: the paid node is ended


def test_a_teardown_interrupted_by_ctrl_c_is_finished(tmp_path):
    rd, plan = _job(tmp_path, "_mark train start\necho hi\n")
    cluster = PaidCluster(release_errors=[KeyboardInterrupt()])
    outcome = _runner().execute(plan, rd, cluster)
    assert outcome.state == "done" and cluster.ended and cluster.released >= 2


def test_a_teardown_that_keeps_being_interrupted_names_what_is_left_and_the_command(tmp_path):
    rd, plan = _job(tmp_path, "_mark train start\necho hi\n")
    cluster = BilledCluster(release_errors=[KeyboardInterrupt()] * 10, left=["instance i-123"])
    with pytest.raises(InfraError) as err:
        _runner().execute(plan, rd, cluster)
    assert "instance i-123" in str(err.value) and "reproduce down RUN" in str(err.value)


def test_a_failing_teardown_does_not_hide_why_the_run_failed(tmp_path):
    rd, plan = _job(tmp_path, "echo hi\n")
    cluster = PaidCluster(
        acquire_error=InfraError("SSH on 203.0.113.9:22 (i-0abc) never answered"),
        release_errors=[
            InfraError(
                "teardown did not finish; still allocated in us-east-1: "
                "security group sg-1. End them with `reproduce down RUN`"
            )
        ]
        * 10,
    )
    with pytest.raises(InfraError) as err:
        _runner().execute(plan, rd, cluster)
    shown = str(err.value)
    assert "still allocated" in shown and "reproduce down" in shown  # what is left, how to end it
    assert "SSH on 203.0.113.9:22 (i-0abc) never answered" in shown  # and why the run failed
    assert err.value.exit_code == 3


def test_a_ctrl_c_cancel_with_a_failing_teardown_says_both(tmp_path):
    rd, plan = _job(tmp_path)
    cluster = PaidCluster(CtrlCTransport, release_errors=[InfraError("could not delete sg-1")] * 10)
    try:
        with pytest.raises(InfraError) as err:
            _runner(on_interrupt="cancel").execute(plan, rd, cluster)
    finally:
        _kill_node_run(plan.node_run_dir)
    assert "cancelled" in str(err.value) and "sg-1" in str(err.value)
    assert rd.status()["state"] == "cancelled"


def test_reproduce_cancel_of_an_unreachable_node_still_ends_it(tmp_path, monkeypatch):
    rd, plan = _job(tmp_path)
    try:
        with pytest.raises(Interrupted):
            _runner(on_interrupt="detach").execute(plan, rd, PaidCluster(CtrlCTransport))
    finally:
        _kill_node_run(plan.node_run_dir)
    assert rd.status()["state"] == "detached"
    later = PaidCluster(UnreachableTransport)  # the node no longer answers SSH
    _register(monkeypatch, later)
    with pytest.raises(InfraError):
        _runner().cancel(str(rd.path))
    assert later.ended  # `reproduce cancel` ends the paid node even when SSH to it is gone


def test_a_lost_node_says_it_keeps_billing_and_how_to_end_it(tmp_path):
    """Losing the connection keeps the node (the run may go on): its cost and `reproduce down`."""
    rd, plan = _job(tmp_path)
    cluster = BilledCluster(LostTransport)
    try:
        with pytest.raises(InfraError) as err:
            _runner(reconnect_s=0.3).execute(plan, rd, cluster, budget=Budget(None, 10, 63.296, 1))
    finally:
        _kill_node_run(plan.node_run_dir)
    assert cluster.released == 0 and rd.status()["state"] == "detached"
    text = str(err.value)
    assert (
        "keeps billing (about $63.30/h)" in text
        and "`reproduce down RUN`" in text
        and "reproduce attach" in text
    )


def test_the_budget_still_holds_after_a_reattach(tmp_path, monkeypatch):
    rd, plan = _job(tmp_path)
    try:
        with pytest.raises(Interrupted):
            _runner(on_interrupt="detach").execute(
                plan, rd, PaidCluster(CtrlCTransport), budget=Budget(None, 0.0005, 63.296, 1)
            )  # 1.8 s of wall-clock time
        assert rd.status()["state"] == "detached"
        later = PaidCluster()
        _register(monkeypatch, later)
        with pytest.raises(CheckFailed, match="--max-hours"):
            _runner(on_interrupt="cancel").attach(str(rd.path))
    finally:
        _kill_node_run(plan.node_run_dir)
    assert later.ended and rd.status()["state"] == "cancelled"


def test_a_teardown_that_fails_once_still_judges_the_run_and_retries(tmp_path):
    """The first release fails, the run is still measured and judged, the retry ends the node."""
    standin = TESTS / "standin_miles" / "train.py"
    rd, plan = _job(tmp_path, f"_mark train start\npython3 {standin} {standin_words(seed_raw())}\n")
    cluster = PaidCluster(release_errors=[InfraError("TerminateInstances: RequestLimitExceeded")])
    outcome = _runner(measure=True).execute(plan, rd, cluster)
    assert outcome.state == "done" and outcome.measurement[1].status == "reproduced"
    assert cluster.ended and cluster.released >= 2  # retried; nothing is reported left
    assert (rd.path / "verdict.json").exists()
