"""One node's part of a Slurm run, as the runner drives it (launcher/clusters/execution.py).

The node protocol (docs/architecture.md) over the shared work dir: node.sh, the wrapper and the
node programs are staged into the node's run directory through the login node, node.log is read
from there by byte offset and the result files collected from there, exactly as over SSH. What
differs is who starts and stops it: the first node's launch submits the run's one job (the others'
wait for it), whose task on each node runs that node's wrapper; the job's state says whether it is
still going; a cancel marks every node's run directory and ends the job with scancel.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from launcher.clusters import staging
from launcher.clusters.base import Node, Transport
from launcher.errors import InfraError
from launcher.excerpt import excerpt
from launcher.plan import protocol

if TYPE_CHECKING:
    from launcher.clusters.execution import Place


class Job(Protocol):
    """What a node's part needs of the run's one job (launcher/clusters/slurm/cluster.py)."""

    job_id: str | None

    def login_transport(self) -> Transport: ...

    def submit_once(self) -> str: ...

    def ended_long_enough(self) -> bool: ...

    def cancel_job(self, timeout_s: float) -> str: ...


class SlurmExecution:
    """Node K of a run on Slurm: its files on the shared work dir, its process in the job."""

    def __init__(self, cluster: Job, node: Node, place: Place) -> None:
        self.cluster = cluster
        self.node = node
        self.place = place

    @property
    def _dir(self) -> str:
        return self.place.node_run_dir

    @property
    def _files(self) -> Transport:
        return self.cluster.login_transport()

    def stage(
        self, node_script: str, scripts_dir: Path | None, secrets: Mapping[str, str] | None
    ) -> None:
        staging.stage(self._files, self._dir, node_script, scripts_dir, secrets)

    def discard_secrets(self) -> None:
        staging.discard_secrets(self._files, self._dir)

    def launch(self, env: Mapping[str, str]) -> str:
        """The job runs every node's wrapper; the rank and addresses come from the job itself
        (the batch script), so `env` (computed before any node was known) is not used."""
        del env
        return f"slurm-job-{self.cluster.submit_once()}"

    def read_log(self, offset: int, max_bytes: int) -> bytes:
        return self._files.read_from(f"{self._dir}/node.log", offset, max_bytes)

    def poll(self) -> tuple[str, int | None]:
        """exit_code on the shared work dir first; else the job's state: still holding its nodes
        is "alive", ended (and the file system given time to show exit_code) is "gone"."""
        d = shlex.quote(self._dir)
        res = self._files.run(
            f"cd {d} 2>/dev/null || {{ echo nodir; exit 0; }}\n"
            'if [ -f exit_code ]; then echo "exit $(cat exit_code)"; else echo none; fi',
            check=False,
        )
        out = res.stdout.strip()
        if out.startswith("exit "):
            answer = protocol.parse_poll(out, res.exit_code)
            if answer is not None:
                return answer
        if out not in ("none", "nodir"):
            raise InfraError(
                f"unexpected answer from the login node while polling {self.node.name} "
                f"(exit {res.exit_code}): {excerpt(res.stdout, 3, 200)!r}"
            )
        if self.cluster.job_id is None:
            return "gone", None  # never submitted: nothing runs
        if self.cluster.ended_long_enough():
            return "gone", None
        return "alive", None

    def cancel(self, timeout_s: float) -> str:
        """Mark this node's run cancelled (node.sh's EXIT trap reads the mark), then end the job
        (once for all nodes: the cluster holds the lock)."""
        d = shlex.quote(self._dir)
        self._files.run(
            f"cd {d} 2>/dev/null && touch {protocol.CANCEL_MARK} && rm -f {protocol.SECRETS_FILE}",
            check=False,
        )
        return self.cluster.cancel_job(timeout_s)

    def was_cancelled(self) -> bool:
        return self._files.run(protocol.cancelled_command(self._dir), check=False).exit_code == 0

    def end(self) -> None:
        self._files.run(protocol.end_command(self._dir), check=False)

    def heartbeat(self) -> None:
        """A job's nodes do not end themselves after the run: nothing waits for a follower."""

    def cleanup(self) -> None:
        """The job's task removes the node's container when its wrapper ends (the login node has
        no docker of the compute nodes)."""

    def collect(self) -> tuple[dict[str, bytes], list[str]]:
        answer = self._files.run(protocol.collect_command(self._dir), check=False)
        return protocol.parse_collect(answer.stdout)

    def close(self) -> None:
        self._files.close()
