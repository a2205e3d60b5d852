"""A nightly group on Slurm: one allocation holds the nodes, each recipe is one job step of it.

`reproduce nightly` lends one held node to every recipe of a shape (launcher/runner/held.py). On
Slurm the held thing is an **allocation**: one `sbatch` job with the group's `#SBATCH` header (the
same nodes, GPUs and settings as a run's own job; `--time` the sum of its recipes' own limits)
whose body only waits. Each recipe keeps a cluster of its own, `SlurmStep`, made from its own
plan: its body (the run's batch script without its `#SBATCH` header) runs on the login node with
the allocation's `SLURM_JOB_ID`, so its `srun` is a job step of the allocation, named after the
run. The step has its own run directory, state (`squeue -s`, `scontrol show step`, `sacct` only
where accounting exists), cancel (`scancel JOB.STEP`, TERM first, leaving the allocation to the
next recipe) and clock (GPU-hours from the step's own start to its own end). What Slurm does to
the allocation (NODE_FAIL, TIMEOUT, a requeue) is the step's infrastructure failure, naming the
node. The allocation is ended once, by the group (its release: `scancel`, only of its own job).
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.clusters.base import Cluster, LaunchOptions, Node
from launcher.clusters.contract import WithAllocation, WithNodeHealth
from launcher.clusters.slurm import script
from launcher.clusters.slurm.cluster import (
    ALIVE,
    SETTLE_S,
    STATE_CACHE_S,
    SlurmCluster,
    _word,
    parse_scontrol,
    recorded_job,
    run_seconds,
)
from launcher.errors import InfraError
from launcher.excerpt import excerpt
from launcher.inputs.profile import SlurmProfile
from launcher.plan.protocol import CANCEL_GRACE_TENTHS

if TYPE_CHECKING:
    from launcher.clusters.ssh import SSHSettings
    from launcher.plan.plan import Plan

NO_ANSWER_S = 120.0  # a controller silent this long while the allocation waits: the group fails


class Allocation(SlurmCluster, WithNodeHealth):
    """The nodes of a nightly group: one job that holds them, and only waits, until released."""

    name = "slurm allocation"

    def __init__(
        self, login: SSHSettings | None, *, plan: Plan, hours: float, holder: Path | None
    ) -> None:
        super().__init__(login, plan=plan, run_dir=holder)
        self.hours = hours
        self.job_name = script.allocation_name(plan.run_id)
        self._beat_stop = threading.Event()
        self._beat_thread: threading.Thread | None = None

    def batch_script(self) -> str:
        assert self.plan is not None
        b = script.allocation_of(self.plan, self.gpu_option or "auto", self.hours)
        return script.render_allocation(b)

    def _record(self, **fields: Any) -> None:
        """The holder run's run.json keeps the allocation as `allocation`, beside its own step's
        `cluster`."""
        if "cluster" in fields:
            fields["allocation"] = fields.pop("cluster")
        super()._record(**fields)

    def acquire(self) -> list[Node]:
        """The partition checked (as a run's), the allocation submitted, and waited for until it
        holds its nodes: a run's step can only start in a job that runs."""
        nodes = super().acquire()
        self.submit_once()
        self._wait_running()
        return nodes

    def submit_once(self) -> str:
        with self._lock:
            if self.job_id is not None:
                return self.job_id
            assert self.plan is not None and isinstance(self.plan.profile, SlurmProfile)
            where = script.allocation_dir(self.plan.profile.work_dir, str(self.job_name))
            text = self.batch_script()
            parent = shlex.quote(str(Path(where).parent))
            made = self._run(f"mkdir -p -m 0700 {parent} && mkdir -m 0700 {shlex.quote(where)}")
            if made.exit_code != 0:
                raise InfraError(
                    f"could not make the allocation's directory {where} on the login node: "
                    f"{excerpt(made.stderr or made.stdout, 2, 300)}"
                )
            path = f"{where}/{script.ALLOCATION_NAME}"
            self.login_transport().put_text(text, path, mode=0o700)
            self._keep(script.ALLOCATION_NAME, text)
            beat = f"{where}/{script.HOLDER_MARK}"
            self.login_transport().put_text("", beat, mode=0o600)  # held from before it starts
            job = self._sbatch(where, path)
            self._beat_thread = threading.Thread(
                target=self._beat, args=(beat,), name=f"{self.job_name} heartbeat", daemon=True
            )
            self._beat_thread.start()
            return job

    def _beat(self, path: str) -> None:
        """Touch the heartbeat every HOLDER_BEAT_S until released, over a connection of its own
        (the main thread's stays free for the group's runs); a missed touch is retried next
        time, and HOLDER_GRACE_S is ten of them."""
        transport = self._new_login_transport()
        try:
            while not self._beat_stop.wait(script.HOLDER_BEAT_S):
                try:
                    transport.run(f"touch {shlex.quote(path)}", timeout_s=30, check=False)
                except (InfraError, OSError, EOFError):
                    pass
        finally:
            transport.close()

    def release(self) -> None:
        """The heartbeat stops, then the allocation is ended (scancel, only of its own job)."""
        self._beat_stop.set()
        if self._beat_thread is not None:
            self._beat_thread.join(timeout=40)
        super().release()

    def _wait_running(self) -> None:
        silent_since: float | None = None
        while True:
            try:
                state = self.job_state(fresh=True)
                silent_since = None
            except InfraError:
                silent_since = silent_since or time.monotonic()
                if time.monotonic() - silent_since > NO_ANSWER_S:
                    raise
                time.sleep(1.0)
                continue
            word = _word(state) if state else ""
            if word == "RUNNING" and len(self.job_nodes) == self.node_count:
                return
            if state is None or (word and word not in ALIVE):
                why = (state or {}).get("Reason") or "no reason given"
                raise InfraError(
                    f"slurm allocation {self.job_id} ended {word or '(unknown to the scheduler)'}"
                    f" before it held its nodes ({why})"
                )
            time.sleep(1.0)

    def lost_nodes(self, *, now: bool = False) -> list[str]:
        """Why the allocation cannot be lent again: Slurm ended it (NODE_FAIL, TIMEOUT, a
        requeue: naming the node), or it holds its nodes no more."""
        failure = self.job_failure(now=now)
        if failure:
            return [failure]
        if self.job_id is not None and not self.alive():
            state = self.job_state() or {}
            return [
                f"slurm allocation {self.job_id} holds no nodes any more "
                f"({state.get('JobState') or 'unknown to the scheduler'})"
            ]
        return []


class SlurmStep(SlurmCluster, WithAllocation):
    """One run of a nightly group on Slurm: a job step of the group's allocation.

    `job_id` is the allocation's (what `reproduce ssh` opens a step in, and whose failure is the
    run's); `job_name` is the step's (the run's `reproduce-<run id>`); `allocation_name` the
    allocation's, which must hold the nodes for a shell to open there."""

    def __init__(
        self,
        login: SSHSettings | None,
        *,
        plan: Plan | None = None,
        run_dir: Path | None = None,
        options: LaunchOptions | None = None,
        job_id: str | None = None,
        user: str | None = None,
        nodes: int = 1,
        job_nodes: list[str] | None = None,
        started_at: float | None = None,
        job_name: str | None = None,
        allocation_name: str | None = None,
        step_id: str | None = None,
        body_pid: int | None = None,
    ) -> None:
        super().__init__(
            login, plan=plan, run_dir=run_dir, job_id=job_id, user=user, nodes=nodes,
            job_nodes=job_nodes, started_at=started_at, job_name=job_name,
        )  # fmt: skip
        self.options = options or LaunchOptions()
        self.allocation_name = allocation_name
        self.step_id = step_id
        self.body_pid = body_pid
        self._step: dict[str, str] | None = None
        self._step_at = float("-inf")
        self._used: float | None = None  # the step's TimeUsed, as last seen
        self._ended_by_us = False  # this cluster's cancel ended the step (the other nodes' ask)

    # --- the group's side ---------------------------------------------------------------------

    def allocation(self, recipes: Sequence[Path]) -> Allocation:
        """The group's allocation, sized for all its recipes (each one's own time limit, as its
        own job would have had, added up) from the profile as written."""
        from launcher.inputs.profile import load_profile
        from launcher.inputs.recipe import load_recipe

        plan = self.plan
        assert plan is not None
        profile = load_profile(str(plan.profile.path))
        loaded = [load_recipe(p) for p in recipes] or [plan.recipe]
        o = self.options
        price = o.price_per_hour if o.price_per_hour is not None else profile.price_per_hour
        hours = script.group_hours(loaded, profile, o.max_hours, o.max_usd, price)
        return Allocation(self.login, plan=plan, hours=hours, holder=self.run_dir)

    def join(self, allocation: Cluster, nodes: list[Node]) -> list[Node]:
        """This run inside the group's running allocation: its job id, nodes and Slurm version."""
        if not isinstance(allocation, Allocation) or allocation.job_id is None:
            raise InfraError("the nightly group's Slurm allocation was not acquired")
        self.job_id = allocation.job_id
        self.job_nodes = list(allocation.job_nodes)
        self.allocation_name = allocation.job_name
        self.version, self.gpu_option = allocation.version, allocation.gpu_option
        self._record(
            slurm={"version": self.version, "gpu_option": self.gpu_option},
            cluster=self.to_record(),
        )
        return nodes

    @property
    def holding_name(self) -> str | None:
        return self.allocation_name

    def acquire(self) -> list[Node]:
        raise InfraError("a run inside a nightly group's allocation is given its nodes by it")

    # --- the step -----------------------------------------------------------------------------

    def batch_script(self) -> str:
        if self.plan is None:
            raise InfraError("a recorded slurm run cannot be submitted again")
        return script.render(script.batch_of(self.plan, self.gpu_option or "auto"), step=True)

    def submit_once(self) -> str:
        """Start the run's body on the login node, detached (its own session: no Ctrl-C of the
        launcher reaches it), with the allocation's SLURM_JOB_ID: its srun is the run's step."""
        with self._lock:
            if self.body_pid is not None:
                return str(self.job_id)
            if self.job_id is None:
                raise InfraError("the nightly group's Slurm allocation was not acquired")
            text = self.batch_script()
            run_dir = self.head_dir()
            path = f"{run_dir}/{script.STEP_NAME}"
            self.login_transport().put_text(text, path, mode=0o700)
            self._keep(script.STEP_NAME, text)
            q = shlex.quote
            self.submitting = True
            answer = self._run(
                f"cd {q(run_dir)} || exit 3\n"
                f"SLURM_JOB_ID={q(self.job_id)} SLURM_JOB_NODELIST={q(','.join(self.job_nodes))} "
                f"setsid nohup bash {q(path)} </dev/null >{q(script.STEP_OUTPUT)} 2>&1 &\n"
                "echo $!"
            )
            pid = (answer.stdout.strip().splitlines() or [""])[-1].strip()
            if answer.exit_code != 0 or not pid.isdigit():
                raise InfraError(
                    f"the run's step could not be started on the login node (exit "
                    f"{answer.exit_code}): {excerpt(answer.stderr or answer.stdout, 3, 400)}"
                )
            self.body_pid = int(pid)
            self._record(cluster=self.to_record())
            return self.job_id

    def step_state(self, *, fresh: bool = False) -> dict[str, str] | None:
        """The run's step as the scheduler lists it now (`squeue -s`, then `scontrol show
        step`), only this user's and only of this run's name; None when no source lists it.
        InfraError when the controller does not answer (no news)."""
        if self.job_id is None:
            return None
        if not fresh and time.monotonic() - self._step_at < STATE_CACHE_S:
            return self._step
        q = shlex.quote
        listed = self._run(f"squeue -h -s -u {q(self.user)} -j {q(self.job_id)} -o '%i|%j|%M'")
        if listed.exit_code != 0 and "invalid job id" not in listed.stderr.lower():
            raise InfraError(
                f"the Slurm controller did not answer squeue: {excerpt(listed.stderr, 2, 300)}"
            )
        found: dict[str, str] | None = None
        for line in listed.stdout.splitlines() if listed.exit_code == 0 else []:
            parts = [p.strip() for p in line.split("|")]
            if len(parts) >= 3 and parts[1] == self.job_name and self._is_ours(parts[0]):
                found = {"StepId": parts[0], "Name": parts[1], "TimeUsed": parts[2]}
                break
        if found is None and self.step_id is not None:
            shown = self._run(f"scontrol show step -o {q(self.step_id)}")
            fields = parse_scontrol(shown.stdout) if shown.exit_code == 0 else {}
            if fields.get("Name") == self.job_name and fields.get("State", "") in ALIVE:
                found = {"StepId": self.step_id, "Name": fields["Name"], "TimeUsed": ""}
        self._step, self._step_at = found, time.monotonic()
        if found is not None:
            self._learn_step(found)
        return found

    def _is_ours(self, step_id: str) -> bool:
        prefix = f"{self.job_id}."
        if not step_id.startswith(prefix) or not step_id[len(prefix) :].isdigit():
            return False  # the allocation's batch step, or another job's
        return self.step_id is None or step_id == self.step_id

    def _learn_step(self, found: Mapping[str, str]) -> None:
        used = run_seconds(found.get("TimeUsed", ""))
        if used is not None:
            self._used = used
        changed = self.step_id != found["StepId"]
        self.step_id = found["StepId"]
        if self.started_at is None and used is not None:
            self.started_at = time.time() - used  # the step's own start, on the launcher's clock
            changed = True
        if changed:
            self._record(cluster=self.to_record())

    def job_started_at(self) -> float | None:
        """When the run's step started (asked while it is not known: the runner asks every turn
        of its follow loop)."""
        if self.started_at is None and self.job_id is not None:
            try:
                self.step_state()
            except InfraError:
                pass  # no answer is no news
        return self.started_at

    def job_failure(self, *, now: bool = False) -> str | None:
        """The allocation's failure is the step's (a node lost, a time limit, a requeue); the
        step is looked at on the way (its time used, for its end)."""
        try:
            self.step_state(fresh=now)
        except InfraError:
            pass  # no answer is no news
        return super().job_failure(now=now)

    def _learn_start(self, state: Mapping[str, str] | None) -> None:
        """The run's clock is its step's, never the allocation's (job_state is the allocation)."""

    def _body_alive(self) -> bool:
        """The run's body still runs on the login node (its srun waiting for the step, or the
        step's client): the pid recorded, running the run's step script."""
        if self.body_pid is None:
            return False
        answer = self._run(f"ps -o args= -p {int(self.body_pid)} 2>/dev/null; true")
        return script.STEP_NAME in answer.stdout

    def alive(self) -> bool | None:
        """The step is listed, or its body still runs (starting it, or its srun ending)."""
        return self.step_state() is not None or self._body_alive()

    def _exit_code_there(self) -> bool:
        head = self.run_dirs[0] if self.run_dirs else None
        if head is None:
            return False
        return self._run(f"test -f {shlex.quote(head + '/exit_code')}").exit_code == 0

    def cancel_job(self, timeout_s: float) -> str:
        """End this run's step, and only it: the cancel mark first, then TERM to the step's
        processes (`scancel --signal=TERM JOB.STEP`: node.sh's EXIT trap ends its stage and
        removes its container), then Slurm's own end of a step (KILL) past the grace; the
        allocation is left to the next recipe. A step that cannot be found while the run has
        no exit code is said so (InfraError): nothing is claimed cancelled that was not seen."""
        with self._lock:
            self._mark_cancelled()
            user = shlex.quote(self.user)
            step = self.step_state(fresh=True)
            body = self._body_alive()
            if step is None and not body:
                if self._ended_by_us or self._exit_code_there():
                    return ""  # it ended by itself: nothing of it runs
                raise InfraError(
                    f"slurm step {self.job_name} of allocation {self.job_id} cannot be found: "
                    f"squeue -s lists no such step of {self.user} (recorded id "
                    f"{self.step_id or 'none'}), its body runs no more on the login node, and "
                    "the run has no exit code; nothing was cancelled"
                )
            if step is not None:
                sid = shlex.quote(step["StepId"])
                self._run(f"scancel --signal=TERM --user={user} {sid}")
                self._wait_step(max(CANCEL_GRACE_TENTHS / 10, timeout_s - 10))
                if self.step_state(fresh=True) is not None:
                    self._run(f"scancel --user={user} {sid}")
                    self._wait_step(10)
            for signal in ("TERM", "KILL"):  # no step yet (or its srun ending): its session
                if not self._body_alive():
                    break
                self._run(f"kill -{signal} -- -{int(self.body_pid or 0)} 2>/dev/null; true")
                deadline = time.monotonic() + 10
                while self._body_alive() and time.monotonic() < deadline:
                    time.sleep(0.3)
            if self.step_state(fresh=True) is not None:
                return f"slurm step {self.step_id} of job {self.job_id}"
            if self._body_alive():
                return f"the step's body (pid {self.body_pid}) on the login node"
            self._ended_by_us = True
            return ""

    def _wait_step(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.step_state(fresh=True) is not None:
            time.sleep(0.3)

    def release(self) -> None:
        """The step ends by itself once node 0's wrapper has (its task removes the container):
        given SETTLE_S, then ended; the allocation is the group's, never ended here."""
        try:
            if self.job_id is not None and (self.body_pid is not None or self.submitting):
                deadline = time.monotonic() + SETTLE_S
                while self.alive() and time.monotonic() < deadline:
                    time.sleep(0.3)
                if self.alive():
                    left = self.cancel_job(120)
                    if left:
                        raise InfraError(
                            f"could not end {left}; end it with `scancel {self.step_id}`"
                        )
            try:
                self._learn_end()
            except (InfraError, OSError):
                pass  # no answer: the run's release is its end, as on a host
        finally:
            if self._transport is not None:
                self._transport.close()

    def _learn_end(self) -> None:
        """The step's own end: its start plus its elapsed time (sacct's, where accounting keeps
        steps; else its TimeUsed as last seen while it ran, to the second)."""
        if self.started_at is None or self.step_state(fresh=True) is not None:
            return
        elapsed = self._sacct_elapsed()
        if elapsed is None:
            elapsed = self._used
        if elapsed is not None:
            self._job_ended_at = self.started_at + elapsed

    def _sacct_elapsed(self) -> float | None:
        if self.step_id is None:
            return None
        answer = self._run(f"sacct -n -P -j {shlex.quote(self.step_id)} -o JobID,Elapsed 2>&1")
        if answer.exit_code != 0:
            return None  # no accounting: not an error
        for line in answer.stdout.splitlines():
            parts = line.split("|")
            if len(parts) >= 2 and parts[0].strip() == self.step_id:
                return run_seconds(parts[1].strip())
        return None

    def to_record(self) -> dict[str, Any]:
        """The allocation (job id, name) and the run's step in it (name, id, the body's pid)."""
        return {
            **super().to_record(),
            "job_name": self.allocation_name or "",  # "": no allocation joined yet
            "step_name": self.job_name,
            "step_id": self.step_id,
            "body_pid": self.body_pid,
        }


def step_from_record(login: SSHSettings | None, record: Mapping[str, Any]) -> SlurmStep:
    """The step cluster of a recorded run inside a group's allocation."""
    step = SlurmStep(
        login,
        **recorded_job(record),
        job_name=record["step_name"],
        allocation_name=record["job_name"] or None,
        step_id=record.get("step_id"),
        body_pid=record.get("body_pid"),
    )
    # Stopped between starting the body and recording its pid: the step is still looked for
    # by its name, never taken for none.
    step.submitting = True
    return step
