"""This host as the node: `--cluster local`.

The local transport runs the same commands the SSH transport sends, through `bash -c` on this
machine, so the shared runner cannot tell the two apart. Releasing this host ends nothing: the
launcher only targeted it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from launcher.clusters.base import CommandResult, LaunchOptions, Node
from launcher.clusters.contract import Backend, RecordField, WithNodeShell
from launcher.errors import InfraError
from launcher.excerpt import excerpt_lines, open_regular
from launcher.records.atomic import write_atomic

if TYPE_CHECKING:
    from launcher.plan.plan import Plan


def command_failed(node: str, command: str, result: CommandResult) -> InfraError:
    """One wording for a failed node command, whichever transport ran it."""
    tail = excerpt_lines(result.stderr or result.stdout, 5)
    detail = "; ".join(tail) if tail else "no output"
    first = excerpt_lines(command.strip(), 1, 120)
    return InfraError(
        f"a command on node {node} failed with exit {result.exit_code}: "
        f"{(first[0] if first else command)!r}: {detail}"
    )


class LocalTransport:
    """Run commands and move files on this host."""

    def __init__(self, node_name: str = "local") -> None:
        self.node_name = node_name

    def run(
        self, command: str, *, timeout_s: float | None = None, check: bool = True
    ) -> CommandResult:
        try:
            proc = subprocess.run(
                ["bash", "-c", command],
                capture_output=True,
                text=True,
                errors="replace",
                stdin=subprocess.DEVNULL,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as err:
            raise InfraError(
                f"a command on node {self.node_name} did not finish within {timeout_s:.0f} s"
            ) from err
        result = CommandResult(proc.returncode, proc.stdout, proc.stderr)
        if check and result.exit_code != 0:
            raise command_failed(self.node_name, command, result)
        return result

    def _failed(self, what: str, path: str, err: OSError) -> InfraError:
        """A file operation on this node that the OS refused (disk full, permissions)."""
        return InfraError(f"cannot {what} {path} on node {self.node_name}: {err.strerror or err}")

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        dest = Path(remote)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, dest)
            if mode is not None:
                dest.chmod(mode)
        except OSError as err:
            raise self._failed("write", remote, err) from err

    def put_text(self, text: str, remote: str, *, mode: int | None = None) -> None:
        dest = Path(remote)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            # the mode is set before any byte is written (a secrets file is never readable by
            # others)
            write_atomic(
                dest,
                text,
                mode=0o600 if mode is None else mode & 0o700,
                chmod=0o644 if mode is None else mode,
            )
        except OSError as err:
            raise self._failed("write", remote, err) from err

    def get(self, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(remote, local)

    def read_from(self, remote: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        try:  # a regular file only: a FIFO in its place would block the reader for ever
            with open_regular(Path(remote)) as fh:
                fh.seek(offset)
                return fh.read(max_bytes)
        except FileNotFoundError:
            return b""

    def close(self) -> None:
        return None


class LocalCluster(WithNodeShell):
    """The one node is this host; acquire and release start and end nothing."""

    name = "local"

    def shell_refusal(self, run: str, state: str | None, node_run_dir: str) -> str | None:
        """The node is this host: the user's own shell is the one, in the run's directory."""
        del state
        return f"run {run} ran on this host: its directory there is {node_run_dir}."

    def acquire(self) -> list[Node]:
        return [Node(name="local", host=socket.gethostname())]

    def transport(self, node: Node) -> LocalTransport:
        return LocalTransport(node.name)

    def release(self) -> None:
        return None

    def to_record(self) -> dict[str, Any]:
        """What `attach` and `cancel` need to find this cluster again (kept in run.json)."""
        return {"kind": "local"}


class LocalBackend(Backend):
    """`kind: local`: this host, for every run; it declares no optional capability."""

    kind = "local"
    record_fields: ClassVar[Mapping[str, RecordField]] = {}  # this host: nothing to find again

    def from_plan(self, plan: Plan, options: LaunchOptions, run_dir: Path) -> LocalCluster:
        return LocalCluster()

    def from_record(self, record: Mapping[str, Any], run_dir: Path | None = None) -> LocalCluster:
        return LocalCluster()


BACKEND = LocalBackend()
