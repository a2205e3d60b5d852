"""What a cluster backend must do, and nothing more.

Backends are thin (docs/architecture.md, "Principles"): a Cluster acquires and releases nodes; a
Transport moves bytes and commands to one node. Staging, detaching, streaming logs, measuring and
judging are shared code that only ever talks to these two protocols, so AWS, SSH and this host
cannot drift apart. What a backend may do beyond them it declares (launcher/clusters/contract.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Node:
    """One machine the run uses. `connect_host` is the address actually dialled."""

    name: str
    host: str  # the node's own address (what Ray and the recipe see)
    connect_host: str | None = None  # dial this instead (tunnel, bastion, tests: 127.0.0.1)
    port: int = 22
    user: str | None = None
    identity_file: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # backend facts: instance id, AMI, az, ...
    # The node's own work_dir when it is not the profile's (a host list's per-host field; several
    # "nodes" on one test host): its run directory is <work_dir>/runs/<run id>.
    work_dir: str | None = None
    # Reach this node through another one (an SSH jump): host/connect_host are then dialled from
    # `via`, not from the launcher (cloud workers with only a private address behind their head).
    via: Node | None = None

    def __post_init__(self) -> None:
        if isinstance(self.via, dict):  # Node(**asdict(node)), as run.json keeps it
            object.__setattr__(self, "via", Node(**self.via))


@dataclass(frozen=True)
class LaunchOptions:
    """What a new run asks of its backend beyond the Plan (`from_plan(plan, options, run_dir)`)."""

    keep: bool = False  # leave launched nodes running after the run (aws --keep)
    owner: str = "unknown"  # who launches: tags and names carry it, as the dry run printed
    price_per_hour: float | None = None  # one node's price decided for the run (aws.json, --keep)
    shared: bool = False  # a nightly's node, lent to several runs: no run's end may end it
    max_hours: float | None = None  # the run's budget (--max-hours), where a backend sizes by it
    max_usd: float | None = None  # the run's budget (--max-usd)


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str


@runtime_checkable
class Transport(Protocol):
    """Run commands and move files on one node."""

    def run(
        self, command: str, *, timeout_s: float | None = None, check: bool = True
    ) -> CommandResult:
        """Run a shell command on the node (bash -c), wait for it."""

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        """Copy a local file to a path on the node (parents created)."""

    def put_text(self, text: str, remote: str, *, mode: int | None = None) -> None:
        """Write text to a file on the node (parents created)."""

    def get(self, remote: str, local: Path) -> None:
        """Copy a file from the node."""

    def read_from(self, remote: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        """Bytes of a node file from `offset` (empty when nothing new): logs stream by offset."""

    def close(self) -> None: ...


@runtime_checkable
class Cluster(Protocol):
    """Acquire and release the nodes of one run. Release ends only what acquire launched."""

    name: str

    def acquire(self) -> list[Node]: ...

    def transport(self, node: Node) -> Transport: ...

    def release(self) -> None:
        """Idempotent; safe on every exit path; never ends a node it only targeted."""

    def to_record(self) -> dict[str, Any]:
        """What run.json keeps so that the backend's `from_record` finds the cluster again (no
        secrets)."""
