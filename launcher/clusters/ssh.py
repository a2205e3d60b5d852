"""An existing host over SSH: `--cluster ssh` (paramiko). AWS nodes are reached through it too.

The host key is always checked: against a pinned fingerprint from the profile when there is one,
otherwise against known_hosts. An unknown host is refused unless the profile says
`accept_unknown_host: true` (then its key is added to the known_hosts file, like OpenSSH's
`StrictHostKeyChecking=accept-new`). Connecting never takes longer than `connect_timeout_s`
(TCP, banner and authentication together), so an unreachable host fails fast.

Once connected, no operation waits on the peer for longer than `io_timeout_s` (a command without
its own timeout, every SFTP request): a half-open or black-holed connection (TCP still up, nothing
coming back) is then a ConnectionLost like a dropped one, so the runner's reconnect window and
budget check go on instead of a read that blocks forever.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from launcher.clusters.base import CommandResult, LaunchOptions, Node
from launcher.clusters.contract import Backend, RecordField, WithMultiNode, WithNodeShell
from launcher.clusters.local import command_failed
from launcher.clusters.shell_frame import framed, output_frame, unframed
from launcher.errors import BadInput, InfraError

if TYPE_CHECKING:
    import socket as _socket

    from paramiko import Channel, ChannelFile, PKey, SFTPClient, SSHClient, Transport

    from launcher.plan.plan import Plan

DEFAULT_CONNECT_TIMEOUT_S = 20.0
# A command's answer is the node's: the launcher's longest (collect: the result files, each at
# most 4 MiB, in base64) is far under this; stderr is kept up to its own bound and read to its end.
MAX_ANSWER_BYTES = 64 << 20
MAX_STDERR_BYTES = 1 << 20


def _read_capped(stream: ChannelFile, cap: int, *, drain: bool = False) -> tuple[bytes, bool]:
    """At most `cap` bytes of a channel's stream, and whether it had more: past the cap it
    stops reading (stdout: the caller gives the command up) or, with `drain`, reads on to the
    end and keeps nothing more (stderr: the command must not block on a full channel)."""
    kept, over = bytearray(), False
    while True:
        chunk = stream.read(1 << 16)
        if not chunk:
            return bytes(kept), over
        room = cap - len(kept)
        kept += chunk[:room]
        if len(chunk) > room:
            over = True
            if not drain:
                return bytes(kept), over


DEFAULT_IO_TIMEOUT_S = 60.0

# paramiko logs its own thread's failures with tracebacks to stderr (Python's last-resort handler);
# every failure reaches the user once, as an InfraError naming the cause, so keep those quiet.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class NoSftp(InfraError):  # noqa: N818 - named for what the host lacks, as InfraError is named
    """The host's sshd refuses the SFTP subsystem: files cannot reach the node (exit 3)."""


class ConnectionLost(InfraError):  # noqa: N818 - named for what happened, as InfraError is
    """The SSH connection broke during an operation; the node itself may be fine."""


