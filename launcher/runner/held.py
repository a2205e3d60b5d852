"""One node held across the runs of a group (`reproduce nightly`): acquired once, released once.

There is one run path (launcher/runner/runner.py): every run asks its cluster to acquire and to
release, as a single `reproduce RECIPE` does. In a nightly group the run's cluster is a
LentCluster: its acquire hands out the node the group's first run acquired (the first call
acquires it, through the real backend, with that run's budget watch and records), and its
release gives it back instead of ending it, so the run's timeline still dates its own end. The
HeldNode ends what was acquired once, on every way out of the group (the nightly's `finally`:
the last recipe done, a failure, Ctrl-C, SIGTERM, a budget stop), through the same release_hard a
single run's release goes through: a p5en left running costs $63/h.

Where the backend holds nodes apart from the runs on them (`WithAllocation`; slurm: an allocation
whose runs are its job steps), the group holds that allocation and each run keeps a cluster of its
own, made from its own plan: its acquire joins the group's allocation, and its release ends only
its own part (its step), leaving the allocation to the next recipe.

What a run breaks ends the group: a node the cluster says is gone (aws: terminated, a spot
interruption), a node that does not answer a command between two runs, or an acquire that
failed. The group's remaining recipes are then not run (recorded as infra, the reason named)
rather than paid a fresh provisioning unattended: a node lost once in a night is news for the
operator, and the next night tries again (docs/measurement.md, "One node for a night of recipes").
"""

from __future__ import annotations

import functools
import time
from abc import ABC
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.clusters.base import Cluster, Node, Transport
from launcher.clusters.contract import (
    WithAllocation,
    WithBudgetWatch,
    WithDownCommand,
    WithLeftovers,
    WithLentNode,
    WithNodeAfterRun,
    WithNodeHealth,
    WithOwnExecution,
    WithSchedulerJob,
)
from launcher.errors import InfraError, ReproduceError
from launcher.runner.signals import release_hard

if TYPE_CHECKING:
    from launcher.clusters.execution import Execution, Place
    from launcher.cost.budget import Budget

PROBE_TIMEOUT_S = 30.0  # a node that cannot run `true` in this long is not lent again


class HeldNode:
    """The node of one nightly group: made by its first run, lent to each run, released once."""

    def __init__(self, label: str, recipes: int, paths: Sequence[Path] = ()) -> None:
        self.label = label  # the group's shape, as the summary shows it
        self.recipes = recipes
        self.paths = tuple(paths)  # the group's recipes: what an allocation is sized for
        self.cluster: Cluster | None = None
        self.per_run = False  # each run has a cluster of its own inside the hold (WithAllocation)
        self.nodes: list[Node] | None = None
        self.holder: Path | None = None  # the run dir of the run that made the cluster (aws.json)
        self.lent = 0
        self.acquire_started: float | None = None
        self.acquire_s: float | None = None  # the cloud's provisioning, paid once for the group
        self.release_started: float | None = None
        self.released_at: float | None = None
        self.broken: str | None = None  # why no further run may use the node
        self.release_error: str | None = None

    # --- the run path's side ------------------------------------------------------------------

    def lend(self, make: Callable[[], Cluster], run_dir: Path) -> Cluster:
        """The cluster of the next run: the group's, made by `make` for the first run only."""
        if self.broken is not None:
            raise InfraError(f"the group's node is not usable: {self.broken}")
        if self.released_at is not None:
            raise InfraError("the group's node was already released")
        if self.cluster is None:
            own = make()
            self.holder = run_dir
            self.per_run = isinstance(own, WithAllocation)
            self.cluster = own.allocation(self.paths) if isinstance(own, WithAllocation) else own
        else:
            own = make() if self.per_run else self.cluster
        self.lent += 1
        return lent(self, own)

    def acquire(self) -> list[Node]:
        """The group's nodes: acquired by the first call (timed: the shared provisioning)."""
        if self.nodes is not None:
            return list(self.nodes)
        if self.broken is not None:
            raise InfraError(f"the group's node is not usable: {self.broken}")
        assert self.cluster is not None
        self.acquire_started = time.time()
        try:
            nodes = self.cluster.acquire()
        except BaseException as err:
            # A half-done launch is not tried again on the same cluster: the group's release
            # ends what it made, and the other recipes of the group are not run.
            first = str(err).splitlines()[0] if str(err).strip() else type(err).__name__
            self.broken = f"acquiring the node failed: {first}"
            raise
        self.acquire_s = time.time() - self.acquire_started
        self.nodes = list(nodes)
        return list(self.nodes)

    def to_record(self) -> dict[str, Any]:
        """run.json's `shared_node`: which group, which turn, which run holds the node's state
        (and, where each run has a cluster of its own, the hold's record once acquired)."""
        held = self.cluster.to_record() if self.per_run and self.nodes and self.cluster else None
        return {
            "group": self.label,
            "recipes": self.recipes,
            "turn": self.lent,
            "holder": str(self.holder) if self.holder else None,
            "released_by": "the nightly, after the group's last run",
            **({"held": held} if held is not None else {}),
        }

    # --- the nightly's side -------------------------------------------------------------------

    def check(self) -> str | None:
        """Before the node is lent again: why it may not be (None: it may). Asks the cluster
        (aws: EC2's word on its instances) and runs `true` on every node."""
        if self.broken is not None or self.cluster is None or self.nodes is None:
            return self.broken
        if isinstance(self.cluster, WithNodeHealth):
            try:
                lost = [str(x) for x in self.cluster.lost_nodes(now=True)]
            except Exception:  # noqa: BLE001 - no answer is no news; the command below decides
                lost = []
            if lost:
                self.broken = "; ".join(lost)
                return self.broken
        for node in self.nodes:
            try:
                transport: Transport = self.cluster.transport(node)
                transport.run("true", timeout_s=PROBE_TIMEOUT_S)
            except (ReproduceError, OSError, EOFError) as err:
                self.broken = f"{node.name} does not answer: {str(err).splitlines()[0]}"
                return self.broken
        return None

    def release(self, warn: Callable[[str], Any] = lambda _line: None) -> str | None:
        """End what the group acquired (once; to the end despite Ctrl-C); what is left, if any."""
        if self.cluster is None or self.released_at is not None:
            return self.release_error
        self.release_started = time.time()
        error = release_hard(self.cluster, warn)
        self.released_at = time.time()
        self.release_error = None if error is None else str(error)
        if error is not None:
            self.released_at = None  # not done: a second call tries again
        return self.release_error


