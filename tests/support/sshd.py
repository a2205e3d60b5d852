"""A real OpenSSH server on 127.0.0.1:<free port>, with its own host key, user key and known_hosts.

Nothing system-wide is touched: sshd runs with `-f` pointing at a config in a temporary directory
and `-D` (in the foreground, a child of the test session), so stopping it ends it.

Commands run over it do not read the test machine's `~/.bashrc`. Debian's bash reads it for a
command from sshd when it is the top-level shell (SHLVL unset or 0 when it starts), and a
developer's `.bashrc` is theirs, not a node's: this machine's runs `pyenv init` (about 200
processes, 0.3 s of CPU, before every SSH command). `SetEnv SHLVL=1` makes the command's bash a
nested one, which skips it, as a stock Ubuntu or DLAMI `.bashrc` does by returning at once when
not interactive. Measured: the SSH end-to-end run went from 18.5 to 11.8 CPU-seconds
(docs/testing.md). A node whose shell does print at start-up is its own adversary test
(tests/clusters/test_ssh_noisy_shell.py, through BASH_ENV).
"""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .ports import free_port, wait_for_port

SSHD = "/usr/sbin/sshd"


def keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "reproduce-test", "-f", str(path)],
        check=True,
    )


def _setenv(env: dict[str, str]) -> str:
    """`NAME=VALUE` words for sshd_config's SetEnv, each quoted (sshd's own quoting rules)."""
    for name, value in env.items():
        if '"' in name + value or "\\" in name + value or "\n" in name + value:
            raise ValueError(f"SetEnv cannot carry {name}={value!r}")
    return " ".join(f'"{name}={value}"' for name, value in env.items())


def key_fingerprint(pub: Path) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.split()[1]


@dataclass
class SshServer:
    root: Path
    port: int = field(default_factory=free_port)
    user: str = field(default_factory=getpass.getuser)
    # What every session's environment carries besides sshd's own (HOME, PATH, ...): sshd reads
    # only its config's FIRST `SetEnv` line, so the whole environment is written as that one line.
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.host_key = self.root / "ssh_host_ed25519_key"
        self.identity_file = self.root / "id_ed25519"
        self.known_hosts = self.root / "known_hosts"
        self.log = self.root / "sshd.log"
        keygen(self.host_key)
        keygen(self.identity_file)
        (self.root / "authorized_keys").write_text((self.root / "id_ed25519.pub").read_text())
        os.chmod(self.root / "authorized_keys", 0o600)
        host_pub = (self.root / "ssh_host_ed25519_key.pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        self.host_fingerprint = key_fingerprint(self.root / "ssh_host_ed25519_key.pub")
        allow = " ".join(sorted({"root", self.user}))
        (self.root / "sshd_config").write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {self.host_key}\n"
            f"PidFile {self.root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\n"
            f"AllowUsers {allow}\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "MaxSessions 50\n"
            "MaxStartups 50\n"
            "LogLevel VERBOSE\n"
            f"SetEnv {_setenv({'SHLVL': '1', **self.env})}\n"  # SHLVL: the module docstring
            f"Subsystem sftp internal-sftp\n"
        )

    def start(self) -> SshServer:
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory sshd insists on
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        try:
            wait_for_port(self.port)
        except RuntimeError as err:
            self.stop()
            raise RuntimeError(
                f"sshd did not start; its log: {self.log.read_text()[-2000:]}"
            ) from err
        return self

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes: descendants of the listener that are sshd themselves.

        Commands run over SSH and the detached node script are not included: dropping a
        connection must not kill what the node is running.
        """
        if self.proc is None:
            return []
        out = subprocess.run(
            ["ps", "-e", "-o", "pid=,ppid=,comm="], capture_output=True, text=True
        ).stdout
        table = [line.split(None, 2) for line in out.splitlines() if len(line.split(None, 2)) == 3]
        children: dict[int, list[tuple[int, str]]] = {}
        for pid, ppid, comm in table:
            children.setdefault(int(ppid), []).append((int(pid), comm))
        found, todo = [], [self.proc.pid]
        while todo:
            for pid, comm in children.get(todo.pop(), []):
                if comm.startswith("sshd"):
                    found.append(pid)
                    todo.append(pid)
        return found

    def drop_connections(self) -> int:
        """Kill every open SSH connection (not the listener): a dropped network, as the client sees it."""
        pids = self.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.drop_connections()
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def profile(self, **overrides) -> dict:
        """An ssh cluster profile (the fields of schema/profile.schema.yaml) pointing at this server."""
        data = {
            "kind": "ssh",
            "host": "127.0.0.1",
            "port": self.port,
            "user": self.user,
            "identity_file": str(self.identity_file),
            "connect_timeout_s": 5,
            "known_hosts": str(self.known_hosts),
        }
        data.update(overrides)
        return data

    def wait_until_stopped_sessions(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.session_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