def fingerprint(key: PKey) -> str:
    """OpenSSH's `SHA256:<base64>` fingerprint of a paramiko public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@dataclass(frozen=True)
class SSHSettings:
    """The SSH fields of a cluster profile (env/ssh.yaml, or the `ssh:` block of a profile)."""

    host: str
    port: int = 22
    user: str | None = None
    identity_file: str | None = None
    connect_host: str | None = None
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    io_timeout_s: float = DEFAULT_IO_TIMEOUT_S  # the longest wait for the peer once connected
    known_hosts: str | None = None  # default ~/.ssh/known_hosts
    host_key_fingerprint: str | None = (
        None  # "SHA256:..." pins the key; known_hosts is then not used
    )
    accept_unknown_host: bool = False
    work_dir: str | None = None  # a host list's host: its own work_dir (default: the profile's)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> SSHSettings:
        """Read the profile fields; unknown keys are left to the profile's own validation."""
        section = data.get("ssh", data) if isinstance(data.get("ssh"), Mapping) else data
        if not section.get("host"):
            raise BadInput("the ssh cluster profile has no `host`: name the machine to run on")
        # work_dir is the profile's (the plan's run dir) unless a host list gives a host its own
        fields = {
            k: section[k]
            for k in cls.__dataclass_fields__
            if section.get(k) is not None and k != "work_dir"
        }
        try:
            fields["port"] = int(fields.get("port", 22))
            for key, default in (
                ("connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S),
                ("io_timeout_s", DEFAULT_IO_TIMEOUT_S),
            ):
                fields[key] = float(fields.get(key, default))
                if not 0 < fields[key] < float("inf"):
                    raise ValueError(f"{key} must be a positive number of seconds")
        except (TypeError, ValueError) as err:
            raise BadInput(
                f"the ssh cluster profile has a bad port, connect_timeout_s or io_timeout_s: {err}"
            ) from err
        for key in ("identity_file", "known_hosts"):
            if key in fields:
                fields[key] = os.path.expanduser(str(fields[key]))
        fields["accept_unknown_host"] = bool(fields.get("accept_unknown_host", False))
        return cls(**fields)

    def node(self, name: str | None = None) -> Node:
        return Node(
            name=name or self.host,
            host=self.host,
            connect_host=self.connect_host,
            port=self.port,
            user=self.user,
            identity_file=self.identity_file,
            work_dir=self.work_dir,
        )


class _HostKeyPolicy:
    """paramiko asks this about every key not found in the loaded known_hosts."""

    def __init__(self, settings: SSHSettings, known_hosts_path: Path) -> None:
        self.settings = settings
        self.known_hosts_path = known_hosts_path

    def missing_host_key(self, client: SSHClient, hostname: str, key: PKey) -> None:
        seen = fingerprint(key)
        pinned = self.settings.host_key_fingerprint
        if pinned:
            if seen not in pinned.split():  # aws pins every key type its console listed
                raise InfraError(
                    f"the host key of {hostname} is {seen}, but the profile pins {pinned}: "
                    "refusing to connect (a changed key can mean a different machine or a man in "
                    "the middle)."
                )
            return
        if not self.settings.accept_unknown_host:
            raise InfraError(
                f"the host key of {hostname} ({key.get_name()} {seen}) is not in "
                f"{self.known_hosts_path}: refusing an unknown host.",
                hint="Check the fingerprint, then add it to known_hosts, pin it as "
                "`host_key_fingerprint`, or set `accept_unknown_host: true` in the profile.",
            )
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.known_hosts_path, "a") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class SSHTransport:
    """Commands and files on one node over one SSH connection, reconnected on demand.

    With a `jump` (the transport of `node.via`), the node is dialled from the jump node: a
    `direct-tcpip` channel opened on the jump node's connection carries this node's SSH
    connection, so a node with only a private address (a cloud worker behind its head) is reached
    without a public address of its own. Its host key is checked like any other; the jump node's
    connection is shared by every node behind it and reconnected when it breaks.
    """

    def __init__(self, node: Node, settings: SSHSettings, jump: SSHTransport | None = None) -> None:
        self.node = node
        self.settings = settings
        self.jump = jump
        self._client: SSHClient | None = None
        self._sftp: SFTPClient | None = None
        self._lock = threading.RLock()
        self._made_dirs: set[str] = set()  # directories this transport made (_mkdir_parent)

    # --- connection ---

    @property
    def dial(self) -> str:
        return self.node.connect_host or self.node.host

    def _where(self) -> str:
        user = f"{self.node.user}@" if self.node.user else ""
        via = f" (dialled as {self.dial})" if self.dial != self.node.host else ""
        jump = f" through {self.jump.node.name}" if self.jump is not None else ""
        return f"{user}{self.node.host}:{self.node.port}{via}{jump}"

    def _socket(self, timeout: float) -> Channel | _socket.socket:
        """The TCP stream SSH runs over: a direct connection, or a channel through the jump."""
        if self.jump is not None:
            try:
                return self.jump.open_tunnel(self.dial, self.node.port, timeout)
            except InfraError as err:
                raise InfraError(f"cannot reach {self._where()}: {err}") from err
        try:
            return socket.create_connection((self.dial, self.node.port), timeout=timeout)
        except TimeoutError as err:
            raise InfraError(
                f"cannot reach {self._where()}: no answer within connect_timeout_s={timeout:g} s"
            ) from err
        except OSError as err:
            raise InfraError(f"cannot reach {self._where()}: {err.strerror or err}") from err

    def open_tunnel(self, host: str, port: int, timeout: float) -> Channel:
        """A `direct-tcpip` channel from this node to host:port (what a jump is made of): the
        node's sshd opens the TCP connection, so host is any address this node can reach.
        InfraError when the node cannot be reached or cannot connect there."""
        import paramiko

        with self._lock:
            self.connect()
            try:
                return self._transport().open_channel(
                    "direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout
                )
            except paramiko.ChannelException as err:  # the node refused, or could not connect
                raise InfraError(
                    f"{self.node.name} could not open a connection to {host}:{port} "
                    f"({err.text or err})"
                ) from err
            except (paramiko.SSHException, OSError, EOFError) as err:
                raise self._lost(err) from err

    def connect(self) -> None:
        """Open the connection now; every failure is an InfraError naming its cause."""
        import paramiko

        with self._lock:
            current = self._client.get_transport() if self._client is not None else None
            if current is not None and current.is_active():
                return
            self.close()
            timeout = self.settings.connect_timeout_s
            deadline = time.monotonic() + timeout
            known = Path(self.settings.known_hosts or os.path.expanduser("~/.ssh/known_hosts"))
            client = paramiko.SSHClient()
            if not self.settings.host_key_fingerprint and known.is_file():
                client.load_host_keys(str(known))
            # paramiko only calls missing_host_key on it; its stubs ask for the base class, which
            # this module does not import until a connection is made
            policy = cast("paramiko.MissingHostKeyPolicy", _HostKeyPolicy(self.settings, known))
            client.set_missing_host_key_policy(policy)
            sock = self._socket(timeout)
            left = max(0.5, deadline - time.monotonic())
            identity = self.node.identity_file or self.settings.identity_file
            try:
                client.connect(
                    self.dial,
                    port=self.node.port,
                    username=self.node.user or self.settings.user,
                    key_filename=identity,
                    sock=sock,
                    timeout=left,
                    banner_timeout=left,
                    auth_timeout=left,
                    channel_timeout=left,
                    allow_agent=identity is None,
                    look_for_keys=identity is None,
                )
            except InfraError:
                sock.close()
                raise
            except paramiko.BadHostKeyException as err:
                sock.close()
                raise InfraError(
                    f"the host key of {self._where()} does not match {known}: refusing to connect "
                    f"(got {fingerprint(err.key)}, expected {fingerprint(err.expected_key)})."
                ) from err
            except paramiko.AuthenticationException as err:
                sock.close()
                raise InfraError(
                    f"{self._where()} refused the key {identity or '(agent/default keys)'}: {err}",
                    hint="Check `user` and `identity_file` in the profile.",
                ) from err
            except (paramiko.SSHException, OSError, EOFError) as err:
                sock.close()
                raise InfraError(
                    f"SSH to {self._where()} failed within connect_timeout_s={timeout:g} s: "
                    f"{err or type(err).__name__}"
                ) from err
            transport = client.get_transport()
            if transport is not None:
                transport.set_keepalive(15)
            self._client = client

    def close(self) -> None:
        with self._lock:
            for thing in (self._sftp, self._client):
                # closing a broken connection must not fail
                with contextlib.suppress(Exception):
                    if thing is not None:
                        thing.close()
            self._sftp = None
            self._client = None

    def _transport(self) -> Transport:
        """The open connection's transport; an SSHException (a lost connection) once closed."""
        import paramiko

        transport = self._client.get_transport() if self._client is not None else None
        if transport is None:
            raise paramiko.SSHException("the SSH connection is closed")
        return transport

    def _lost(self, err: BaseException) -> ConnectionLost:
        self.close()
        if isinstance(err, TimeoutError):
            what = f"no answer within io_timeout_s={self.settings.io_timeout_s:g} s"
        else:
            what = str(err) or type(err).__name__
        return ConnectionLost(f"lost the SSH connection to {self._where()}: {what}")

    @contextlib.contextmanager
    def _deadline(self, seconds: float) -> Iterator[None]:
        """paramiko waits for some replies (exec, subsystem requests) with no timeout at all: past
        `seconds`, the connection is closed under it, which ends the wait with an error."""
        transport = self._client.get_transport() if self._client is not None else None
        timer = threading.Timer(seconds, transport.close) if transport is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            yield
        finally:
            if timer is not None:
                timer.cancel()

    def _sftp_client(self) -> SFTPClient:
        """The SFTP session, its channel's timeout set before the first request (the version
        exchange included), so no SFTP call waits on a silent peer past io_timeout_s."""
        import paramiko

        self.connect()
        if self._sftp is None:
            transport = self._transport()
            chan = transport.open_session(timeout=self.settings.connect_timeout_s)
            chan.settimeout(self.settings.io_timeout_s)
            try:
                with self._deadline(self.settings.io_timeout_s):
                    chan.invoke_subsystem("sftp")
            except paramiko.SSHException:
                # The server said no to the subsystem over a connection that is still up: not a
                # lost connection (which would be retried and reported as one), a host setup.
                if not transport.is_active():
                    raise
                chan.close()
                raise NoSftp(
                    f"the SSH server on {self._where()} has no SFTP subsystem (it refused the "
                    "request); reproduce copies files to the node over SFTP.",
                    hint="Enable it in the host's sshd_config (e.g. `Subsystem sftp "
                    "internal-sftp` or `Subsystem sftp /usr/lib/openssh/sftp-server`) and "
                    "reload sshd.",
                ) from None
            self._sftp = paramiko.SFTPClient(chan)
        return self._sftp

    # --- Transport ---

    def run(
        self, command: str, *, timeout_s: float | None = None, check: bool = True
    ) -> CommandResult:
        import paramiko

        # `timeout_s` bounds each wait for the node (no output for that long: given up); a
        # command without one gets io_timeout_s, so a silent connection never blocks for ever.
        limit = timeout_s if timeout_s is not None else self.settings.io_timeout_s
        with self._lock:
            self.connect()
            try:
                chan = self._transport().open_session(timeout=self.settings.connect_timeout_s)
                chan.settimeout(limit)
                frame = output_frame()
                with self._deadline(limit):
                    chan.exec_command("bash -c " + shlex.quote(framed(command, frame)))
                out_file, err_file = chan.makefile("rb"), chan.makefile_stderr("rb")
                err_box: list[bytes] = []

                def read_stderr() -> None:
                    # a silent connection times out here too; the main read reports it
                    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                        err_box.append(_read_capped(err_file, MAX_STDERR_BYTES, drain=True)[0])

                reader = threading.Thread(target=read_stderr, daemon=True)
                reader.start()
                out, over = _read_capped(out_file, MAX_ANSWER_BYTES)
                if over:  # the node's shell printed without end: no answer of ours is that long
                    self.close()
                    raise InfraError(
                        f"a command on {self._where()} answered more than {MAX_ANSWER_BYTES} "
                        "bytes; the node's shell prints without end (its start-up files?)"
                    )
                reader.join(limit)
                if not chan.status_event.wait(limit):
                    raise TimeoutError("no exit status")
                code = chan.recv_exit_status()
                chan.close()
                if code == -1:  # the channel closed without an exit status: the connection broke
                    raise EOFError("the command's channel closed without an exit status")
            except TimeoutError as err:
                # The command may still run, or the connection is dead: either way this
                # connection is done with (the next call reconnects).
                self.close()
                raise ConnectionLost(
                    f"a command on {self._where()} gave no answer within {limit:.0f} s"
                ) from err
            except (paramiko.SSHException, OSError, EOFError) as err:
                raise self._lost(err) from err
        result = CommandResult(
            code,
            unframed(out, frame).decode(errors="replace"),
            b"".join(err_box).decode(errors="replace"),
        )
        if check and code != 0:
            raise command_failed(self.node.name, command, result)
        return result

    def _mkdir_parent(self, remote: str, *, again: bool = False) -> None:
        """`mkdir -p` of a file's directory, once per directory and connection: staging puts
        many files in a few directories, and each command is a channel and a shell on the node
        (a round trip or more). A directory gone since is made again (see _put)."""
        parent = os.path.dirname(remote)
        if parent and (again or parent not in self._made_dirs):
            self.run(f"mkdir -p {shlex.quote(parent)}")
            self._made_dirs.add(parent)

    def _put(self, remote: str, write: Callable[[SFTPClient], None]) -> None:
        import paramiko

        self._mkdir_parent(remote)
        for attempt in (1, 2):
            with self._lock:
                try:
                    write(self._sftp_client())
                    return
                except FileNotFoundError:
                    if attempt == 2:
                        raise InfraError(
                            f"cannot write {remote} on node {self.node.name}: no such directory"
                        ) from None
                except (paramiko.SSHException, OSError, EOFError) as err:
                    raise self._lost(err) from err
            self._mkdir_parent(remote, again=True)  # removed since it was made: make it again

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        def write(sftp: SFTPClient) -> None:
            sftp.put(str(local), remote)
            if mode is not None:
                sftp.chmod(remote, mode)

        self._put(remote, write)

    def put_text(self, text: str, remote: str, *, mode: int | None = None) -> None:
        def write(sftp: SFTPClient) -> None:
            with sftp.open(remote, "wb") as fh:
                if mode is not None:  # before any byte is written (a secrets file)
                    fh.chmod(mode)
                fh.write(text.encode())

        self._put(remote, write)

    def get(self, remote: str, local: Path) -> None:
        import paramiko

        local.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            try:
                self._sftp_client().get(remote, str(local))
            except FileNotFoundError:
                raise
            except (paramiko.SSHException, OSError, EOFError) as err:
                raise self._lost(err) from err

    def read_from(self, remote: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        import paramiko

        with self._lock:
            try:
                fh = self._sftp_client().open(remote, "rb")
            except FileNotFoundError:
                return b""
            except (paramiko.SSHException, OSError, EOFError) as err:
                raise self._lost(err) from err
            try:
                end = min(fh.stat().st_size or 0, offset + max_bytes)
                data = b""
                if end > offset:
                    fh.seek(offset)
                    fh.prefetch(end)  # concurrent read requests: ~10x faster than one at a time
                    data = fh.read(end - offset)
                fh.close()
                return data
            except (paramiko.SSHException, OSError, EOFError) as err:
                # the whole connection goes (closing only the file would wait on it once more)
                raise self._lost(err) from err


# A host of a host list may set these for itself; the profile's own values are the defaults.
HOST_FIELDS = (
    "host",
    "port",
    "user",
    "identity_file",
    "connect_host",
    "known_hosts",
    "host_key_fingerprint",
    "accept_unknown_host",
    "work_dir",
)


def host_settings(data: Mapping[str, Any]) -> list[SSHSettings]:
    """Every host of an ssh profile, node 0 first: `host` alone (one node), or `hosts`, each an
    address or a mapping of HOST_FIELDS over the profile's own fields. BadInput names a bad one."""
    hosts = data.get("hosts")
    if not hosts:
        return [SSHSettings.from_mapping(data)]
    base = {k: v for k, v in data.items() if k not in ("hosts", "host", "work_dir")}
    found = []
    for index, entry in enumerate(hosts):
        own = {"host": entry} if isinstance(entry, str) else dict(entry or {})
        unknown = sorted(set(own) - set(HOST_FIELDS))
        if unknown:
            raise BadInput(f"hosts[{index}] of the ssh profile: unknown field(s) {unknown}")
        merged = {**base, **{k: v for k, v in own.items() if v is not None}}
        if not merged.get("host"):
            raise BadInput(f"hosts[{index}] of the ssh profile has no `host`")
        settings = SSHSettings.from_mapping(merged)
        work_dir = own.get("work_dir")
        found.append(replace(settings, work_dir=str(work_dir)) if work_dir else settings)
    return found


class SSHCluster(WithNodeShell):
    """Existing hosts, one per node (node 0 first). Release closes connections and ends nothing:
    they were only targeted."""

    name = "ssh"

    def __init__(self, settings: SSHSettings | list[SSHSettings]) -> None:
        self.hosts = list(settings) if isinstance(settings, list) else [settings]
        if not self.hosts:
            raise BadInput("the ssh cluster profile names no host")
        self.settings = self.hosts[0]
        self._transports: list[SSHTransport] = []

    def shell_refusal(self, run: str, state: str | None, node_run_dir: str) -> str | None:
        """The user's own hosts outlive the run: a shell opens whenever they answer."""
        del run, state, node_run_dir
        return None

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any]) -> SSHCluster:
        return cls(host_settings(profile))

    def nodes(self) -> list[Node]:
        """One Node per host; named by address, or address:port where addresses repeat."""
        addresses = [h.host for h in self.hosts]
        return [
            h.node(name=h.host if addresses.count(h.host) == 1 else f"{h.host}:{h.port}")
            for h in self.hosts
        ]

    def acquire(self) -> list[Node]:
        nodes = self.nodes()
        for node in nodes:  # fail now, within the connect timeout, not mid-stage
            self.transport(node).connect()
        return nodes

    def _settings_of(self, node: Node) -> SSHSettings:
        for settings, known in zip(self.hosts, self.nodes(), strict=True):
            if known.name == node.name:
                return settings
        return self.settings  # a node recorded before host lists: the one host

    def transport(self, node: Node) -> SSHTransport:
        for existing in self._transports:
            if existing.node == node:
                return existing
        transport = SSHTransport(node, self._settings_of(node))
        self._transports.append(transport)
        return transport

    def release(self) -> None:
        for transport in self._transports:
            transport.close()

    def to_record(self) -> dict[str, Any]:
        """What `attach` and `cancel` need to reach the hosts again (in run.json; no secrets)."""
        record: dict[str, Any] = {"kind": "ssh", "ssh": asdict(self.settings)}
        if len(self.hosts) > 1:
            record["hosts"] = [asdict(h) for h in self.hosts]
        return record


class SSHBackend(Backend, WithMultiNode):
    """`kind: ssh`: existing hosts, only targeted; several of them for a multi-node recipe."""

    kind = "ssh"
    record_fields: ClassVar[Mapping[str, RecordField]] = {
        "ssh": RecordField((dict,)),  # the first host's settings
        "hosts": RecordField((list,), optional=True),  # every host, where there are several
    }

    def from_plan(self, plan: Plan, options: LaunchOptions, run_dir: Path) -> SSHCluster:
        return SSHCluster.from_profile(plan.profile.raw)

    def from_record(self, record: Mapping[str, Any], run_dir: Path | None = None) -> SSHCluster:
        hosts = record.get("hosts") or [record["ssh"]]
        return SSHCluster(
            [
                replace(SSHSettings.from_mapping(h), work_dir=h.get("work_dir"))
                if h.get("work_dir")
                else SSHSettings.from_mapping(h)
                for h in hosts
            ]
        )


BACKEND = SSHBackend()
