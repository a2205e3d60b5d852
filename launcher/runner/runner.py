"""The runner: every backend (local, SSH, AWS) executes a Plan's node script through here.

    acquire -> stage node.sh + scripts/ into the node run dir -> launch detached -> stream node.log
    by byte offset into the run dir -> fetch the exit code, collect *.json -> release -> judge

`Runner` holds how runs are followed (reporter, interrupt policy, poll and reconnect intervals);
`execute`, `attach` and `cancel` each drive one `_Run`, the state of one run. A run's nodes are a
list (`_Run.nodes`): staging, launching, following, cancelling and cleaning up are loops over it.
See docs/architecture.md ("Data flow", "Run directory", "Exit codes").
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from launcher import clusters
from launcher.budget import Budget
from launcher.clusters.base import Cluster, LaunchOptions, Node, Transport
from launcher.errors import BadInput, CheckFailed, InfraError, Interrupted, ReproduceError
from launcher.recipe import Recipe, load_recipe
from launcher.rundir import FINAL_STATES, TRAIN_STAGE, RunDir, Timeline, default_runs_root
from launcher.runner import protocol, staging
from launcher.runner.outcome import Outcome, failure, reattach_hint
from launcher.runner.reporter import INTERRUPT_CHOICES, QuietReporter, Reporter
from launcher.runner.signals import Terminated, release_hard, signals_cancel
from launcher.runner.stream import Follower, follow_lock

if TYPE_CHECKING:
    from launcher.plan import Plan
    from launcher.reproduction import Options, Prepared


class BudgetExceeded(Exception):  # noqa: N818 - an event of the run, not a program error
    """The run reached --max-usd or --max-hours: it is cancelled on the node, then released."""


class Runner:
    """Runs Plans on clusters and follows them to the end; one Runner serves any number of runs."""

    def __init__(
        self,
        reporter: Reporter | None = None,
        *,
        on_interrupt: str = "ask",
        poll_s: float = 1.0,
        reconnect_s: float = 60.0,
        measure: bool = True,
        scripts_dir: Path | None = None,
    ) -> None:
        if on_interrupt not in INTERRUPT_CHOICES:
            raise BadInput(
                f"--on-interrupt must be one of {', '.join(INTERRUPT_CHOICES)}, "
                f"not {on_interrupt!r}"
            )
        self.reporter: Reporter = reporter or QuietReporter()
        self.on_interrupt = on_interrupt
        self.poll_s = poll_s
        self.reconnect_s = reconnect_s
        self.measure = measure
        self.scripts_dir = scripts_dir if scripts_dir is not None else staging.default_scripts_dir()

    # --- entry points ----------------------------------------------------------------------------

    def run(self, prepared: Prepared, options: Options) -> Outcome:
        """A new run of a prepared Plan: its run dir, its cluster (by the profile's kind), then
        `execute`; the run joins its recipe's history whatever happens. Refused runs (BadInput)
        start nothing and leave no run dir."""
        recipe, profile, plan = prepared.recipe, prepared.profile, prepared.plan
        if profile.kind in clusters.DRY_RUN_ONLY:
            raise BadInput(
                f"--cluster {profile.name}: profiles of kind {profile.kind} are dry-run only in "
                f"this version ({clusters.DRY_RUN_ONLY[profile.kind]}); use --dry-run to see the "
                "jobs it would submit."
            )
        if recipe.nodes > 1:
            # The plan and the AWS request cover several nodes, but starting N paid nodes of which
            # N-1 would idle is worse than refusing before anything is launched.
            raise BadInput(
                f"{recipe.path}: {recipe.nodes} nodes; this version of reproduce runs single-node "
                "recipes only (--dry-run shows the multi-node plan). Nothing was launched."
            )
        budget = None
        if options.max_usd is not None or options.max_hours is not None:
            price = prepared.price.value if prepared.price is not None else None
            budget = Budget.for_recipe(recipe, price, options.max_usd, options.max_hours)
            budget.refuse_if_over(Budget.expected_hours(recipe))  # BadInput: nothing launched
        root = options.runs_dir or default_runs_root()
        run_dir = RunDir.create(root, recipe.slug, plan.run_id)
        run_dir.write_inputs(
            recipe_text=recipe.text,
            profile=profile.path.read_text(encoding="utf-8"),
            plan=plan.to_dict(),
            node_script=plan.node_script,
        )
        cluster = clusters.from_plan(
            plan, LaunchOptions(keep=options.keep, owner=prepared.owner), run_dir.path
        )
        try:
            return self.execute(
                plan, run_dir, cluster, budget=budget, secrets=staging.secrets_for(profile)
            )
        finally:
            record_history(run_dir.path, root, warn=self.reporter.warn)

    def execute(
        self,
        plan: Plan,
        run_dir: RunDir,
        cluster: Cluster,
        *,
        budget: Budget | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> Outcome:
        """Run the Plan's node script on the cluster's nodes and bring everything into `run_dir`.

        `secrets` (e.g. {"HF_TOKEN": ...}) go to the node only, as a 0600 `.secrets.env` that
        node.sh sources once and deletes; they are never written to the run dir or reported.

        Raises InfraError (exit 3) for connection and node failures, CheckFailed (1) when a check
        of the recipe failed, Interrupted (130) on Ctrl-C, SIGTERM or SIGHUP. The cluster is
        released on every path except a deliberate detach or a lost connection (the run then goes
        on, and the error says how to reattach or cancel).
        """
        rd = run_dir
        rd.update_record(
            run_id=plan.run_id,
            cluster=clusters.to_record(cluster),
            node_run_dir=plan.node_run_dir.rstrip("/"),
            container=plan.container,
            offset_source="size of logs/node.log",
            budget=asdict(budget) if budget is not None else None,
        )
        if not (rd.path / "node.sh").exists():
            rd.write_text("node.sh", plan.node_script)
        run = _Run(self, rd, cluster, recipe=plan.recipe, budget=budget)
        try:
            with signals_cancel():
                run.start(plan.node_script, secrets)
                return run.follow()
        except ReproduceError as err:
            if rd.status().get("state") not in (*FINAL_STATES, "detached"):
                rd.set_status("failed", str(err).splitlines()[0])
            raise
        finally:
            run.release_after(sys.exc_info()[1])

    def attach(self, ref: str, runs_root: Path | None = None) -> Outcome:
        """Follow a run in progress again, exactly where collection stopped, to its end."""
        rd = RunDir.find(ref, runs_root)
        try:
            record = rd.record()
            state = rd.status().get("state")
            if state in FINAL_STATES:
                raise BadInput(f"run {rd.path} has already ended ({state}); nothing to attach to.")
            if "node" not in record or "cluster" not in record:
                raise BadInput(
                    f"run {rd.path} never reached a node (state {state}); nothing to attach to."
                )
            cluster = clusters.from_record(record["cluster"])
            budget = None
            if record.get("budget"):  # the limits the run started with still hold after attach
                budget = Budget(**record["budget"])
            run = _Run(self, rd, cluster, recipe=_recorded_recipe(rd), budget=budget)
            run.connect(_recorded_nodes(record))
            node_log = rd.logs / "node.log"
            self.reporter.say(
                f"reattaching to {rd.path} at byte "
                f"{node_log.stat().st_size if node_log.exists() else 0}"
            )
            try:
                return run.follow()
            finally:
                run.release()
        finally:
            record_history(rd.path, warn=self.reporter.warn)

    def cancel(self, ref: str, runs_root: Path | None = None) -> RunDir:
        """Stop a run's processes and container on its nodes, collect what it printed, release."""
        rd = RunDir.find(ref, runs_root)
        record = rd.record()
        if "node" not in record or "cluster" not in record:
            rd.set_status("cancelled", "cancelled before it reached a node")
            return rd
        run = _Run(self, rd, clusters.from_record(record["cluster"]), recipe=None, budget=None)
        run.connect(_recorded_nodes(record))
        try:
            run.cancel_on_nodes()
        except InfraError:
            run.release()  # unreachable or not cleaned: still end what was acquired
            raise
        self.reporter.say(
            f"stopped the run's processes and container {run.container} on "
            f"{', '.join(n.node.name for n in run.nodes)}"
        )
        try:
            with follow_lock(rd):
                try:
                    run.rebuild_logs()
                    run.drain_quietly()
                    run.close_logs("cancelled")
                    rd.set_status("cancelled", "cancelled with `reproduce cancel`")
                finally:
                    run.release()
        except BadInput:
            # A live follower holds the run: it sees the run end, collects and releases itself.
            self.reporter.say(
                "the launcher following this run will collect its logs and release the node"
            )
        return rd


@dataclass
class _NodeRun:
    """One node of a run: how to reach it, and the follower of its log."""

    node: Node
    transport: Transport
    follower: Follower


class _Run:
    """One run's state while the Runner drives it (a new run, an attach or a cancel)."""

    def __init__(
        self,
        runner: Runner,
        rd: RunDir,
        cluster: Cluster,
        *,
        recipe: Recipe | None,
        budget: Budget | None,
    ) -> None:
        self.runner = runner
        self.reporter = runner.reporter
        self.rd = rd
        self.cluster = cluster
        self.recipe = recipe  # judged against when the run ends; None: not judged
        self.budget = budget
        record = rd.record()
        self.node_run_dir: str = record["node_run_dir"]
        self.container: str = record["container"]
        self.timeline = rd.timeline()
        self.keep_cluster = False
        self.nodes: list[_NodeRun] = []

    def connect(self, nodes: list[Node]) -> None:
        """Transports and log followers for the nodes; node 0's log and markers are the run's."""
        steps = self.recipe.steps_per_run if self.recipe is not None else None
        for index, node in enumerate(nodes):
            transport = self.cluster.transport(node)
            follower = Follower(
                transport,
                self.rd.logs if index == 0 else self.rd.logs / f"node-{index}",
                node_run_dir=self.node_run_dir,
                timeline=self.timeline if index == 0 else Timeline(),
                reporter=self.reporter,
                on_marker=self._on_marker if index == 0 else None,
                steps_total=steps if index == 0 else None,
                poll_s=self.runner.poll_s,
                reconnect_s=self.runner.reconnect_s,
            )
            self.nodes.append(_NodeRun(node, transport, follower))

    def _on_marker(self, marker: Mapping[str, str]) -> None:
        self.rd.write_timeline(self.timeline)
        self.reporter.stage(marker["stage"], marker["event"], marker.get("status", "ok"))

    # --- starting -----------------------------------------------------------------------------

    def start(self, node_script: str, secrets: Mapping[str, str] | None) -> None:
        """Acquire, stage and launch; an interrupt before the launch leaves nothing running."""
        launched = False
        try:
            self.rd.set_status("acquiring")
            self.reporter.say(f"acquiring a node ({getattr(self.cluster, 'name', 'cluster')})")
            # The clock starts when acquiring starts: a cloud bills from the launch, not from the
            # moment the node answers SSH, so GPU-hours and the budget count the boot too.
            acquire_started = time.time()
            nodes = self.cluster.acquire()
            self.timeline.acquired_at = acquire_started
            self.rd.write_timeline(self.timeline)
            self.rd.update_record(node=asdict(nodes[0]), nodes=[asdict(n) for n in nodes])
            self.connect(nodes)
            self.rd.set_status("staging")
            for n in self.nodes:
                staging.stage(
                    n.transport, self.node_run_dir, node_script, self.runner.scripts_dir, secrets
                )
            launched = True  # from here an interrupt cancels on the node (harmless if not started)
            pids = [staging.launch(n.transport, self.node_run_dir) for n in self.nodes]
            self.rd.update_record(pid=pids[0], launched_at=time.time())
            self.reporter.say(
                f"node script started on {self.nodes[0].node.name} (pid {pids[0]}); "
                f"run dir {self.rd.path}"
            )
        except KeyboardInterrupt as err:
            if launched:
                self.reporter.say("cancelling the run on the node")
                self.cancel_or_keep_billing()
            self.rd.set_status("cancelled", "interrupted before the run started")
            why = f"stopped by {err.signame}" if isinstance(err, Terminated) else "interrupted"
            raise Interrupted(
                f"{why} before the node script started; nothing was left running."
            ) from None

    # --- following ----------------------------------------------------------------------------

    def follow(self) -> Outcome:
        """Stream to the end, handling Ctrl-C/SIGTERM, the budget and a lost node; then finish."""
        with follow_lock(self.rd), signals_cancel():
            try:
                for n in self.nodes:
                    n.follower.splitter.rebuild()
                self.rd.set_status("running", pid_file=f"{self.node_run_dir}/pid")
                code = self._follow_nodes()
            except KeyboardInterrupt as err:
                self._interrupted(err)
            except BudgetExceeded as err:
                self.reporter.say(f"budget reached: {err}; cancelling the run on the node")
                self.cancel_or_keep_billing(following=True)
                self._stop_following("cancelled", f"budget reached: {err}")
                raise CheckFailed(
                    f"stopped: {err}. The run was cancelled on the node and the node released."
                ) from None
            except InfraError as err:
                raise self.left_running(
                    f"lost the node: {err}",
                    f"{err}. The run may still be going on on the node "
                    "(its GPUs keep costing money).",
                ) from err
            return self.finish(code)

    def _follow_nodes(self) -> int | None:
        """Until a node's script ends: its exit code (None when it vanished without one)."""
        while True:
            for n in self.nodes:
                ended = n.follower.check()
                if ended is not None:
                    return ended.code
            reason = self._over_budget()
            if reason:
                raise BudgetExceeded(reason)
            time.sleep(self.runner.poll_s)

    def _over_budget(self) -> str | None:
        start = self.timeline.acquired_at
        if self.budget is None or start is None:
            return None
        return self.budget.check(time.time() - start)

    def _interrupted(self, err: KeyboardInterrupt) -> NoReturn:
        """Ctrl-C (or SIGTERM/SIGHUP) while following: detach, or cancel on the node."""
        if isinstance(err, Terminated):
            choice = "cancel"
        elif self.runner.on_interrupt != "ask":
            choice = self.runner.on_interrupt
        else:
            choice = self.reporter.choose()
        if choice == "detach":
            self.close_logs("running")
            self.keep_cluster = True
            self.rd.set_status("detached", "detached by the user; the run goes on on the node")
            raise Interrupted(
                "detached: the run goes on on the node and its GPUs keep costing money.",
                hint=reattach_hint(self.rd),
            ) from None
        self.reporter.say("cancelling the run on the node")
        self.cancel_or_keep_billing(following=True)
        self._stop_following("cancelled", "cancelled by the user (Ctrl-C or SIGTERM)")
        raise Interrupted(
            "cancelled: the run's processes and container on the node were stopped."
        ) from None

    def _stop_following(self, state: str, detail: str) -> None:
        self.drain_quietly()
        self.close_logs("cancelled")
        self.rd.set_status(state, detail)

    # --- the node's side -------------------------------------------------------------------------

    def cancel_on_nodes(self) -> None:
        """Stop the run on every node; InfraError naming what could not be stopped."""
        left = []
        for n in self.nodes:
            out = n.transport.run(
                protocol.cancel_command(self.node_run_dir, self.container),
                timeout_s=120,
                check=False,
            ).stdout
            still = protocol.parse_cancel(out)
            if still:
                left.append(still if len(self.nodes) == 1 else f"{n.node.name}: {still}")
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

    def left_running(self, why: str, message: str, *, close_logs: bool = True) -> InfraError:
        """The run may go on without us: keep the nodes, say so, and how to reattach or cancel."""
        if close_logs:
            self.close_logs("running")
        self.keep_cluster = True
        self.rd.set_status("detached", why)
        hint = reattach_hint(self.rd)
        down = getattr(self.cluster, "down_command", None)
        if callable(down):  # a node this run launched is billed until it is ended
            cost = (
                f" (about ${self.budget.usd_per_hour:.2f}/h)"
                if self.budget and self.budget.usd_per_hour
                else ""
            )
            hint += f" The node keeps billing{cost} until you end it: `{down()}`."
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

    def finish(self, code: int | None) -> Outcome:
        """The script ended: collect, release, then judge (the node no longer bills meanwhile)."""
        head = self.nodes[0]
        check = head.transport.run(protocol.cancelled_command(self.node_run_dir), check=False)
        cancelled = check.exit_code == 0
        ok = code == 0 and not cancelled
        self.close_logs("ok" if ok else ("cancelled" if cancelled else "failed"))
        self.rd.set_status("collecting")
        collected: list[str] = []
        for n in self.nodes:
            n.transport.run(protocol.cleanup_command(self.container), timeout_s=120, check=False)
            collected += staging.collect(self.rd, n.transport, self.node_run_dir)
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
            raise Interrupted(f"the run was cancelled on the node (exit code {code}).")
        if not ok:
            stage, error = failure(self.rd, self.timeline, code)
            self.rd.set_status("failed", str(error).splitlines()[0], exit_code=code)
            if stage == TRAIN_STAGE and self.runner.measure:
                self.judge()  # the figures so far and a "failed" verdict, kept in the run dir
            raise error
        self.rd.set_status("done", "the node script finished; logs collected", exit_code=0)
        self.reporter.say(f"node script finished; run dir {self.rd.path}")
        measurement = self.judge() if self.runner.measure else None
        return Outcome("done", 0, self.rd.path, measurement)

    def judge(self) -> Any:
        """Measure the run and judge its claim (writes the verdict and report into the run dir)."""
        if self.recipe is None:
            return None
        from launcher.evaluate import measure_run_dir

        measurement = measure_run_dir(self.rd.path, self.recipe)
        verdict = (
            measurement[1] if isinstance(measurement, tuple) and len(measurement) > 1 else None
        )
        if verdict is not None and hasattr(verdict, "status"):
            diff = getattr(verdict, "difference_percent", None)
            diff_text = f" ({diff:+.2f}% vs the claim)" if isinstance(diff, (int, float)) else ""
            self.reporter.say(f"verdict: {verdict.status}{diff_text}")
            for reason in getattr(verdict, "reasons", []) or []:
                self.reporter.say(f"  {reason}")
        return measurement

    def release(self) -> None:
        """End what the cluster acquired, to the end even through Ctrl-C (unless kept)."""
        if self.keep_cluster:
            return
        try:
            error = release_hard(self.cluster, self.reporter.warn)
            if error is not None:
                raise error
        finally:
            if self.timeline.acquired_at is not None and self.timeline.released_at is None:
                self.timeline.released_at = time.time()
            self.rd.write_timeline(self.timeline)

    def release_after(self, original: BaseException | None) -> None:
        """The release on the way out of a run; a teardown failure keeps why the run failed."""
        try:
            self.release()
        except ReproduceError as failed:
            if original is None or str(original) == str(failed):
                raise
            # What is left (and how to end it) decides the exit code; why the run failed stays.
            raise type(failed)(f"{original}\n{failed.message}", hint=failed.hint) from original


def _recorded_nodes(record: Mapping[str, Any]) -> list[Node]:
    return [Node(**n) for n in (record.get("nodes") or [record["node"]])]


def _recorded_recipe(rd: RunDir) -> Recipe | None:
    """The recipe the run was started with (its recipe.yaml), to judge it by; None without one."""
    path = rd.path / "recipe.yaml"
    return load_recipe(path) if path.exists() else None


def record_history(run_dir: Path, runs_root: Path | None = None, *, warn: Any = None) -> None:
    """Every finished run joins its recipe's history; a detached one later, when attach ends it.

    The history lives in the runs root the run directory belongs to (<root>/<slug>/<run id>).
    """
    from launcher.history import default_history_path, record

    try:
        rd = RunDir(run_dir)
        if runs_root is None:
            runs_root = run_dir.parents[len(rd.record()["slug"].split("/"))]
        if rd.status().get("state") in FINAL_STATES:
            record(run_dir, default_history_path(runs_root))
    except Exception as err:  # noqa: BLE001 - the run's own outcome matters more than its history
        if warn is not None:
            warn(f"warning: the run was not added to the history: {err}")
