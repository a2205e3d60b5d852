"""The SSH jump: a node with only a private address, reached through its head (two real sshd).

The head is the session's sshd on 127.0.0.1; the worker is another sshd listening on 127.0.0.2
only, with its own host key. The launcher dials the head alone: every connection it opens is
recorded, and the worker's SSH connection runs inside a `direct-tcpip` channel of the head's.
"""

from __future__ import annotations

import socket
import time

import pytest
from support.aws import closed_port, loopback_sshd

from launcher.clusters.base import Node
from launcher.clusters.ssh import SSHSettings, SSHTransport
from launcher.errors import InfraError

pytestmark = [pytest.mark.ssh, pytest.mark.aws]
WORKER_ADDRESS = "127.0.0.2"


@pytest.fixture(scope="module")
def worker_sshd(tmp_path_factory, sshd):
    root = tmp_path_factory.mktemp("worker-sshd")
    server = loopback_sshd(root, WORKER_ADDRESS, user_key=sshd.identity_file)
    yield server
    server.stop()


def _transports(sshd, worker_sshd, *, worker_pin=None, worker_port=None):
    head = Node("node0", "10.0.0.4", connect_host="127.0.0.1", port=sshd.port, user=sshd.user)
    worker = Node(
        "node1", WORKER_ADDRESS, port=worker_port or worker_sshd.port, user=sshd.user, via=head
    )

    def settings(node: Node, pin: str) -> SSHSettings:
        return SSHSettings(
            host=node.host,
            port=node.port,
            user=node.user,
            identity_file=str(sshd.identity_file),  # the same user key on both
            connect_timeout_s=3,
            io_timeout_s=5,
            host_key_fingerprint=pin,
        )

    head_t = SSHTransport(head, settings(head, sshd.host_fingerprint))
    pin = worker_pin or worker_sshd.host_fingerprint
    return head_t, SSHTransport(worker, settings(worker, pin), jump=head_t)


@pytest.fixture
def dialled(monkeypatch):
    """Every TCP connection this process opens (the jump's channel is not one)."""
    seen: list[tuple[str, int]] = []
    real = socket.create_connection

    def record(address, *args, **kw):
        seen.append((address[0], int(address[1])))
        return real(address, *args, **kw)

    monkeypatch.setattr(socket, "create_connection", record)
    return seen


def test_the_worker_is_reached_only_through_the_head(sshd, worker_sshd, dialled, tmp_path):
    head, worker = _transports(sshd, worker_sshd)
    try:
        assert worker.run("hostname -I >/dev/null; echo $SSH_CONNECTION").stdout.split()[2:] == [
            WORKER_ADDRESS,
            str(worker_sshd.port),
        ]  # the worker's sshd answered, on its own address
        target = tmp_path / "w" / "f.txt"
        worker.put_text("through the head\n", str(target), mode=0o600)  # SFTP inside the channel
        assert worker.read_from(str(target), 8) == b"the head\n"
        worker.get(str(target), tmp_path / "back.txt")
        assert (tmp_path / "back.txt").read_text() == "through the head\n"
        assert head.run("echo head").stdout == "head\n"
        # one TCP connection from the launcher, to the head; none to the worker
        assert dialled == [("127.0.0.1", sshd.port)]
    finally:
        worker.close()
        head.close()


def test_the_worker_host_key_is_checked_on_its_own(sshd, worker_sshd):
    """The head's pin says nothing about the worker: a wrong key for the worker is refused."""
    _head, worker = _transports(sshd, worker_sshd, worker_pin=sshd.host_fingerprint)
    try:
        with pytest.raises(InfraError, match="refusing to connect") as err:
            worker.connect()
        assert worker_sshd.host_fingerprint in str(err.value)
    finally:
        worker.close()
        _head.close()


def test_a_worker_the_head_cannot_reach_is_named_with_the_path(sshd, worker_sshd):
    head, worker = _transports(sshd, worker_sshd, worker_port=closed_port())
    try:
        started = time.monotonic()
        with pytest.raises(InfraError) as err:
            worker.run("true")
        text = str(err.value)
        assert "through node0" in text and "node0 could not open a connection" in text, text
        assert err.value.exit_code == 3 and time.monotonic() - started < 10
        assert head.run("echo fine").stdout == "fine\n"  # the head itself is not affected
    finally:
        worker.close()
        head.close()


def test_when_the_heads_connection_drops_the_worker_reconnects_through_a_new_one(sshd, worker_sshd):
    head, worker = _transports(sshd, worker_sshd)
    try:
        assert worker.run("echo one").stdout == "one\n"
        sshd.drop_connections()  # the head's connection dies, and the channel inside it
        time.sleep(0.2)
        outputs = []
        for _ in range(3):  # a call may see the broken connection; the next one reconnects
            try:
                outputs.append(worker.run("echo two").stdout)
                break
            except InfraError:
                time.sleep(0.2)
        assert outputs == ["two\n"]
    finally:
        worker.close()
        head.close()


def test_a_node_with_its_via_round_trips_through_its_record():
    from dataclasses import asdict

    head = Node("node0", "10.0.0.4", connect_host="203.0.113.9", meta={"instance_id": "i-1"})
    worker = Node("node1", "10.0.0.5", via=head)
    again = Node(**asdict(worker))
    assert again == worker and again.via == head and isinstance(again.via, Node)