class LentCluster(WithLentNode):
    """The group's cluster as one run sees it: the same nodes, a release that gives them back.

    Everything else (transports, the record attach and cancel read, and every capability the
    group's cluster declares: lost_nodes, down_command, ...) is the group's cluster's own, so the
    run is followed exactly as on a node of its own. `lent` makes it, declaring what the group's
    cluster declares (`_FORWARD`), and nothing more. Where the run has a cluster of its own
    inside the group's hold (`WithAllocation`), all of that is the run's own cluster's instead.
    """

    def __init__(self, held: HeldNode, cluster: Cluster) -> None:
        self._held = held
        self._cluster = cluster
        self.name = cluster.name

    @property
    def _own(self) -> bool:
        """The run has a cluster of its own inside the group's hold (not the hold itself)."""
        return self._cluster is not self._held.cluster

    def acquire(self) -> list[Node]:
        nodes = self._held.acquire()
        if self._own and isinstance(self._cluster, WithAllocation):
            assert self._held.cluster is not None
            return self._cluster.join(self._held.cluster, nodes)
        return nodes

    @property
    def lent_from(self) -> Path | None:
        """The run that acquired the group's node, once it is acquired (None: this run will)."""
        return self._held.holder if self._held.nodes is not None else None

    def transport(self, node: Node) -> Transport:
        return self._cluster.transport(node)

    def release(self) -> None:
        """Given back, not ended: the group's holder releases it after the group's last run.
        A run's own cluster inside the hold ends its own part (slurm: its step) and only that."""
        if self._own:
            self._cluster.release()

    def to_record(self) -> dict[str, Any]:
        return self._cluster.to_record()


class _LentBudgetWatch(LentCluster, WithBudgetWatch):
    def watch_budget(self, budget: Budget, started: float) -> None:
        assert isinstance(self._cluster, WithBudgetWatch)
        self._cluster.watch_budget(budget, started)


class _LentNodeHealth(LentCluster, WithNodeHealth):
    def lost_nodes(self, *, now: bool = False) -> list[str]:
        assert isinstance(self._cluster, WithNodeHealth)
        return self._cluster.lost_nodes(now=now)


class _LentLeftovers(LentCluster, WithLeftovers):
    def leftovers(self) -> list[str]:
        assert isinstance(self._cluster, WithLeftovers)
        return self._cluster.leftovers()


class _LentDownCommand(LentCluster, WithDownCommand):
    def down_command(self) -> str:
        assert isinstance(self._cluster, WithDownCommand)
        return self._cluster.down_command()


class _LentNodeAfterRun(LentCluster, WithNodeAfterRun):
    def node_after_run(self) -> str:
        assert isinstance(self._cluster, WithNodeAfterRun)
        return self._cluster.node_after_run()


class _LentOwnExecution(LentCluster, WithOwnExecution):
    def execution(self, node: Node, place: Place) -> Execution:
        assert isinstance(self._cluster, WithOwnExecution)
        return self._cluster.execution(node, place)


class _LentSchedulerJob(LentCluster, WithSchedulerJob):
    def job_started_at(self) -> float | None:
        assert isinstance(self._cluster, WithSchedulerJob)
        return self._cluster.job_started_at()

    def job_ended_at(self) -> float | None:
        assert isinstance(self._cluster, WithSchedulerJob)
        return self._cluster.job_ended_at()

    def job_failure(self, *, now: bool = False) -> str | None:
        assert isinstance(self._cluster, WithSchedulerJob)
        return self._cluster.job_failure(now=now)


# Each capability a lent cluster passes on, and the class that passes it on (WithLentNode is the
# lent cluster's own): tests/clusters/test_contract.py fails for a capability missing here.
_FORWARD: dict[type[ABC], type[LentCluster]] = {
    WithBudgetWatch: _LentBudgetWatch,
    WithNodeHealth: _LentNodeHealth,
    WithLeftovers: _LentLeftovers,
    WithDownCommand: _LentDownCommand,
    WithNodeAfterRun: _LentNodeAfterRun,
    WithOwnExecution: _LentOwnExecution,
    WithSchedulerJob: _LentSchedulerJob,
}


@functools.cache
def _lent_class(forwarded: tuple[type[LentCluster], ...]) -> type[LentCluster]:
    if not forwarded:
        return LentCluster
    return type("LentCluster", forwarded, {"__doc__": LentCluster.__doc__})


def lent(held: HeldNode, cluster: Cluster) -> LentCluster:
    """The group's cluster lent to one run, declaring exactly the capabilities it declares."""
    forwarded = tuple(f for cap, f in _FORWARD.items() if isinstance(cluster, cap))
    return _lent_class(forwarded)(held, cluster)
