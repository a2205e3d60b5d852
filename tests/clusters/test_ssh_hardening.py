"""Connections that break badly, for real: a TCP proxy between paramiko and sshd on 127.0.0.1
that stops forwarding (SIGSTOP: TCP stays up, nothing comes back: a half-open or black-holed
connection) or dies. No operation may block for ever: the reconnect window, the budget check, the
release and the unattended policy still run; a connection that drops after the run succeeded is
reconnected for collection instead of failing the run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.helpers import cli, group_alive, slow_script_body, wait_for
from support.nodescript import job
from support.proxy import Proxy

from launcher.clusters.base import Node
from launcher.clusters.local import LocalTransport
from launcher.clusters.ssh import ConnectionLost, SSHCluster, SSHTransport
from launcher.cost.budget import Budget
from launcher.errors import InfraError
from launcher.plan import protocol
from launcher.records.rundir import RunDir
from launcher.runner.runner import Runner

pytestmark = pytest.mark.ssh


@pytest.fixture
def proxy(sshd):
    p = Proxy(sshd.port).start()
    yield p
    p.thaw()
    p.kill()


def _profile(sshd, proxy: Proxy, **overrides: Any) -> dict:
    """sshd reached through the proxy: the host key is pinned (known_hosts names sshd's port)."""
    return sshd.profile(
        port=proxy.port,
        host_key_fingerprint=sshd.host_fingerprint,
        connect_timeout_s=1,
        io_timeout_s=2,
        **overrides,
    )


def _in_thread(action: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = action()
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def _finish_on_node(rd: RunDir, node_dir: str, container: str) -> None:
    """Whatever a test left going on this host (the node) is stopped."""
    if (rd.path / "run.json").exists() and rd.record().get("pid"):
        LocalTransport().run(protocol.cancel_command(node_dir, container), check=False)


class Recorder:
    """A reporter that keeps what it was told (the runner's events, in order)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, text: str) -> None:
        self.lines.append(text)

    def stage(self, name: str, event: str, status: str) -> None:
        return None

    def step(self, done: int, total: int | None) -> None:
        return None

    def warn(self, text: str) -> None:
        self.lines.append(text)

    def choose(self) -> str:
        return "cancel"


class CountingCluster(SSHCluster):
    """The real SSH cluster; counts its releases."""

    releases = 0

    def release(self) -> None:
        self.releases += 1
        super().release()


def test_commands_and_sftp_give_up_on_a_frozen_connection(sshd, proxy, tmp_path: Path) -> None:
    cluster = SSHCluster.from_profile(_profile(sshd, proxy))
    t = cluster.transport(cluster.acquire()[0])
    target = tmp_path / "f.txt"
    t.put_text("hello\n", str(target))
    assert t.read_from(str(target), 0) == b"hello\n"
    proxy.freeze()
    try:
        for name, action in (
            ("read_from", lambda: t.read_from(str(target), 0)),
            ("run", lambda: t.run("echo hi")),
            ("put_text", lambda: t.put_text("x", str(tmp_path / "g.txt"))),
        ):
            t0 = time.monotonic()
            thread, box = _in_thread(action)
            thread.join(15)
            assert not thread.is_alive(), f"{name} blocked on a frozen connection"
            # the first finds the connection silent; the next ones cannot reconnect (no banner)
            expected = ConnectionLost if name == "read_from" else InfraError
            assert isinstance(box.get("error"), expected), (name, box)
            assert time.monotonic() - t0 < 6, name  # io_timeout_s=2 (+ connect_timeout_s=1)
    finally:
        proxy.thaw()
        cluster.release()


def test_a_frozen_connection_mid_run_ends_within_the_reconnect_window(sshd, proxy, tmp_path):
    rd, plan = job(tmp_path / "runs", tmp_path / "node", slow_script_body(lines=120, delay_s=0.05))
    cluster = SSHCluster.from_profile(_profile(sshd, proxy))
    runner = Runner(measure=False, poll_s=0.1, reconnect_s=3)
    thread, box = _in_thread(lambda: runner.execute(plan, rd, cluster))
    try:
        wait_for(lambda: (rd.logs / "train.log").stat().st_size > 3000, what="streamed output")
        proxy.freeze()
        t0 = time.monotonic()
        thread.join(40)
        assert not thread.is_alive(), "the runner blocked on a frozen connection"
        assert time.monotonic() - t0 < 25
        err = box.get("error")
        assert isinstance(err, InfraError) and "reproduce attach" in str(err), box
        assert rd.status()["state"] == "detached"  # interactive: the run goes on, as before
        assert group_alive(rd.record()["pid"])
        proxy.thaw()  # the network is back: attach finishes the run exactly
        result = cli("attach", str(rd.path))
        assert result.returncode == 0, result.stderr
        assert (rd.logs / "node.log").read_bytes() == Path(
            plan.node_run_dir, "node.log"
        ).read_bytes()
    finally:
        proxy.thaw()
        thread.join(30)
        _finish_on_node(rd, plan.node_run_dir, plan.container)


def test_the_budget_is_checked_while_the_node_does_not_answer(sshd, proxy, tmp_path):
    body = "_mark train start\nfor i in $(seq 600); do echo tick $i; sleep 0.1; done\n"
    rd, plan = job(tmp_path / "runs", tmp_path / "node", body)
    cluster = CountingCluster.from_profile(_profile(sshd, proxy))
    reporter = Recorder()
    runner = Runner(reporter, measure=False, poll_s=0.1, reconnect_s=120)
    budget = Budget(max_usd=None, max_hours=10 / 3600, price_per_hour=63.296)
    thread, box = _in_thread(lambda: runner.execute(plan, rd, cluster, budget=budget))
    try:
        wait_for(lambda: b"tick 5" in (rd.logs / "train.log").read_bytes(), what="training")
        proxy.freeze()  # the node stops answering well before the 10 s budget is spent
        assert not any("budget reached" in line for line in reporter.lines)
        thread.join(60)
        assert not thread.is_alive(), "the runner blocked on a frozen connection"
        # the budget stopped it during the reconnect window (120 s), not at the end of it; the
        # frozen node cannot be cancelled, so the cluster is released all the same
        assert any("budget reached" in line for line in reporter.lines), reporter.lines
        err = box.get("error")
        assert isinstance(err, InfraError) and "could not cancel the run" in str(err), box
        assert time.time() - rd.timeline().acquired_at < 40
        assert cluster.releases >= 1 and rd.timeline().released_at is not None
    finally:
        proxy.thaw()
        thread.join(30)
        _finish_on_node(rd, plan.node_run_dir, plan.container)


def test_an_unattended_run_cancels_and_releases_a_lost_node(sshd, proxy, tmp_path):
    body = "_mark train start\nfor i in $(seq 600); do echo tick $i; sleep 0.1; done\n"
    rd, plan = job(tmp_path / "runs", tmp_path / "node", body)
    cluster = CountingCluster.from_profile(_profile(sshd, proxy))
    runner = Runner(measure=False, poll_s=0.1, reconnect_s=3, unattended=True)
    thread, box = _in_thread(lambda: runner.execute(plan, rd, cluster))
    try:
        wait_for(lambda: b"tick 5" in (rd.logs / "train.log").read_bytes(), what="training")
        proxy.freeze()
        thread.join(60)
        assert not thread.is_alive()
        err = box.get("error")
        assert isinstance(err, InfraError) and "Unattended run" in str(err), box
        assert cluster.releases >= 1 and rd.timeline().released_at is not None
        assert rd.status()["state"] == "failed"  # not "detached": nobody will reattach
    finally:
        proxy.thaw()
        thread.join(30)
        _finish_on_node(rd, plan.node_run_dir, plan.container)


def test_a_connection_lost_after_the_run_succeeded_is_reconnected_for_collection(
    sshd, proxy, tmp_path
):
    body = (
        '_mark train start; echo "step done"; _mark train end ok\n'
        'echo \'{"ok": true}\' > "$NODE_RUN_DIR/preflight.json"\n'
    )
    rd, plan = job(tmp_path / "runs", tmp_path / "node", body)
    cancelled_check = protocol.cancelled_command(plan.node_run_dir)
    dropped: list[float] = []

    class DroppingTransport(SSHTransport):
        """The real transport; the path to the node dies the moment the run's end is checked,
        and comes back a second later."""

        def run(self, command: str, **kw: Any):
            if command == cancelled_check and not dropped:
                dropped.append(time.monotonic())
                proxy.kill()
                back.start()
            return super().run(command, **kw)

    class DroppingCluster(SSHCluster):
        def transport(self, node: Node) -> SSHTransport:
            for existing in self._transports:
                if existing.node == node:
                    return existing
            transport = DroppingTransport(node, self.settings)
            self._transports.append(transport)
            return transport

    back = threading.Timer(1.0, proxy.start)
    cluster = DroppingCluster.from_profile(_profile(sshd, proxy))
    try:
        outcome = Runner(measure=False, poll_s=0.1, reconnect_s=20).execute(plan, rd, cluster)
    finally:
        if back.is_alive():
            back.join()  # the proxy fixture ends the proxy it started
    assert dropped, "the connection was never dropped"
    assert outcome.state == "done" and rd.status()["state"] == "done"
    assert (rd.path / "preflight.json").read_text() == '{"ok": true}\n'  # collected after all
    assert rd.record()["collected"] == ["preflight.json"]


def test_secrets_land_0600_over_ssh_and_are_gone_after_the_run(sshd, tmp_path):
    body = '_mark train start; stat -c "mode %a" .secrets.env 2>&1 || true\n'
    rd, plan = job(tmp_path / "runs", tmp_path / "node", body)
    cluster = SSHCluster.from_profile(sshd.profile())
    Runner(measure=False, poll_s=0.1).execute(plan, rd, cluster, secrets={"HF_TOKEN": "hf_x"})
    assert (rd.logs / "train.log").read_text() == "mode 600\n"
    assert not Path(plan.node_run_dir, ".secrets.env").exists()
