"""One run's state while the Runner drives it: its nodes, its timeline, whether the cluster is kept.

A new run, an attach and a cancel each make a RunSession from the run directory's record. The
nodes are a list, each driven through an Execution (launcher/clusters/execution.py): staging,
launching, following, cancelling, cleaning up and collecting are loops over it. Node 0's log and
markers are the run's (logs/, timeline.json); node K's go to logs/node-K/.

With several nodes (docs/architecture.md, "Several nodes"), node 0 is the Ray head and runs the
recipe; the others serve it. A node other than 0 that ends, or is lost, before node 0 is done
stops the run on every node (launcher/runner/nodes.py words it); when node 0 ends, the others are
told to stop, and cancelled if they do not.

A node lost for longer than the reconnect window is kept running only when someone is there to
reattach (an interactive run, as before); an unattended run (nightly, no terminal) cancels it and
releases the cluster instead of paying for it until its TTL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

from launcher.clusters import trust
from launcher.clusters.base import Cluster, Node
from launcher.clusters.contract import (
    WithBudgetWatch,
    WithDownCommand,
    WithNodeHealth,
    WithSchedulerJob,
    execution_for,
)
from launcher.clusters.execution import node_env
from launcher.cost.budget import Budget
from launcher.errors import (
    Cancelled,
    CheckFailed,
    Detached,
    InfraError,
    Interrupted,
    ReproduceError,
)
from launcher.inputs.recipe import Recipe
from launcher.records.rundir import TRAIN_STAGE, RunDir, RunDirUnwritable, Timeline
from launcher.runner.nodes import (
    HEALTH_EVERY_S,
    NodeFailure,
    NodeRun,
    Throttled,
    acquiring_words,
    cancel_quietly,
    check_scheduler,
    end_workers,
    ended_early,
    failed_entry,
    failure_text,
    names,
    on_each,
    place_of,
    quietly,
)
from launcher.runner.outcome import Outcome, detached_message, failure, reattach_hint
from launcher.runner.reporter import Reporter
from launcher.runner.signals import Terminated, handled, raise_pending, release_hard, signals_cancel
from launcher.runner.stream import Follower

T = TypeVar("T")
CANCEL_TIMEOUT_S = 120.0
# A cancel sent after the connection was already lost for a whole reconnect window: short, so an
# unreachable node does not hold up the release.
LOST_CANCEL_TIMEOUT_S = 30.0

if TYPE_CHECKING:
    from launcher.judge.measure import Result
    from launcher.judge.verdict import Verdict


class BudgetExceeded(Exception):  # noqa: N818 - an event of the run, not a program error
    """The run reached --max-usd or --max-hours: it is cancelled on the node, then released."""


@dataclass(frozen=True)
class Settings:
    """How runs are followed: the Runner's choices, the same for every run it drives."""

    reporter: Reporter
    on_interrupt: str
    poll_s: float
    reconnect_s: float
    measure: bool
    scripts_dir: Path | None
    unattended: bool = False  # nobody to reattach: a lost node is cancelled and released


