"""How the runner drives one node's run, whatever carries it: the seam between runner and backend.

The runner (session.py) stages, launches, follows, cancels and collects every node through an
`Execution`, so following N nodes, the budget, Ctrl-C, detach, attach and cancel are one piece of
code for every backend. `WrapperExecution` is the node protocol of docs/architecture.md (a detached
wrapper, node.log read by byte offset, pid and exit_code files) over any Transport (this host, SSH,
AWS through SSH). A backend whose runs are not processes it can start itself (a Ray cluster's job
server) declares its own (`WithOwnExecution`); `contract.execution_for` picks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from launcher.clusters import staging
from launcher.clusters.base import Node, Transport
from launcher.errors import InfraError
from launcher.excerpt import excerpt
from launcher.plan import protocol


@dataclass(frozen=True)
class Place:
    """Where one node's part of a run lives: its run directory there and its container's name."""

    run_id: str
    node_run_dir: str
    container: str


class Execution(Protocol):
    """One node's run as the runner sees it. Every method may raise InfraError, OSError or
    EOFError for a broken exchange: the runner retries within its reconnect window."""

    node: Node
    place: Place

    def stage(
        self, node_script: str, scripts_dir: Path | None, secrets: Mapping[str, str] | None
    ) -> None:
        """Put what the run needs in place (node.sh, the node programs, the secrets last)."""

    def discard_secrets(self) -> None:
        """After a failed staging or launch: no secret stays behind (best effort, never raises)."""

    def launch(self, env: Mapping[str, str]) -> str:
        """Start it detached with `env` added ({} for one node); an id for run.json."""

    def read_log(self, offset: int, max_bytes: int) -> bytes:
        """The run's log from byte `offset` (b"" when nothing new)."""

    def poll(self) -> tuple[str, int | None]:
        """("alive", None), ("exit", code) or ("gone", None): ended without an exit code."""

    def cancel(self, timeout_s: float) -> str:
        """Stop the run here and mark it cancelled; what could not be stopped ("" = nothing)."""

    def was_cancelled(self) -> bool:
        """Whether a cancel marked this run (its exit code then says little)."""

    def heartbeat(self) -> None:
        """A follower is reading this run (protocol.HEARTBEAT_S apart): a node that ends itself
        after the run waits for its follower's collection. Never raises."""

    def end(self) -> None:
        """Node 0 finished: a node that only serves it (a Ray worker) may stop now."""

    def cleanup(self) -> None:
        """After the end: remove what the run left (its container)."""

    def collect(self) -> tuple[dict[str, bytes], list[str]]:
        """The result files (protocol.RESULT_FILES names only) and why any was refused."""

    def close(self) -> None:
        """Drop the connection; the next call reconnects."""


class WrapperExecution:
    """The node protocol over a Transport: setsid wrapper, node.log, pid and exit_code files."""

    def __init__(self, node: Node, transport: Transport, place: Place) -> None:
        self.node = node
        self.transport = transport
        self.place = place

    @property
    def _dir(self) -> str:
        return self.place.node_run_dir

    def stage(
        self, node_script: str, scripts_dir: Path | None, secrets: Mapping[str, str] | None
    ) -> None:
        staging.stage(self.transport, self._dir, node_script, scripts_dir, secrets)

    def discard_secrets(self) -> None:
        staging.discard_secrets(self.transport, self._dir)

    def launch(self, env: Mapping[str, str]) -> str:
        return str(staging.launch(self.transport, self._dir, env))

    def read_log(self, offset: int, max_bytes: int) -> bytes:
        return self.transport.read_from(f"{self._dir}/node.log", offset, max_bytes)

    def poll(self) -> tuple[str, int | None]:
        # no limit of its own: a quick command, so the transport's own (ssh: io_timeout_s) applies
        # and a silent connection is noticed within it
        res = self.transport.run(protocol.poll_command(self._dir), check=False)
        answer = protocol.parse_poll(res.stdout, res.exit_code)
        if answer is None:  # a broken exchange, not news about the run: the caller retries
            raise InfraError(
                f"unexpected answer from {self.node.name} while polling (exit {res.exit_code}): "
                f"{excerpt(res.stdout, 3, 200)!r}"
            )
        return answer

    def cancel(self, timeout_s: float) -> str:
        out = self.transport.run(
            protocol.cancel_command(self._dir, self.place.container),
            timeout_s=timeout_s,
            check=False,
        ).stdout
        return protocol.parse_cancel(out)

    def was_cancelled(self) -> bool:
        return self.transport.run(protocol.cancelled_command(self._dir), check=False).exit_code == 0

    def heartbeat(self) -> None:
        try:
            self.transport.run(protocol.heartbeat_command(self._dir), check=False)
        except (InfraError, OSError, EOFError):
            pass  # a missed beat: the next read's reconnect says what happened

    def end(self) -> None:
        self.transport.run(protocol.end_command(self._dir), check=False)

    def cleanup(self) -> None:
        command = protocol.cleanup_command(self.place.container)
        self.transport.run(command, timeout_s=120, check=False)

    def collect(self) -> tuple[dict[str, bytes], list[str]]:
        answer = self.transport.run(protocol.collect_command(self._dir), check=False)
        return protocol.parse_collect(answer.stdout)

    def close(self) -> None:
        self.transport.close()


def node_env(nodes: list[Node], index: int) -> dict[str, str]:
    """What node.sh of a multi-node run learns at launch: its rank, the head's address, its own
    address for Ray (when the node's address is an IP literal; else node.sh asks the host), and
    every node's address in order (the Ray wait names the missing ones). {} for one node."""
    if len(nodes) < 2:
        return {}
    env = {
        "NODE_RANK": str(index),
        "HEAD_ADDR": nodes[0].host,
        "NODE_ADDRS": " ".join(n.host for n in nodes),
    }
    if _is_ip(nodes[index].host):
        env["NODE_IP"] = nodes[index].host
    return env


def _is_ip(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
