"""The runner: every backend (local, SSH, AWS) executes a Plan's node script through here.

    acquire -> stage node.sh + scripts/ into the node run dir -> launch detached -> stream node.log
    by byte offset into the run dir -> fetch the exit code, collect *.json -> release -> judge

`Runner` holds how runs are followed (reporter, interrupt policy, poll and reconnect intervals);
`execute`, `attach` and `cancel` each drive one RunSession (launcher/runner/session.py), the state
of one run, whose nodes are a list: following N nodes is a loop over it.
See docs/architecture.md ("Data flow", "Run directory", "Exit codes").
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher import clusters
from launcher.clusters import staging, trust
from launcher.clusters.base import Cluster, LaunchOptions, Node
from launcher.cost.budget import Budget
from launcher.cost.costgate import pass_gate, refused_unattended
from launcher.errors import BadInput, InfraError, ReproduceError
from launcher.inputs.recipe import Recipe
from launcher.pages import write_run_page_safely
from launcher.records.identity import launcher_identity
from launcher.records.rundir import FINAL_STATES, Files, RunDir, RunRecord, default_runs_root
from launcher.records.runs import ended_message
from launcher.runner.outcome import Outcome
from launcher.runner.reporter import INTERRUPT_CHOICES, FailSafeReporter, QuietReporter, Reporter
from launcher.runner.session import RunSession, Settings
from launcher.runner.signals import signals_cancel
from launcher.runner.stream import follow_lock

if TYPE_CHECKING:
    from launcher.plan.plan import Plan
    from launcher.runner.held import HeldNode
    from launcher.runner.prelaunch import Prepared, RunOptions, StartCheck


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
        unattended: bool = False,
    ) -> None:
        """`unattended`: nobody is there to reattach (nightly, no terminal), so a node lost for
        longer than `reconnect_s` is cancelled and released rather than left running."""
        if on_interrupt not in INTERRUPT_CHOICES:
            raise BadInput(
                f"--on-interrupt must be one of {', '.join(INTERRUPT_CHOICES)}, "
                f"not {on_interrupt!r}"
            )
        # The console may be gone (a closed terminal raises EIO on every print): no report may stop
        # a cancel or a release.
        self.reporter: Reporter = FailSafeReporter(reporter or QuietReporter())
        self.settings = Settings(
            reporter=self.reporter,
            on_interrupt=on_interrupt,
            poll_s=poll_s,
            reconnect_s=reconnect_s,
            measure=measure,
            scripts_dir=scripts_dir if scripts_dir is not None else staging.default_scripts_dir(),
            unattended=unattended,
        )

    # --- entry points ----------------------------------------------------------------------------

    def run(
        self,
        prepared: Prepared,
        options: RunOptions,
        start: StartCheck | None = None,
        *,
        held: HeldNode | None = None,
    ) -> Outcome:
        """A new run of a prepared Plan: its run dir, its cluster (by the profile's kind), then
        `execute`; the run joins its recipe's history whatever happens. Refused runs (BadInput)
        start nothing and leave no run dir. `start`: the checks before a start, when the caller
        made them already (the command layer does, for the dry run's sake): made once a run.
        `held`: a nightly group's node (launcher/runner/held.py): the run acquires and releases
        it as its own, and the group releases it once, after its last run."""
        from launcher.runner.prelaunch import check_before_start, decide_price

        recipe, profile, plan = prepared.recipe, prepared.profile, prepared.plan
        if start is None:
            start = check_before_start(prepared, options)  # the same checks the dry run applies
        if start.refusals:
            raise BadInput(start.refusals[0])
        budget = start.budget
        # Before the run directory and any cloud call: what this machine can check (credentials),
        # the run's price (decided once: looked up live where the backend can, else the
        # catalog's) and the cost gate (shown, then confirmed, --yes, or a budget); a refusal
        # leaves nothing.
        clusters.check_ready(profile)
        clusters.check_fits(recipe, profile)
        if not refused_unattended(profile, options, unattended=self.settings.unattended):
            # The one cloud call before the gate: a read (the price), never a launch; a run the
            # gate refuses anyway sends nothing at all.
            decided = decide_price(prepared, self.reporter.warn)
            if decided.price is not prepared.price:
                prepared = decided
                budget = check_before_start(prepared, options).budget  # at the price decided
        gate = pass_gate(prepared, options, self.reporter, attended=not self.settings.unattended)
        root = options.runs_dir or default_runs_root()
        run_dir = RunDir.create(root, recipe.slug, plan.run_id)  # BadInput for a used --run-id
        price = prepared.price.to_dict() if prepared.price is not None else None
        run_dir.update_record(cost=gate.to_record(), price=price)
        run_dir.write_inputs(
            recipe_text=recipe.text,
            profile=profile.path.read_text(encoding="utf-8"),
            plan=plan.to_dict(),
            node_script=plan.node_script,
        )
        launch = LaunchOptions(
            keep=options.keep,
            owner=prepared.owner,
            price_per_hour=gate.price_per_hour,
            shared=held is not None,
            max_hours=options.max_hours,
            max_usd=options.max_usd,
        )
        cluster = (
            clusters.from_plan(plan, launch, run_dir.path)
            if held is None
            else held.lend(lambda: clusters.from_plan(plan, launch, run_dir.path), run_dir.path)
        )
        if held is not None:  # the nightly's node: acquired by the group's first run only
            run_dir.update_record(shared_node=held.to_record())
        try:
            return self.execute(
                plan, run_dir, cluster, budget=budget, secrets=staging.secrets_for(profile)
            )
        finally:
            record_history(run_dir.path, warn=self.reporter.warn)
            write_run_page_safely(run_dir.path, warn=self.reporter.warn)
            say_trust(run_dir.path, self.reporter)

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
            launcher=launcher_identity(),  # which code ran it (an attestation names it)
        )
        if not (rd.path / Files.NODE_SCRIPT).exists():
            rd.write_text(Files.NODE_SCRIPT, plan.node_script)
        run = self._session(rd, cluster, plan.recipe, budget)
        with follow_lock(rd):
            try:
                with signals_cancel():
                    run.start(plan.node_script, secrets)
                    return run.follow()
            except ReproduceError as err:
                if rd.status().get("state") not in (*FINAL_STATES, "detached"):
                    detail = str(err).splitlines()[0]
                    run.write_quietly(lambda: rd.set_status("failed", detail))
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
                    f"run {rd.path} never reached a node (state {state}); nothing to attach to. "
                    "What it acquired before it was stopped (if anything) is ended by "
                    f"`reproduce cancel {rd.path}`."
                )
            cluster = clusters.from_record(record["cluster"], rd.path)
            budget = None
            if record.get("budget"):  # the limits the run started with still hold after attach
                budget = Budget(**record["budget"])
            # Another process following the run owns it, its release included: a refused attach
            # (BadInput from the lock) must end nothing.
            with follow_lock(rd):
                run = self._session(rd, cluster, _recorded_recipe(rd), budget)
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
            write_run_page_safely(rd.path, warn=self.reporter.warn)
            say_trust(rd.path, self.reporter)

    def cancel(self, ref: str, runs_root: Path | None = None) -> RunDir:
        """Stop a run's processes and container on its nodes, collect what it printed, release."""
        rd = RunDir.find(ref, runs_root)
        record = rd.record()
        status = rd.status()
        if status.get("state") in FINAL_STATES:
            # Nothing of it runs any more; cancelling would rewrite its record (and release a
            # node kept with --keep). Say so instead.
            self.reporter.say(ended_message(rd, record, status))
            say_trust(rd.path, self.reporter)
            return rd
        if "cluster" not in record and status.get("state") in (None, "created"):
            rd.set_status("cancelled", "cancelled before it acquired anything")
            say_trust(rd.path, self.reporter)
            return rd
        if "cluster" not in record:
            raise BadInput(
                f"{rd.path / 'run.json'}: the run reached {status.get('state')!r} but its record "
                "names no cluster, so what it acquired cannot be found from it and nothing was "
                "ended. Look for it where it ran (aws: `reproduce down "
                f"{rd.path} --region REGION` finds a run's resources by their tags; slurm: "
                f"`squeue -u $USER`).",
                hint="The record is damaged or was written by an older reproduce.",
            )
        cluster = clusters.from_record(record["cluster"], rd.path)
        if "node" not in record:
            # Stopped while acquiring: its nodes were never recorded, but the acquire may have
            # made them (an instance, a job). The backend ends them by its own record.
            cluster.release()
            rd.set_status("cancelled", "cancelled before it reached a node; released what it had")
            self.reporter.say(f"released what run {rd.run_id} acquired before it reached a node")
            say_trust(rd.path, self.reporter)
            return rd
        run = self._session(rd, cluster, None, None)
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
                    write_run_page_safely(rd.path, warn=self.reporter.warn)
        except BadInput:
            # A live follower holds the run: it sees the run end, collects and releases itself.
            self.reporter.say(
                "the launcher following this run will collect its logs and release the node"
            )
        say_trust(rd.path, self.reporter)
        return rd

    def _session(
        self, rd: RunDir, cluster: Cluster, recipe: Recipe | None, budget: Budget | None
    ) -> RunSession:
        return RunSession(rd, cluster, recipe=recipe, budget=budget, settings=self.settings)


def _recorded_nodes(record: RunRecord) -> list[Node]:
    """The run's nodes as run.json keeps them; one that is not a node's record is BadInput
    naming it, never a TypeError's traceback half-way through a cancel."""
    nodes = record.get("nodes") or [record["node"]]
    found: list[Node] = []
    for index, fields in enumerate(nodes if isinstance(nodes, list) else [nodes]):
        try:
            found.append(Node(**fields))
        except TypeError as err:
            raise BadInput(
                f"{record.where}: the run record's node {index} is not a node's record ({err}); "
                "the record is damaged or was written by an older reproduce."
            ) from None
    return found


def _recorded_recipe(rd: RunDir) -> Recipe | None:
    """The recipe the run was started with (kept in its run dir), to judge it by; or None."""
    from launcher.results.evaluate import RECIPE_FILE, recipe_of

    return recipe_of(rd.path) if (rd.path / RECIPE_FILE).is_file() else None


def say_trust(run_dir: Path, reporter: Reporter) -> None:
    """The last words of every way a run is left (run, attach, cancel; done, failed, cancelled,
    lost, stopped by its budget, judged or not): what its cluster vouched for itself, when it
    did (launcher/clusters/trust.py). Said after the verdict's reasons, which leave the note out
    (RunSession.judge), and before the error paragraph a failed run ends with."""
    shown = trust.run_line(run_dir)
    if shown is not None:
        reporter.say(shown)


def record_history(
    run_dir: Path,
    *,
    warn: Callable[[str], Any] | None = None,
) -> None:
    """Every finished run joins its recipe's history; a detached one later, when attach ends it.

    The history is the user's one database (launcher/records/history.py,
    `default_history_path`), whatever runs root or directory the run was made from.
    """
    from launcher.records.history import default_history_path, index_run

    try:
        rd = RunDir(run_dir)
        if rd.status().get("state") in FINAL_STATES:
            index_run(rd.path, default_history_path())
    except Exception as err:  # noqa: BLE001 - the run's own outcome matters more than its history
        if warn is not None:
            warn(f"warning: the run was not added to the history: {err}")