class RunSession:
    """One run's state while the Runner drives it (a new run, an attach or a cancel)."""

    def __init__(
        self,
        rd: RunDir,
        cluster: Cluster,
        *,
        recipe: Recipe | None,
        budget: Budget | None,
        settings: Settings,
    ) -> None:
        self.settings = settings
        self.reporter = settings.reporter
        self.rd = rd
        self.cluster = cluster
        self.recipe = recipe  # judged against when the run ends; None: not judged
        self.budget = budget
        record = rd.record()
        self.run_id: str = record.get("run_id") or rd.path.name
        self.node_run_dir: str = record["node_run_dir"]
        self.container: str = record["container"]
        self.timeline = rd.timeline()
        self.keep_cluster = False
        self.nodes: list[NodeRun] = []
        self._next_health = time.monotonic() + HEALTH_EVERY_S
        self._timeline_writes = Throttled(lambda: rd.write_timeline(self.timeline))

    def connect(self, nodes: list[Node]) -> None:
        """Executions and log followers for the nodes; node 0's log and markers are the run's."""
        steps = self.recipe.steps_per_run if self.recipe is not None else None
        for index, node in enumerate(nodes):
            place = place_of(
                node, index, len(nodes), self.run_id, self.node_run_dir, self.container
            )
            execution = execution_for(self.cluster, node, place)
            head = index == 0
            logs = self.rd.logs if head else self.rd.logs / f"node-{index}"
            timeline = self.timeline if head else Timeline()
            follower = Follower(
                execution,
                logs,
                timeline=timeline,
                reporter=self.reporter,
                on_marker=self._on_marker if head else None,
                steps_total=steps if head else None,
                poll_s=self.settings.poll_s,
                reconnect_s=self.settings.reconnect_s,
                while_reconnecting=self._stop_if_over_budget,
            )
            self.nodes.append(NodeRun(index, node, execution, follower, logs, timeline))

    def _on_marker(self, marker: Mapping[str, str]) -> None:
        self._timeline_writes.due(changed=True)  # the follow loop writes what is left
        self.reporter.stage(marker["stage"], marker["event"], marker.get("status", "ok"))

    # --- starting -----------------------------------------------------------------------------

    def start(self, node_script: str, secrets: Mapping[str, str] | None) -> None:
        """Acquire, stage and launch; an interrupt before the launch leaves nothing running."""
        launched = False
        try:
            self.rd.set_status("acquiring")
            self.reporter.say(acquiring_words(self.cluster, self._what()))
            # The clock starts when acquiring starts: a cloud bills from the launch, not from the
            # moment the node answers SSH, so GPU-hours and the budget count the boot too.
            acquire_started = time.time()
            if self.budget is not None and isinstance(self.cluster, WithBudgetWatch):
                self.cluster.watch_budget(self.budget, acquire_started)  # a slow boot is billed
            nodes = self.cluster.acquire()
            self.timeline.acquired_at = acquire_started
            self.rd.write_timeline(self.timeline)
            self.rd.update_record(node=asdict(nodes[0]), nodes=[asdict(n) for n in nodes])
            self.connect(nodes)
            self.rd.set_status("staging")
            try:
                on_each(
                    self.nodes,
                    lambda n: n.execution.stage(node_script, self.settings.scripts_dir, secrets),
                )
                raise_pending()  # a Ctrl-C dropped while staging: nothing is launched
                launched = True  # from here an interrupt cancels on the node (harmless if not)
                ids = on_each(self.nodes, lambda n: n.execution.launch(self._launch_env(nodes, n)))
            except BaseException:
                if secrets:  # a node script that never started never deleted them
                    for n in self.nodes:
                        n.execution.discard_secrets()
                raise
            # a process id where node 0's launch is a process; a job's or a submission's id
            # (slurm, ray) is in launch_ids only: run.json's pid is a process id or nothing
            pid = int(ids[0]) if ids[0].isdigit() else None
            self.rd.update_record(pid=pid, launch_ids=ids, launched_at=time.time())
            where = self.nodes[0].node.name if len(ids) == 1 else f"{len(ids)} nodes"
            self.reporter.say(
                f"node script started on {where} (pid {', '.join(ids)}); run dir {self.rd.path}"
            )
        except KeyboardInterrupt as err:
            handled()
            if launched:
                self.reporter.say("cancelling the run on the node")
                self.cancel_or_keep_billing()
            self.rd.set_status("cancelled", "interrupted before the run started")
            why = f"stopped by {err.signame}" if isinstance(err, Terminated) else "interrupted"
            raise Interrupted(
                f"{why} before the node script started; nothing was left running."
            ) from None

    def _what(self) -> str:
        nodes = self.recipe.nodes if self.recipe is not None else 1
        return "a node" if nodes == 1 else f"{nodes} nodes"

    @staticmethod
    def _launch_env(nodes: list[Node], n: NodeRun) -> dict[str, str]:
        """A multi-node run's node learns its rank, the head and its own run dir at launch."""
        env = node_env(nodes, n.index)
        if env:
            env["NODE_RUN_DIR"] = n.execution.place.node_run_dir
        return env

    # --- following ----------------------------------------------------------------------------

    def follow(self) -> Outcome:
        """Stream to the end, handling Ctrl-C/SIGTERM, the budget and a lost node; then finish.

        The caller holds the run dir's follow lock (launcher/runner/stream.py, follow_lock).
        """
        with signals_cancel():
            try:
                for n in self.nodes:
                    n.follower.splitter.rebuild()
                head_dir = self.nodes[0].execution.place.node_run_dir
                self.rd.set_status("running", pid_file=f"{head_dir}/pid")
                code = self._follow_nodes()
            except KeyboardInterrupt as err:
                handled()
                self._interrupted(err)
            except NodeFailure as err:
                self._node_failed(err)
            except BudgetExceeded as err:
                self.reporter.say(f"budget reached: {err}; cancelling the run on the node")
                self.cancel_or_keep_billing(following=True)
                self._stop_following("cancelled", f"budget reached: {err}")
                raise CheckFailed(
                    f"stopped: {err}. The run was cancelled on the node and the node released."
                ) from None
            except RunDirUnwritable as err:
                raise self.lost(
                    f"cannot write the run directory: {err}",
                    f"{err}. The node is fine, but the launcher cannot record the run; "
                    "free space, then reattach.",
                    err,
                ) from err
            except InfraError as err:
                raise self.lost(
                    f"lost the node: {err}",
                    f"{err}. The run may still be going on on the node "
                    "(its GPUs keep costing money).",
                    err,
                ) from err
            return self.finish(code)

    def _follow_nodes(self) -> int | None:
        """Until node 0's script ends: its exit code (None when it vanished without one).

        Another node that ends first, or cannot be reached for the reconnect window, is a
        NodeFailure (unless `reproduce cancel` marked it: the others are being cancelled too).
        One node lost alone is the InfraError of before: the run may go on without us.
        """
        # The other nodes first: when one dies, node 0's training fails soon after because of it,
        # and the node that died is the news.
        order = self.nodes[1:] + self.nodes[:1]
        while True:
            raise_pending()  # an interrupt whose exception was dropped in a finalizer
            check_scheduler(self.cluster, self.nodes, timeline=self.timeline)  # job's start, end
            for n in order:
                if n.ended is not None:
                    continue
                try:
                    ended = n.follower.check()
                except RunDirUnwritable:
                    raise
                except InfraError as err:
                    if len(self.nodes) == 1:
                        raise
                    raise NodeFailure(n, f"lost {n.label}: {err}", lost=True) from err
                if ended is None:
                    continue
                n.ended = ended
                check_scheduler(self.cluster, self.nodes, now=True)  # ended by the scheduler?
                if n.index == 0:
                    return ended.code
                if quietly(n.execution.was_cancelled):
                    cancel_quietly(self.nodes, CANCEL_TIMEOUT_S)  # `reproduce cancel`
                    continue
                word = self._cluster_word(n) if ended.code is None else None
                if word:  # killed with its machine (an instance terminated): the cluster says so
                    raise NodeFailure(n, f"{word}; {ended_early(n, ended.code)}", lost=True)
                raise NodeFailure(n, ended_early(n, ended.code))
            self._check_health()
            self._stop_if_over_budget()
            self._timeline_writes.due()
            time.sleep(self.settings.poll_s)

    def _cluster_word(self, n: NodeRun) -> str | None:
        """What the cluster says, asked now, about a node whose script vanished without an exit
        code (None: nothing, or a backend that cannot tell)."""
        if not isinstance(self.cluster, WithNodeHealth):
            return None
        try:
            lost = [str(x) for x in self.cluster.lost_nodes(now=True)]
        except Exception:  # noqa: BLE001 - a failed probe is no news about the node
            return None
        return "; ".join(x for x in lost if names(n.node.name, x)) or None

    def _check_health(self) -> None:
        """The cluster's own word on its nodes (aws: an instance terminated under the run), asked
        every HEALTH_EVERY_S when the backend can tell (`WithNodeHealth`)."""
        if not isinstance(self.cluster, WithNodeHealth) or time.monotonic() < self._next_health:
            return
        self._next_health = time.monotonic() + HEALTH_EVERY_S
        try:
            lost = [str(x) for x in self.cluster.lost_nodes()]
        except Exception:  # noqa: BLE001 - a failed probe is no news about the nodes
            return
        if lost:
            named = next((n for n in self.nodes if any(names(n.node.name, x) for x in lost)), None)
            raise NodeFailure(named, "; ".join(lost), lost=True)

    def _node_failed(self, failed: NodeFailure) -> NoReturn:
        """A node failed or was lost: the run stops on every node, what they printed is kept, the
        cluster is released, and the error (and status.json, and the verdict when training had
        begun) names the node and what happened to it."""
        self.reporter.say(f"{failed.what.splitlines()[0]}; stopping the run on every node")
        skip = failed.node if failed.lost else None  # already unreachable for a whole window
        others = [n for n in self.nodes if n is not skip]
        problems = cancel_quietly(others, LOST_CANCEL_TIMEOUT_S)
        self.drain_quietly()
        self.timeline.stages.append(failed_entry(failed))
        self.write_quietly(lambda: self.close_logs("cancelled"))
        self.write_quietly(lambda: self._collect(others, quick=True))
        self.write_quietly(lambda: self.rd.set_status("failed", failed.what.splitlines()[0]))
        self.keep_cluster = False
        try:
            self.release()
        except ReproduceError as err:  # the caller releases again and reports what is left
            self.reporter.say(f"teardown did not finish yet ({str(err).splitlines()[0]})")
        trained = any(s.name == TRAIN_STAGE for s in self.timeline.stages)
        if self.settings.measure and trained and not failed.void:
            self.write_quietly(self.judge)
        text = failure_text(failed, problems)
        raise (CheckFailed(text) if failed.check else InfraError(text)) from None

    def _stop_if_over_budget(self) -> None:
        """Raise BudgetExceeded past --max-usd/--max-hours (also between reconnection tries)."""
        reason = self._over_budget()
        if reason:
            raise BudgetExceeded(reason)

    def _over_budget(self) -> str | None:
        start = self.timeline.acquired_at
        if self.budget is None or start is None:
            return None
        return self.budget.check(time.time() - start)

    def _interrupted(self, err: KeyboardInterrupt) -> NoReturn:
        """Ctrl-C (or SIGTERM/SIGHUP) while following: detach, or cancel on the node."""
        if isinstance(err, Terminated):
            choice = "cancel"
        elif self.settings.on_interrupt != "ask":
            choice = self.settings.on_interrupt
        else:
            choice = self.reporter.choose()
        if choice == "detach":
            self.close_logs("running")
            self.keep_cluster = True
            self.rd.set_status("detached", "detached by the user; the run goes on on the node")
            raise Detached(detached_message(self.rd, self.cluster)) from None
        self.reporter.say("cancelling the run on the node")
        self.cancel_or_keep_billing(following=True)
        self._stop_following("cancelled", "cancelled by the user (Ctrl-C or SIGTERM)")
        raise Interrupted(
            "cancelled: the run's processes and container on the node were stopped."
        ) from None

    def _stop_following(self, state: str, detail: str) -> None:
        self.drain_quietly()
        self.write_quietly(lambda: self.close_logs("cancelled"))
        self.write_quietly(lambda: self.rd.set_status(state, detail))

    def write_quietly(self, write: Callable[[], object]) -> None:
        """A write to the run dir on a way out: when the launcher's disk refuses it, say so and go
        on, so the cancel and the release still happen."""
        try:
            write()
        except (RunDirUnwritable, OSError) as err:
            self.reporter.warn(f"warning: {err}")

    # --- the node's side -------------------------------------------------------------------------

    def cancel_on_nodes(self, timeout_s: float = CANCEL_TIMEOUT_S) -> None:
        """Stop the run on every node; InfraError naming what could not be stopped.

        With several nodes every node is tried, even after one could not be reached.
        """
        left = []
        for n in self.nodes:
            try:
                still = n.execution.cancel(timeout_s)
            except InfraError as err:
                if len(self.nodes) == 1:
                    raise
                left.append(f"{n.label}: not reached ({str(err).splitlines()[0]})")
                continue
            if still:
                left.append(still if len(self.nodes) == 1 else f"{n.label}: {still}")
        if left:
            raise InfraError(
                f"cancel could not stop everything on the node: still there: {'; '.join(left)}"
            )

    def cancel_or_keep_billing(self, *, following: bool = False) -> None:
        """Cancel on the nodes; when that fails the run may go on, and the user is told how to
        end it. The cluster is still released: a cancel was asked for, not a detach."""
        try:
            self.cancel_on_nodes()
        except InfraError as err:
            error = self.left_running(
                f"cancel failed: {err}",
                f"could not cancel the run on the node: {err}. It may still be running "
                "(and costing money).",
                close_logs=following,
            )
            self.keep_cluster = False
            raise error from err

    def lost(self, why: str, message: str, cause: InfraError) -> InfraError:
        """The node cannot be followed any more (unreachable, or the run dir cannot be written).

        Interactive: the run goes on and the user is told how to reattach or cancel. Unattended:
        nobody will reattach, so the run is cancelled on the node (when it answers) and the
        cluster released (a node this run launched is ended), instead of billing until its TTL.
        """
        if not self.settings.unattended:
            return self.left_running(why, message)
        self.reporter.say(f"{why}; unattended run: cancelling it and releasing the node")
        try:
            self.cancel_on_nodes(timeout_s=LOST_CANCEL_TIMEOUT_S)
            outcome = "it was cancelled on the node"
        except ReproduceError as err:
            outcome = f"it could not be cancelled on the node ({str(err).splitlines()[0]})"
        self._stop_following("failed", f"{why}; unattended: cancelled and released")
        self.keep_cluster = False
        if isinstance(self.cluster, WithDownCommand):
            after = "the node this run launched is being ended."
        else:
            after = (
                "the cluster was released; if the run still goes on there, stop it with "
                f"`reproduce cancel {self.rd.path}`."
            )
        return InfraError(f"{message} Unattended run: {outcome}, and {after}")

    def left_running(self, why: str, message: str, *, close_logs: bool = True) -> InfraError:
        """The run may go on without us: keep the nodes, say so, and how to reattach or cancel."""
        if close_logs:
            self.write_quietly(lambda: self.close_logs("running"))
        self.keep_cluster = True
        self.write_quietly(lambda: self.rd.set_status("detached", why))
        hint = reattach_hint(self.rd)
        if isinstance(self.cluster, WithDownCommand):  # a launched node bills until ended
            cost = (
                f" (about ${self.budget.usd_per_hour:.2f}/h)"
                if self.budget and self.budget.usd_per_hour
                else ""
            )
            hint += (
                f" The node keeps billing{cost} until you end it: `{self.cluster.down_command()}`."
            )
        return InfraError(message, hint=hint)

    def rebuild_logs(self) -> None:
        for n in self.nodes:
            n.follower.splitter.rebuild()

    def drain_quietly(self) -> None:
        for n in self.nodes:
            n.follower.drain_quietly()

    def close_logs(self, stage_status: str) -> None:
        for n in self.nodes:
            n.follower.finish_logs(stage_status)
        self.rd.write_timeline(self.timeline)

    # --- the end ------------------------------------------------------------------------------

    def _on_node(self, n: NodeRun, what: str, action: Callable[[], T]) -> T | None:
        """A node operation after the script ended, retried over the reconnect window; None (and a
        warning) when the node stays unreachable: the log is complete, so the run still counts."""
        try:
            return n.follower.with_reconnect(action)
        except RunDirUnwritable:
            raise
        except (InfraError, OSError, EOFError) as err:
            self.reporter.warn(f"warning: could not {what} on {n.node.name}: {err}")
            return None

    def finish(self, code: int | None) -> Outcome:
        """The script ended: collect, release, then judge (the node no longer bills meanwhile).

        A connection that drops now is reconnected (the run's outcome is known already); one that
        never comes back costs the result files, not the run.
        """
        head = self.nodes[0]
        if len(self.nodes) > 1:
            left = end_workers(self.nodes, graceful=code == 0, poll_s=self.settings.poll_s)
            for problem in left:
                self.reporter.warn(f"warning: {problem}")
            self.drain_quietly()
        marked = self._on_node(
            head, "check whether the run was cancelled", head.execution.was_cancelled
        )
        # unreachable: a script that exited 0 was not cancelled; any other code reads as a failure
        cancelled = bool(marked)
        ok = code == 0 and not cancelled
        self.close_logs("ok" if ok else ("cancelled" if cancelled else "failed"))
        self.rd.set_status("collecting")
        collected = self._collect(self.nodes)
        self.rd.update_record(exit_code=code, collected=collected)
        try:
            self.release()  # before judging: released_at dates the GPU-hours
        except ReproduceError as err:
            # Judge the run all the same; the caller releases again and, if something is still
            # left then, raises what is left and how to end it.
            self.reporter.say(
                f"teardown did not finish yet ({str(err).splitlines()[0]}); retrying after judging"
            )
        if cancelled:
            self.rd.set_status(
                "cancelled", "cancelled on the node (reproduce cancel)", exit_code=code
            )
            raise Cancelled(f"the run was cancelled on the node (exit code {code}).")
        if not ok:
            on = head.label if len(self.nodes) > 1 else None
            stage, error = failure(self.rd, self.timeline, code, node=on)
            self.rd.set_status("failed", str(error).splitlines()[0], exit_code=code)
            if stage == TRAIN_STAGE and self.settings.measure:
                self.judge()  # the figures so far and a "failed" verdict, kept in the run dir
            raise error
        self.rd.set_status("done", "the node script finished; logs collected", exit_code=0)
        self.reporter.say(f"node script finished; run dir {self.rd.path}")
        measurement = self.judge() if self.settings.measure else None
        return Outcome("done", 0, self.rd.path, measurement)

    def _collect(self, nodes: list[NodeRun], *, quick: bool = False) -> list[str]:
        """Remove each node's container and bring its result files back: node 0's into the run
        dir, node K's into logs/node-K/. `quick`: one try per node (it is being given up on)."""
        collected: list[str] = []
        for n in nodes:
            got: tuple[dict[str, bytes], list[str]] | None
            if quick:
                quietly(n.execution.cleanup)
                got = quietly(n.execution.collect)
            else:
                self._on_node(n, "remove the run's container", n.execution.cleanup)
                got = self._on_node(n, "collect the result files", n.execution.collect)
            if got is None:
                continue
            files, refused = got
            for name, data in files.items():
                if n.index == 0:
                    self.rd.write_bytes(name, data)
                    collected.append(name)
                else:
                    self.rd.write_bytes(f"logs/node-{n.index}/{name}", data)
                    collected.append(f"logs/node-{n.index}/{name}")
            for why in refused:
                self.reporter.warn(f"warning: not collected from {n.node.name}: {why}")
        return sorted(collected)

    def judge(self) -> tuple[Result, Verdict] | None:
        """Measure the run and judge its claim (writes the verdict and report into the run dir)."""
        if self.recipe is None:
            return None
        from launcher.results.evaluate import measure_run_dir

        result, verdict = measure_run_dir(self.rd.path, self.recipe, write_page=False)
        diff = verdict.difference_percent
        diff_text = f" ({diff:+.2f}% vs the claim)" if diff is not None else ""
        self.reporter.say(f"verdict: {verdict.status}{diff_text}")
        for reason in trust.other_reasons(verdict.reasons, trust.run_kind(self.rd.path)):
            self.reporter.say(f"  {reason}")
        return result, verdict

    def release(self) -> None:
        """End what the cluster acquired, to the end even through Ctrl-C (unless kept)."""
        if self.keep_cluster:
            return
        self.timeline.releasing()  # collect ends here (GPU-hours by stage)
        try:
            error = release_hard(self.cluster, self.reporter.warn)
            if error is not None:
                raise error
        finally:
            if self.timeline.acquired_at is not None and self.timeline.released_at is None:
                self.timeline.released_at = self._held_until(time.time())
            self.write_quietly(lambda: self.rd.write_timeline(self.timeline))

    def _held_until(self, released: float) -> float:
        """When the run stopped holding its nodes: the release, or earlier, when a scheduler
        says its job ended before (`WithSchedulerJob.job_ended_at`; slurm): GPU-hours end there."""
        ended = self.cluster.job_ended_at() if isinstance(self.cluster, WithSchedulerJob) else None
        acquired = self.timeline.acquired_at
        if not isinstance(ended, float) or acquired is None or not acquired <= ended <= released:
            return released
        if self.timeline.release_started_at is not None:
            self.timeline.release_started_at = min(self.timeline.release_started_at, ended)
        return ended

    def release_after(self, original: BaseException | None) -> None:
        """The release on the way out of a run; a teardown failure keeps why the run failed."""
        try:
            self.release()
        except ReproduceError as failed:
            if original is None or str(original) == str(failed):
                raise
            # What is left (and how to end it) decides the exit code; why the run failed stays.
            raise type(failed)(f"{original}\n{failed.message}", hint=failed.hint) from original
