"""The nodes of one run as the session follows them, and how a failed one is named.

A run of several nodes is one run: node 0 (the Ray head) runs the recipe and prints the training
metrics; the others only serve it. So a node other than 0 that ends before node 0 is done, or
cannot be reached, fails the whole run: the session stops it everywhere, and the words built here
(which node, which stage, what it printed last) go into the error, status.json and the run's
timeline, from which the verdict names the node (docs/architecture.md, "Several nodes").
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from launcher.clusters.base import Cluster, Node
from launcher.clusters.contract import WithLentNode, WithSchedulerJob
from launcher.clusters.execution import Execution, Place
from launcher.errors import ReproduceError
from launcher.records.rundir import Stage, Timeline
from launcher.runner.outcome import CHECK_STAGES, failed_stage, tail_of
from launcher.runner.stream import Ended, Follower

# How often the cluster is asked about its nodes while a run is followed (cluster.lost_nodes():
# aws asks EC2; one call for all nodes).
HEALTH_EVERY_S = 30.0
TIMELINE_WRITE_S = 1.0  # timeline.json's writes while a run goes (Throttled, session.py)
# After node 0 finished, how long the other nodes get to stop serving it before they are cancelled.
WORKER_END_S = 30.0
T = TypeVar("T")


@dataclass
class NodeRun:
    """One node of a run: how it is driven, the follower of its log, and how it ended."""

    index: int
    node: Node
    execution: Execution
    follower: Follower
    logs: Path  # the run's logs/ for node 0, logs/node-K/ for node K
    timeline: Timeline  # node 0's is the run's
    ended: Ended | None = None

    @property
    def label(self) -> str:
        return f"node {self.index} ({self.node.name})"


class NodeFailure(Exception):  # noqa: N818 - an event of the run, not a program error
    """A node failed or was lost while the run went on: the run stops on every node."""

    def __init__(
        self, node: NodeRun | None, what: str, *, lost: bool = False, void: bool = False
    ) -> None:
        super().__init__(what)
        self.node = node
        self.what = what
        self.lost = lost
        # the scheduler ended (or restarted) the run for reasons of its own: no verdict is given
        self.void = void

    @property
    def stage(self) -> str | None:
        """The stage the node failed in (or was in when it was lost)."""
        if self.node is None:
            return None
        running = [s.name for s in self.node.timeline.stages if s.status == "running"]
        return failed_stage(self.node.timeline) or (running[-1] if running else None)

    @property
    def check(self) -> bool:
        """A check of the recipe said no on that node (its image's stack): exit 1, not 3."""
        return not self.lost and self.stage in CHECK_STAGES


def place_of(
    node: Node, index: int, count: int, run_id: str, node_run_dir: str, container: str
) -> Place:
    """Where node `index` of `count` keeps its part of the run: the plan's run dir (or the node's
    own work_dir's), and for several nodes a container name of its own (docker on one host may
    serve several "nodes", and the name says which node a container belongs to)."""
    run_dir = f"{node.work_dir.rstrip('/')}/runs/{run_id}" if node.work_dir else node_run_dir
    return Place(run_id, run_dir, container if count == 1 else f"{container}-node{index}")


def names(node_name: str, sentence: str) -> bool:
    """Does the cluster's sentence name this node? (node2 is not node20, 127.0.0.3 not .30)"""
    return re.search(rf"(?<![\w.]){re.escape(node_name)}(?![\w])", sentence) is not None


def acquiring_words(cluster: Cluster, what: str) -> str:
    """What a run says as it acquires: a nightly group's node (launcher/runner/held.py), once
    acquired, is the node of the run that acquired it."""
    if isinstance(cluster, WithLentNode) and cluster.lent_from is not None:
        return f"on the nightly group's node, acquired by {cluster.lent_from}"
    return f"acquiring {what} ({cluster.name})"


def ended_early(n: NodeRun, code: int | None) -> str:
    """Why node K ending before node 0 fails the run: its stage, exit code and last words."""
    stage = failed_stage(n.timeline)
    running = [s.name for s in n.timeline.stages if s.status == "running"]
    where = stage or (running[-1] if running else None)
    how = f"exit code {code}" if code is not None else "no exit code (killed?)"
    log = n.logs / f"{where}.log" if where else n.logs / "node.log"
    at = f" in stage {where}" if where else ""
    return f"{n.label} ended{at} with {how} before node 0 finished; see {log}.{tail_of(log)}"


def check_scheduler(
    cluster: Cluster, nodes: list[NodeRun], *, now: bool = False, timeline: Timeline | None = None
) -> None:
    """What a scheduler says of the run's job, where the cluster can tell (`WithSchedulerJob`).
    When the job started
    holding its nodes (`cluster.job_started_at()`): the run's clock (GPU-hours, the budget)
    starts there, never while the job waited in the queue. And whether it ended or restarted
    the job for reasons of its own (`cluster.job_failure(now=)`; slurm: NODE_FAIL, PREEMPTED,
    TIMEOUT, a requeue): NodeFailure, the run stops with no verdict, naming the node(s). `now`:
    a node's script just ended, and the scheduler may be what ended it, so it is asked afresh.
    No answer is no news about the job."""
    if not isinstance(cluster, WithSchedulerJob):
        return
    at = cluster.job_started_at() if timeline is not None else None
    if isinstance(at, float) and timeline is not None and (timeline.acquired_at or 0) < at:
        timeline.acquired_at = at
    try:
        word = cluster.job_failure(now=now)
    except (ReproduceError, OSError, EOFError):
        return
    if word:
        named = next((n for n in nodes if names(n.node.name, str(word))), None)
        raise NodeFailure(named, str(word), lost=True, void=True)


def failure_text(failed: NodeFailure, problems: list[str]) -> str:
    """The error of a run stopped on every node by one that failed or was lost."""
    text = f"{failed.what}\nThe run was stopped on every node and the cluster released."
    if failed.void:
        text += " No verdict: the scheduler, not the recipe, ended this attempt."
    if problems:
        text += " Not everything could be stopped: " + "; ".join(problems) + "."
    if failed.lost and failed.node is not None and not failed.void:
        text += (
            f" {failed.node.label} could not be reached: the run may still be going on "
            "there (and costing money)."
        )
    return text


def failed_entry(failed: NodeFailure) -> Stage:
    """The failed node's stage as a stage of the run's timeline (`node-K:STAGE`, failed): the
    verdict's reasons list the failed stages, so it names the node."""
    if failed.node is None:
        name = "nodes:lost"
    else:
        name = f"node-{failed.node.index}:{failed.stage or ('lost' if failed.lost else 'ended')}"
    return Stage(name, end=time.time(), status="failed")


def quietly(action: Callable[[], T]) -> T | None:
    """A node operation whose failure changes nothing at this point (None then)."""
    try:
        return action()
    except (ReproduceError, OSError, EOFError):
        return None


def cancel_quietly(nodes: list[NodeRun], timeout_s: float) -> list[str]:
    """Cancel the run on these nodes, each tried; what could not be stopped, a line per node."""
    problems = []
    for n in nodes:
        try:
            left = n.execution.cancel(timeout_s)
        except (ReproduceError, OSError, EOFError) as err:
            problems.append(f"{n.label}: not reached ({str(err).splitlines()[0]})")
            continue
        if left:
            problems.append(f"{n.label}: still there: {left}")
    return problems


def end_workers(
    nodes: list[NodeRun], *, graceful: bool, poll_s: float, cancel_timeout_s: float = 120.0
) -> list[str]:
    """Node 0 ended: the others stop serving it. After a success they are told (END_MARK) and
    given WORKER_END_S to end their stage cleanly (exit 0); what still runs then is cancelled.
    Returns what could not be stopped."""
    workers = [n for n in nodes[1:] if n.ended is None]
    deadline = time.monotonic() + (WORKER_END_S if graceful else 0.0)
    if graceful:
        for n in workers:
            quietly(n.execution.end)
    while workers and time.monotonic() < deadline:
        for n in list(workers):
            ended = quietly(n.follower.check)
            if ended is not None:
                n.ended = ended
                workers.remove(n)
        if workers:
            time.sleep(min(0.5, poll_s))
    return cancel_quietly(workers, cancel_timeout_s) if workers else []


def on_each(nodes: list[NodeRun], action: Callable[[NodeRun], T]) -> list[T]:
    """`action` on every node at once (staging N nodes one after another costs N times as long);
    results in node order; the first failure (in node order) is raised once all are done. One
    node: in this thread."""
    if len(nodes) == 1:
        return [action(nodes[0])]
    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        futures = [pool.submit(action, n) for n in nodes]
        return [f.result() for f in futures]


class Throttled:
    """A write done at most every `every_s` seconds, when something changed since the last one.

    Why: timeline.json follows the node's stage markers, and a flood of markers (any process of
    the node can print them) must not cost the launcher a file write each while the budget waits
    (records/rundir.py, MAX_STAGES); the follow loop calls due() to write what is left."""

    def __init__(self, write: Callable[[], object], every_s: float = TIMELINE_WRITE_S) -> None:
        self.write, self.every_s = write, every_s
        self.changed, self.last = False, float("-inf")

    def due(self, *, changed: bool = False) -> None:
        self.changed = self.changed or changed
        now = time.monotonic()
        if self.changed and now - self.last >= self.every_s:
            self.write()
            self.last, self.changed = now, False
