"""The runner's release on the paths where money leaks: a cancel (asked for, or forced by the budget)
that cannot stop everything on the node must still end the paid node, and a teardown that fails
after the run failed must not hide why the run failed. A paid cluster stand-in on this host (the
node is a local process group; its release is recorded), no network."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from infra.nodescript import script

from launcher.budget import Budget
from launcher.clusters.base import CommandResult, Node
from launcher.clusters.local import LocalCluster, LocalTransport
from launcher.errors import InfraError
from launcher.execute import execute
from launcher.rundir import RunDir


class StubbornTransport(LocalTransport):
    """The node's cancel leaves the run's container behind (docker rm failed), so the cancel fails."""

    def run(
        self, command: str, *, timeout_s: float | None = None, check: bool = True
    ) -> CommandResult:
        if "touch cancelled" in command:
            return CommandResult(0, "left: container reproduce-x\n", "")
        return super().run(command, timeout_s=timeout_s, check=check)


class PaidCluster(LocalCluster):
    """A node that costs money until release() ends it (as an AWS instance does)."""

    name = "paid"

    def __init__(
        self, transport_cls=LocalTransport, acquire_error=None, release_error=None
    ) -> None:
        super().__init__()
        self.released = 0
        self.transport_cls = transport_cls
        self.acquire_error = acquire_error
        self.release_error = release_error

    def acquire(self) -> list[Node]:
        if self.acquire_error:
            raise self.acquire_error
        return super().acquire()

    def transport(self, node: Node):
        return self.transport_cls(node.name)

    def release(self) -> None:
        self.released += 1
        if self.release_error:
            raise self.release_error


def _job(tmp_path: Path, body: str):
    rd = RunDir.create(tmp_path / "runs", "test/paid")
    node_dir = str(tmp_path / "node" / rd.run_id)
    container = f"reproduce-{rd.run_id}"
    return rd, node_dir, container, script(rd.run_id, node_dir, container, body)


def _kill_node_run(node_dir: str) -> None:
    try:
        pid = int(Path(node_dir, "pid").read_text())
        os.killpg(pid, signal.SIGKILL)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        pass


def test_budget_reached_and_cancel_failing_still_ends_the_paid_node(tmp_path):
    rd, node_dir, container, text = _job(tmp_path, "_mark train start\nsleep 300\n")
    cluster = PaidCluster(StubbornTransport)
    budget = Budget(max_usd=None, max_hours=1e-9, price_per_hour=63.296)
    try:
        with pytest.raises(InfraError):
            execute(
                cluster,
                node_script=text,
                run_id=rd.run_id,
                node_run_dir=node_dir,
                container=container,
                run_dir=rd,
                scripts_dir=None,
                poll_s=0.05,
                measure=False,
                budget=budget,
            )
    finally:
        _kill_node_run(node_dir)
    assert cluster.released == 1  # past --max-hours: the node is ended, not kept running at $63/h


def test_a_chosen_cancel_that_fails_still_ends_the_paid_node(tmp_path, monkeypatch):
    rd, node_dir, container, text = _job(tmp_path, "_mark train start\nsleep 300\n")
    cluster = PaidCluster(StubbornTransport)
    from launcher import execute as ex

    real_follow = ex.Follower.follow
    calls = []

    def follow_then_ctrl_c(self):  # Ctrl-C once the run is going
        if not calls:
            calls.append(1)
            raise KeyboardInterrupt
        return real_follow(self)

    monkeypatch.setattr(ex.Follower, "follow", follow_then_ctrl_c)
    try:
        with pytest.raises(InfraError):
            execute(
                cluster,
                node_script=text,
                run_id=rd.run_id,
                node_run_dir=node_dir,
                container=container,
                run_dir=rd,
                scripts_dir=None,
                poll_s=0.05,
                measure=False,
                on_interrupt="cancel",
            )
    finally:
        _kill_node_run(node_dir)
    assert cluster.released == 1  # the user chose cancel, not detach: the paid node is ended


def test_a_failing_teardown_does_not_hide_why_the_run_failed(tmp_path, capsys):
    rd, node_dir, container, text = _job(tmp_path, "echo hi\n")
    cluster = PaidCluster(
        acquire_error=InfraError("SSH on 203.0.113.9:22 (i-0abc) never answered"),
        release_error=InfraError(
            "teardown did not finish; still allocated in us-east-1: "
            "security group sg-1. End them with `reproduce down RUN`"
        ),
    )
    with pytest.raises(InfraError) as err:
        execute(
            cluster,
            node_script=text,
            run_id=rd.run_id,
            node_run_dir=node_dir,
            container=container,
            run_dir=rd,
            scripts_dir=None,
            poll_s=0.05,
            measure=False,
        )
    shown = str(err.value) + capsys.readouterr().err
    assert (
        "still allocated" in shown and "reproduce down" in shown
    )  # what is left, and how to end it
    assert "SSH on 203.0.113.9:22 (i-0abc) never answered" in shown  # and why the run failed


class UnreachableTransport(LocalTransport):
    def run(
        self, command: str, *, timeout_s: float | None = None, check: bool = True
    ) -> CommandResult:
        raise InfraError("cannot connect to 203.0.113.9:22: timed out")


def _detach_on_first_follow(monkeypatch) -> None:
    """The first follow is interrupted (Ctrl-C, answered "detach"); later ones (attach) follow for real."""
    from launcher import execute as ex

    real_follow = ex.Follower.follow
    calls = []

    def follow(self):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_follow(self)

    monkeypatch.setattr(ex.Follower, "follow", follow)


def test_reproduce_cancel_of_an_unreachable_node_still_ends_it(tmp_path, monkeypatch):
    from launcher import execute as ex

    rd, node_dir, container, text = _job(tmp_path, "_mark train start\nsleep 300\n")
    _detach_on_first_follow(monkeypatch)
    try:
        with pytest.raises(Exception):
            execute(
                PaidCluster(),
                node_script=text,
                run_id=rd.run_id,
                node_run_dir=node_dir,
                container=container,
                run_dir=rd,
                scripts_dir=None,
                poll_s=0.05,
                measure=False,
                on_interrupt="detach",
            )
    finally:
        _kill_node_run(node_dir)
    assert rd.status()["state"] == "detached"
    later = PaidCluster(UnreachableTransport)  # the node no longer answers SSH
    monkeypatch.setattr(ex, "cluster_from_record", lambda record: later)
    with pytest.raises(InfraError):
        ex.cancel(str(rd.path))
    assert later.released == 1  # `reproduce cancel` ends the paid node even when SSH to it is gone


def test_a_lost_node_says_it_keeps_billing_and_how_to_end_it(tmp_path, monkeypatch):
    """Losing the connection keeps the node (the run may go on): the user is told its cost and `reproduce down`."""
    from launcher import execute as ex
    from launcher.budget import Budget

    class BilledCluster(PaidCluster):
        def down_command(self) -> str:
            return "reproduce down RUN"

    def lose_the_node(self):
        raise InfraError("the connection to node0 was lost for 60 s")

    monkeypatch.setattr(ex.Follower, "follow", lose_the_node)
    rd, node_dir, container, text = _job(tmp_path, "_mark train start\nsleep 300\n")
    cluster = BilledCluster()
    try:
        with pytest.raises(InfraError) as err:
            execute(
                cluster,
                node_script=text,
                run_id=rd.run_id,
                node_run_dir=node_dir,
                container=container,
                run_dir=rd,
                scripts_dir=None,
                poll_s=0.05,
                measure=False,
                budget=Budget(None, 10, 63.296, 1),
            )
    finally:
        _kill_node_run(node_dir)
    assert cluster.released == 0 and rd.status()["state"] == "detached"
    text = str(err.value)
    assert (
        "keeps billing (about $63.30/h)" in text
        and "`reproduce down RUN`" in text
        and "reproduce attach" in text
    )


def test_the_budget_still_holds_after_a_reattach(tmp_path, monkeypatch):
    from launcher import execute as ex
    from launcher.budget import Budget
    from launcher.errors import CheckFailed

    rd, node_dir, container, text = _job(tmp_path, "_mark train start\nsleep 300\n")
    _detach_on_first_follow(monkeypatch)
    try:
        with pytest.raises(Exception):
            execute(
                PaidCluster(),
                node_script=text,
                run_id=rd.run_id,
                node_run_dir=node_dir,
                container=container,
                run_dir=rd,
                scripts_dir=None,
                poll_s=0.05,
                measure=False,
                on_interrupt="detach",
                budget=Budget(None, 0.0005, 63.296, 1),
            )  # 1.8 s of wall-clock time
        assert rd.status()["state"] == "detached"
        later = PaidCluster()
        monkeypatch.setattr(ex, "cluster_from_record", lambda record: later)
        with pytest.raises(CheckFailed, match="--max-hours"):
            ex.attach(str(rd.path), poll_s=0.05, measure=False, on_interrupt="cancel")
    finally:
        _kill_node_run(node_dir)
    assert later.released == 1 and rd.status()["state"] == "cancelled"


def test_a_teardown_that_fails_once_still_judges_the_run_and_retries(tmp_path):
    """The first release fails, the run is still measured and judged, the retry ends the node."""
    from cli_support import SEED

    from launcher.recipe import load_recipe

    class FlakyTeardown(PaidCluster):
        def release(self) -> None:
            self.released += 1
            if self.released == 1:
                raise InfraError("TerminateInstances: RequestLimitExceeded")

    standin = Path(__file__).parent / "standin_miles" / "train.py"
    rd, node_dir, container, text = _job(
        tmp_path, f"_mark train start\npython3 {standin} --num-rollout 20\n"
    )
    cluster = FlakyTeardown()
    outcome = execute(
        cluster,
        node_script=text,
        run_id=rd.run_id,
        node_run_dir=node_dir,
        container=container,
        run_dir=rd,
        scripts_dir=None,
        poll_s=0.05,
        recipe_raw=load_recipe(SEED).raw,
    )
    assert outcome.state == "done" and outcome.measurement[1].status == "reproduced"
    assert cluster.released >= 2  # retried, and the retry went through: nothing is reported left
    assert (rd.path / "verdict.json").exists()
