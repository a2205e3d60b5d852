"""SSH transport against a real OpenSSH server on 127.0.0.1: commands, files, offsets, host keys,
refused keys and unreachable hosts (exit 3 within the connect timeout)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from support.sshd import keygen

from launcher.clusters.ssh import SSHCluster, SSHSettings
from launcher.errors import BadInput, InfraError

pytestmark = pytest.mark.ssh


def _cluster(sshd, **overrides) -> SSHCluster:
    return SSHCluster.from_profile(sshd.profile(**overrides))


def test_commands_files_and_reads_by_offset(sshd, tmp_path):
    cluster = _cluster(sshd)
    node = cluster.acquire()[0]
    t = cluster.transport(node)
    try:
        res = t.run("echo out; echo err >&2; exit 3", check=False)
        assert (res.exit_code, res.stdout, res.stderr) == (3, "out\n", "err\n")
        with pytest.raises(InfraError, match="exit 4"):
            t.run("exit 4")
        target = tmp_path / "remote" / "deep" / "f.txt"
        t.put_text("héllo\nworld\n", str(target), mode=0o640)
        assert target.read_text() == "héllo\nworld\n" and (target.stat().st_mode & 0o777) == 0o640
        assert t.read_from(str(target), 7) == b"world\n"
        assert t.read_from(str(target), 100) == b""
        assert t.read_from(str(tmp_path / "missing"), 0) == b""
        big = bytes(range(256)) * 8192  # 2 MiB, binary
        src = tmp_path / "big.bin"
        src.write_bytes(big)
        t.put(src, str(tmp_path / "remote" / "big.bin"))
        assert t.read_from(str(tmp_path / "remote" / "big.bin"), 1000, 5000) == big[1000:6000]
        t.get(str(tmp_path / "remote" / "big.bin"), tmp_path / "back.bin")
        assert (tmp_path / "back.bin").read_bytes() == big
        quoted = 'it\'s a "test" $HOME `x`'
        assert t.run(f"printf %s {__import__('shlex').quote(quoted)}").stdout == quoted
    finally:
        cluster.release()


def test_many_files_into_one_directory_make_it_once_and_again_when_it_is_gone(sshd, tmp_path):
    """Staging puts a dozen files into a few directories: one `mkdir -p` per directory (each
    command is a channel and a shell on the node); a directory removed since is made again."""
    cluster = _cluster(sshd)
    t = cluster.transport(cluster.acquire()[0])
    commands: list[str] = []
    run = t.run

    def counting(command, **kw):
        commands.append(command)
        return run(command, **kw)

    t.run = counting  # type: ignore[method-assign]
    try:
        remote = tmp_path / "remote" / "scripts"
        for i in range(6):
            t.put_text(f"file {i}\n", str(remote / f"f{i}.py"), mode=0o644)
        assert sum(c.startswith("mkdir -p") for c in commands) == 1, commands
        assert sorted(p.name for p in remote.iterdir()) == [f"f{i}.py" for i in range(6)]
        run(f"rm -rf {remote}")  # gone behind the transport's back
        src = tmp_path / "local.bin"
        src.write_bytes(b"x" * 1000)
        t.put(src, str(remote / "again.bin"), mode=0o600)
        assert (remote / "again.bin").read_bytes() == b"x" * 1000
        assert sum(c.startswith("mkdir -p") for c in commands) == 2
    finally:
        cluster.release()


def test_reconnects_after_the_connection_drops(sshd):
    cluster = _cluster(sshd)
    t = cluster.transport(cluster.acquire()[0])
    try:
        assert t.run("echo one").stdout == "one\n"
        before = set(sshd.session_pids())
        assert sshd.drop_connections() >= 1
        time.sleep(0.2)
        outputs = []
        for _ in range(
            3
        ):  # a call may see the broken connection (ConnectionLost); the next reconnects
            try:
                outputs.append(t.run("echo two").stdout)
                break
            except InfraError:
                time.sleep(0.2)
        assert outputs == ["two\n"]
        assert not before & set(sshd.session_pids())  # a new connection, not the old one
    finally:
        cluster.release()


def test_unknown_host_key_is_refused_unless_accepted(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(InfraError, match="not in .*refusing an unknown host") as err:
        _cluster(sshd, known_hosts=str(empty)).acquire()
    assert err.value.exit_code == 3 and sshd.host_fingerprint in str(err.value)
    cluster = _cluster(sshd, known_hosts=str(empty), accept_unknown_host=True)
    cluster.acquire()
    cluster.release()
    assert f"[127.0.0.1]:{sshd.port} ssh-ed25519 " in empty.read_text()  # recorded, like accept-new
    _cluster(sshd, known_hosts=str(empty)).acquire()  # now known


def test_changed_host_key_is_refused_even_when_accepting_new_ones(sshd, tmp_path):
    other = tmp_path / "other_key"
    keygen(other)
    kind, blob = (tmp_path / "other_key.pub").read_text().split()[:2]
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    with pytest.raises(InfraError, match="does not match"):
        _cluster(sshd, known_hosts=str(wrong), accept_unknown_host=True).acquire()


def test_pinned_fingerprint(sshd, tmp_path):
    nowhere = str(tmp_path / "no_known_hosts")
    cluster = _cluster(sshd, known_hosts=nowhere, host_key_fingerprint=sshd.host_fingerprint)
    cluster.acquire()
    cluster.release()
    with pytest.raises(InfraError, match="pins SHA256:AAAA"):
        _cluster(sshd, known_hosts=nowhere, host_key_fingerprint="SHA256:" + "A" * 43).acquire()


def test_refused_key_is_a_clear_exit_3(sshd, tmp_path):
    stranger = tmp_path / "stranger"
    keygen(stranger)
    t0 = time.monotonic()
    with pytest.raises(InfraError, match="refused the key") as err:
        _cluster(sshd, identity_file=str(stranger)).acquire()
    assert err.value.exit_code == 3 and time.monotonic() - t0 < 5


def test_closed_port_fails_fast(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    t0 = time.monotonic()
    with pytest.raises(InfraError, match="cannot reach") as err:
        SSHCluster.from_profile(
            {"host": "127.0.0.1", "port": port, "connect_timeout_s": 3}
        ).acquire()
    assert err.value.exit_code == 3 and time.monotonic() - t0 < 3


def test_silent_host_fails_within_the_connect_timeout():
    """A host that accepts TCP but never speaks SSH (a black-holed tunnel) must not hang."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(InfraError, match="connect_timeout_s=2") as err:
            SSHCluster.from_profile(
                {"host": "127.0.0.1", "port": server.getsockname()[1], "connect_timeout_s": 2}
            ).acquire()
        elapsed = time.monotonic() - t0
        assert err.value.exit_code == 3 and 1.5 <= elapsed < 4.5
    finally:
        stop.set()
        thread.join()
        for s in held:
            s.close()
        server.close()


def test_profile_without_host_is_bad_input():
    with pytest.raises(BadInput, match="no `host`"):
        SSHSettings.from_mapping({"kind": "ssh", "port": 22})
