"""Several nodes on one machine, loopback only: sshd "hosts" and one shared network namespace.

- `SshHosts`: N real OpenSSH servers on 127.0.0.1 (each its own port, host key, user key and
  known_hosts), and an ssh profile with a host list: node K's address (what Ray sees) is
  127.0.0.(K+1), dialled at 127.0.0.1:<its port>, with its own work_dir (the nodes share a disk, so
  their run directories must differ, as on separate machines they would anyway).
- `Netns`: a holder container started with `--network none`; every container of every node joins
  its namespace (`--network container:HOLDER`), so Ray's head on 127.0.0.1 and workers on
  127.0.0.2, 127.0.0.3, ... form a real multi-node cluster without any address outside 127.0.0.0/8,
  apart from the host's own network and from other tests.
Nothing here reaches beyond loopback.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .docker import containers_named, docker
from .paths import REPO
from .sshd import SshServer


@dataclass
class SshHosts:
    """N sshd "hosts" on 127.0.0.1; node K answers as 127.0.0.(K+1)."""

    root: Path
    count: int
    servers: list[SshServer] = field(default_factory=list)

    def start(self) -> SshHosts:
        for k in range(self.count):
            self.servers.append(SshServer(self.root / f"sshd-{k}").start())
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    @staticmethod
    def address(k: int) -> str:
        return f"127.0.0.{k + 1}"

    def work_dir(self, k: int) -> Path:
        return self.root / f"node-{k}" / "work"

    def host_entry(self, k: int, *, pin: bool = False) -> dict[str, Any]:
        """Node K of the host list: its address, where it is dialled, its own key and work dir;
        its host key checked by known_hosts, or pinned by fingerprint (`pin`)."""
        server = self.servers[k]
        entry: dict[str, Any] = {
            "host": self.address(k),
            "connect_host": "127.0.0.1",
            "port": server.port,
            "identity_file": str(server.identity_file),
            "work_dir": str(self.work_dir(k)),
        }
        if pin:
            entry["host_key_fingerprint"] = server.host_fingerprint
        else:
            entry["known_hosts"] = str(server.known_hosts)
        return entry

    def profile(self, **overrides: Any) -> dict[str, Any]:
        """An ssh profile listing every host, node 0 first (odd nodes pin their key)."""
        data: dict[str, Any] = {
            "kind": "ssh",
            "user": self.servers[0].user,
            "connect_timeout_s": 5,
            "hosts": [self.host_entry(k, pin=k % 2 == 1) for k in range(self.count)],
        }
        data.update(overrides)
        return data


@dataclass
class Netns:
    """A container holding a loopback-only network namespace that node containers join."""

    image: str
    run_args: list[str]
    name: str = field(default_factory=lambda: f"reproduce-test-netns-{uuid.uuid4().hex[:8]}")

    def start(self) -> Netns:
        docker(
            "run", "-d", "--rm", "--name", self.name, "--network", "none", *self.run_args,
            self.image, "sleep", "infinity",
        )  # fmt: skip
        return self

    @property
    def network(self) -> str:
        return f"container:{self.name}"

    def exec(self, *command: str) -> str:
        return docker("exec", self.name, *command, check=False).stdout

    def stop(self) -> None:
        docker("rm", "-f", self.name, check=False)
        assert not containers_named(self.name)


def ssh_hosts_profile(tmp_path: Path, **fields: object) -> Path:
    """The shipped ssh profile with four hosts 127.0.0.1-4 (for dry runs: nothing is dialled)."""
    profile = yaml.safe_load((REPO / "env" / "ssh.yaml").read_text())
    del profile["host"]
    profile["hosts"] = [f"127.0.0.{k}" for k in range(1, 5)]
    profile["host_key_fingerprint"] = "SHA256:" + "A" * 43
    profile.update(fields)
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path
