"""A Slurm cluster (`kind: slurm`): one batch job per run, submitted on the login node.

The launcher reaches the login node only: this host (sbatch on the PATH) or `login_host` over SSH,
its key checked as an ssh profile's. Everything else goes through the cluster's shared work dir,
which the login node and every compute node see alike: node.sh, the wrapper and the node programs
are staged into each node's run directory there, each node's wrapper writes its pid, node.log and
exit_code there, and the launcher reads them back by byte offset, as over SSH (launcher/clusters/
slurm/execution.py). The job's own state comes from the scheduler: `squeue`, then `scontrol show
job`, then `sacct` where accounting exists (its absence is not an error).

A job that Slurm ends for reasons of its own (NODE_FAIL, BOOT_FAIL, PREEMPTED, TIMEOUT, a
deadline, out of memory), or starts a second time (a requeue), is an infrastructure failure: the
run gets no verdict, and the error names the job's nodes that failed (`job_failure`).

Release and cancel end only the job this run submitted: by its id (or, when sbatch's answer was
lost, by the run's own job name), and only as its user (`scancel --user`): Slurm sends TERM to
every process of the job, gives them the cluster's KillWait, then KILLs the rest; past the
cancel's time, KILL from us.
"""

from __future__ import annotations

import getpass
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.clusters.base import CommandResult, Node, Transport
from launcher.clusters.contract import (
    WithOwnExecution,
    WithSchedulerJob,
    WithStepShell,
)
from launcher.clusters.slurm import script
from launcher.errors import BadInput, InfraError
from launcher.excerpt import excerpt
from launcher.inputs.profile import SlurmProfile
from launcher.plan.protocol import CANCEL_GRACE_TENTHS, CANCEL_MARK

if TYPE_CHECKING:
    from launcher.clusters.execution import Place
    from launcher.clusters.slurm.execution import SlurmExecution
    from launcher.clusters.ssh import SSHSettings
    from launcher.inputs.recipe import Recipe
    from launcher.plan.plan import Plan

# Job states (squeue %T, scontrol JobState, sacct State) in which the job still holds its nodes.
ALIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "RESIZING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESV_DEL_HOLD",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
    }
)
# States in which Slurm, not the run, ended the job: no verdict is given for such a run.
INFRA = frozenset(
    {"NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "TIMEOUT", "DEADLINE", "OUT_OF_MEMORY", "REVOKED"}
)
# What scontrol's Reason says while a job that Slurm ends is still COMPLETING -> its end state.
INFRA_REASONS = {"NodeDown": "NODE_FAIL", "BootFail": "BOOT_FAIL", "TimeLimit": "TIMEOUT"}
STATE_CACHE_S = 1.0
SETTLE_S = 20.0
ENDED_GRACE_S = 10.0  # a shared file system may show exit_code a little after the job ended
NODE_PREFIX = "job-node-"


class SlurmCluster(WithOwnExecution, WithSchedulerJob, WithStepShell):
    """The login node, and the one job of a run: submitted once, asked about, ended."""

    name = "slurm"

    def __init__(
        self,
        login: SSHSettings | None,
        *,
        plan: Plan | None = None,
        run_dir: Path | None = None,
        job_id: str | None = None,
        user: str | None = None,
        nodes: int = 1,
        job_nodes: list[str] | None = None,
        started_at: float | None = None,
        job_name: str | None = None,
    ) -> None:
        self.login = login
        self.plan = plan
        self.run_dir = run_dir
        self.job_id = job_id
        self.user = user or getpass.getuser()
        self.node_count = plan.recipe.nodes if plan is not None else nodes
        self.job_nodes: list[str] = list(job_nodes or [])
        self.run_dirs: list[str] = []
        self.job_name = script.job_name(plan.run_id) if plan is not None else job_name
        self.settle_s = SETTLE_S
        self.submitting = False  # sbatch was called: a job may exist even without its id
        self.started_at: float | None = started_at
        self.version: str | None = None
        self.gpu_option: str | None = None
        self._transport: Transport | None = None
        self._lock = threading.Lock()
        self._state: dict[str, str] | None = None
        self._state_at = float("-inf")
        self._ended_at: float | None = None
        self._job_ended_at: float | None = None

    # --- the login node -------------------------------------------------------------------------

    def login_transport(self) -> Transport:
        if self._transport is None:
            self._transport = self._new_login_transport()
        return self._transport

    def _new_login_transport(self) -> Transport:
        """A connection to the login node: this host's shell, or SSH with its key pinned."""
        if self.login is None:
            from launcher.clusters.local import LocalTransport

            return LocalTransport("the login node (this host)")
        from launcher.clusters.ssh import SSHTransport

        return SSHTransport(self.login.node(), self.login)

    def _run(self, command: str, timeout_s: float = 60) -> CommandResult:
        return self.login_transport().run(command, timeout_s=timeout_s, check=False)

    def transport(self, node: Node) -> Transport:
        """Every node's files are on the shared work dir: the login node reaches them all."""
        return self.login_transport()

    def execution(self, node: Node, place: Place) -> SlurmExecution:
        from launcher.clusters.slurm.execution import SlurmExecution

        self.add_run_dir(place.node_run_dir)
        return SlurmExecution(self, node, place)

    # --- before anything is submitted ---------------------------------------------------------

    def acquire(self) -> list[Node]:
        """Probe the cluster (its version, once, recorded) and refuse a recipe the partition
        cannot hold, before anything is submitted; one Node per node of the job to come."""
        plan = self.plan
        if plan is None:
            raise InfraError("a recorded slurm run is followed, not acquired again")
        profile = plan.profile
        assert isinstance(profile, SlurmProfile)
        probe = self._run("sinfo --version")
        if probe.exit_code != 0:
            raise InfraError(
                "sinfo did not answer on the login node (is Slurm's client installed and on the "
                f"PATH?): {excerpt(probe.stderr or probe.stdout, 2, 300)}"
            )
        self.version = probe.stdout.strip()
        self.gpu_option = script.gpu_option_for(
            script.parse_version(self.version), profile.gpu_option
        )
        refuse_misfit(self._run, plan.recipe, profile)
        self._record(slurm={"version": self.version, "gpu_option": self.gpu_option})
        return [
            Node(
                name=f"{NODE_PREFIX}{k}",
                host="slurm-assigned",  # a placeholder: the job names its nodes when it starts
                work_dir=script.node_work_dir(profile.work_dir, k) if k else None,
                meta={"slurm_node_index": k},
            )
            for k in range(self.node_count)
        ]

    def _record(self, **fields: object) -> None:
        if self.run_dir is not None:
            from launcher.records.rundir import RunDir

            RunDir(self.run_dir).update_record(**fields)

    # --- the job ---------------------------------------------------------------------------------

    def batch_script(self) -> str:
        """The script this run submits: the dry run's, with the GPU option the probe chose."""
        if self.plan is None:
            raise InfraError("a recorded slurm run cannot be submitted again")
        return script.render(script.batch_of(self.plan, self.gpu_option or "auto"))

    def submit_once(self) -> str:
        """Submit the job (the first node's launch does; the others get its id)."""
        with self._lock:
            if self.job_id is not None:
                return self.job_id
            text = self.batch_script()
            run_dir = self.head_dir()
            path = f"{run_dir}/{script.SCRIPT_NAME}"
            self.login_transport().put_text(text, path, mode=0o700)
            self._keep(script.SCRIPT_NAME, text)
            return self._sbatch(run_dir, path)

    def head_dir(self) -> str:
        """Node 0's run directory on the shared work dir (the job's script and output)."""
        plan = self.plan
        assert plan is not None
        return script.node_dirs(
            plan.profile.work_dir, plan.node_run_dir, plan.run_id, plan.recipe.nodes
        )[0]

    def _keep(self, name: str, text: str) -> None:
        """A copy of what was submitted, in the run directory."""
        if self.run_dir is not None:
            from launcher.records.rundir import RunDir

            rd = RunDir(self.run_dir)
            rd.write_text(name, text)  # its writes are atomic

    def _sbatch(self, run_dir: str, path: str) -> str:
        """Submit the script at `path` (the caller holds the lock); the job's id, recorded."""
        self.submitting = True
        answer = self._run(
            f"cd {shlex.quote(run_dir)} && sbatch --parsable {shlex.quote(path)}", 120
        )
        job = answer.stdout.strip().split(";")[0].strip()
        if answer.exit_code != 0 or not job.isdigit():
            raise InfraError(
                f"sbatch refused the job (exit {answer.exit_code}): "
                f"{excerpt(answer.stderr or answer.stdout, 3, 400)}"
            )
        self.job_id = job
        self._record(cluster=self.to_record())
        return job

    def job_state(self, *, fresh: bool = False) -> dict[str, str] | None:
        """The job as the scheduler says now (cached STATE_CACHE_S): JobState, NodeList,
        Restarts, Reason, StartTime, EndTime, ...; None when no source knows the job."""
        if self.job_id is None:
            return None
        if not fresh and time.monotonic() - self._state_at < STATE_CACHE_S:
            return self._state
        job = shlex.quote(self.job_id)
        state: dict[str, str] | None = None
        listed = self._run(f"squeue -h -j {job} -o '%T|%N|%u'")
        if listed.exit_code != 0 and "invalid job id" not in listed.stderr.lower():
            # the controller did not answer: no news about the job (the runner retries)
            raise InfraError(
                f"the Slurm controller did not answer squeue: {excerpt(listed.stderr, 2, 300)}"
            )
        if listed.exit_code == 0 and listed.stdout.strip():
            first = listed.stdout.strip().splitlines()[0].split("|")
            state = {"JobState": first[0], "NodeList": first[1] if len(first) > 1 else ""}
        shown = self._run(f"scontrol show job -o {job}")
        if shown.exit_code == 0 and "JobState=" in shown.stdout:
            fields = parse_scontrol(shown.stdout)
            state = {**fields, **(state or {})}
        if state is None:
            state = self._sacct(job)
        self._state, self._state_at = state, time.monotonic()
        if not self.job_nodes and state and _word(state) in ("RUNNING", "COMPLETING"):
            self._learn_nodes(state.get("NodeList", ""))
        self._learn_start(state)
        return state

    def _learn_start(self, state: Mapping[str, str] | None) -> None:
        """The run's clock starts when its job starts holding its nodes (scontrol's RunTime)."""
        if self.started_at is None and state and state.get("RunTime"):
            ran = run_seconds(state["RunTime"])
            if ran is not None and _word(state) in ("RUNNING", "COMPLETING"):
                self.started_at = time.time() - ran
                self._record(cluster=self.to_record())

    def job_ended_at(self) -> float | None:
        """When the job stopped holding its nodes (epoch s, on the launcher's clock): its start
        plus the run time Slurm gives an ended job (scontrol's RunTime, sacct's Elapsed: End -
        Start, so no time zone and no clock of the cluster's is read). Known after release
        (None while it runs, or when no source told): GPU-hours end here, not at the
        launcher's release, which comes after its own polling and collecting."""
        return self._job_ended_at

    def _learn_end(self) -> None:
        if self.job_id is None or self.started_at is None:
            return
        state = self.job_state(fresh=True)
        if not state or _word(state) in ALIVE or not _word(state):
            return
        ran = run_seconds(state.get("RunTime", ""))
        if ran is not None:
            self._job_ended_at = self.started_at + ran

    def job_started_at(self) -> float | None:
        """When the job started holding its nodes (epoch s), from scontrol's RunTime (no time
        zone to get wrong): GPU-hours count from here, never the time it waited in the queue."""
        return self.started_at

    def _learn_nodes(self, nodelist: str) -> None:
        """The job's nodes in its order (job-node-K is the K-th), kept once it starts: Slurm
        drops a failed node from the job's NodeList, and the failure must still name it."""
        if not nodelist or nodelist == "(null)":
            return
        names = self._run(f"scontrol show hostnames {shlex.quote(nodelist)}").stdout.split()
        if len(names) == self.node_count:
            self.job_nodes = names
            self._record(cluster=self.to_record())

    def _sacct(self, job: str) -> dict[str, str] | None:
        """The job from accounting, where the cluster keeps it (many keep none: not an error)."""
        answer = self._run(
            f"sacct -n -P -X -j {job} -o State,NodeList,Start,End,Restarts,Elapsed 2>&1"
        )
        if answer.exit_code != 0:
            return None
        for line in answer.stdout.splitlines():
            parts = line.split("|")
            if len(parts) >= 5 and parts[0].strip():
                return {
                    "JobState": parts[0].split()[0],
                    "NodeList": parts[1],
                    "StartTime": parts[2],
                    "EndTime": parts[3],
                    "Restarts": parts[4],
                    "RunTime": parts[5] if len(parts) > 5 else "",
                }
        return None

    def alive(self) -> bool | None:
        """Does the job still hold its nodes? None: no source knows it (any more)."""
        state = self.job_state()
        if state is None:
            return None
        return state.get("JobState", "").split()[0] in ALIVE if state.get("JobState") else None

    def ended_long_enough(self) -> bool:
        """The job has ended, and a shared file system had ENDED_GRACE_S to show its files."""
        if self.alive():
            self._ended_at = None
            return False
        if self._ended_at is None:
            self._ended_at = time.monotonic()
        return time.monotonic() - self._ended_at >= ENDED_GRACE_S

    def job_failure(self, *, now: bool = False) -> str | None:
        """Why Slurm, not the run, ended or restarted the job (no verdict then), naming its
        nodes that failed; None when it did not. `now`: a node's script just ended: asked
        afresh, and a job still COMPLETING is given settle_s to show how it ended."""
        state = self.job_state(fresh=now)
        deadline = time.monotonic() + self.settle_s
        while now and state and _word(state) == "COMPLETING" and time.monotonic() < deadline:
            time.sleep(0.5)
            state = self.job_state(fresh=True)
        if not state:
            return None
        restarts = state.get("Restarts", "0")
        if restarts.isdigit() and int(restarts) > 0:
            return (
                f"slurm job {self.job_id} was requeued (Restarts={restarts}, now "
                f"{state.get('JobState')}): a second attempt would join the first in one "
                "measurement, so the run is refused as two attempts"
            )
        word = _word(state)
        reason = state.get("Reason")
        if word == "COMPLETING" and reason in INFRA_REASONS:  # being ended for a node's sake
            word = INFRA_REASONS[reason]
        if word not in INFRA:
            return None
        nodes = ",".join(self.job_nodes) or state.get("NodeList", "")
        failed = self._failed_nodes(nodes)
        which = f"; failed node(s): {failed}" if failed else f" on {nodes}" if nodes else ""
        because = f" ({reason})" if reason and reason != "None" else ""
        return f"slurm job {self.job_id} ended {word}{because}{which}: an infrastructure failure"

    def _failed_nodes(self, nodelist: str) -> str:
        """The job's nodes sinfo calls down, failed or not responding, with Slurm's reason; and
        which node of the run each is (job-node-K: the K-th of the job's node list)."""
        names = self.job_nodes or (
            self._run(f"scontrol show hostnames {shlex.quote(nodelist)}").stdout.split()
            if nodelist and nodelist != "(null)"
            else []
        )
        if not names:
            return ""
        answer = self._run(f"sinfo -h -N -n {shlex.quote(','.join(names))} -o '%N|%T|%E'")
        bad = []
        for line in answer.stdout.splitlines():
            parts = line.split("|")
            if len(parts) < 3:
                continue
            name, node_state, why = parts[0].strip(), parts[1].strip().lower(), parts[2].strip()
            if any(w in node_state for w in ("down", "fail", "drain", "not_resp", "*")):
                rank = names.index(name) if name in names else None
                label = f"{NODE_PREFIX}{rank} = " if rank is not None else ""
                bad.append(f"{label}{name} is {node_state} ({why or 'no reason given'})")
        return "; ".join(dict.fromkeys(bad))

    def cancel_job(self, timeout_s: float) -> str:
        """End this run's job, and only it (its id, as its user): `scancel`, with which Slurm
        sends TERM to every process of the job, gives them the cluster's KillWait to end by
        themselves (node.sh's EXIT trap prints the cancelled stage's end and removes its
        container), then KILLs what is left; past `timeout_s`, KILL from us. What is still in
        squeue then ("" when the job is gone)."""
        with self._lock:
            if self.job_id is None:
                self.job_id = self._submitted_unrecorded()
            if self.job_id is None:
                return ""
            job, user = shlex.quote(self.job_id), shlex.quote(self.user)
            self._mark_cancelled()
            if not self.alive():
                return ""
            self._run(f"scancel --user={user} {job}")
            self._wait(max(CANCEL_GRACE_TENTHS / 10, timeout_s - 10))
            if self.alive():
                self._run(f"scancel --signal=KILL --full --user={user} {job}")
                self._wait(10)
            if self.alive():
                state = self.job_state(fresh=True) or {}
                return f"slurm job {self.job_id} ({state.get('JobState')})"
            return ""

    def _submitted_unrecorded(self) -> str | None:
        """A job this run submitted whose id never came back (sbatch's answer lost to Ctrl-C or
        a dropped connection): found by the run's own job name and this user, never by more.
        None only when squeue answered and lists no such job; a squeue that did not answer, or
        several jobs of the run's name, is an InfraError: what cannot be told apart is not
        taken for nothing to end."""
        if not self.job_name:
            return None
        answer = self._run(
            f"squeue -h -u {shlex.quote(self.user)} -n {shlex.quote(self.job_name)} -o %i"
        )
        if answer.exit_code != 0:
            raise InfraError(
                f"squeue did not answer whether job {self.job_name} of user {self.user} is "
                f"queued or running: {excerpt(answer.stderr or answer.stdout, 2, 300)}; it may "
                f"still hold nodes: `squeue -u {self.user} -n {self.job_name}` on the login node"
            )
        ids = [i for i in answer.stdout.split() if i.isdigit()]
        if len(ids) > 1:
            raise InfraError(
                f"{len(ids)} jobs are named {self.job_name} for user {self.user} "
                f"({', '.join(ids)}): none is ended by name; end them with `scancel` after "
                "looking at them (`squeue -u USER -n NAME`)"
            )
        return ids[0] if ids else None

    def step_argv(self, index: int, node_run_dir: str, remote: list[str]) -> list[str]:
        """`reproduce ssh`: the srun command, run on the login node, that opens a shell (or runs
        `remote`) on node `index` of this run's job, as one more step of the job (`--overlap`:
        beside the step that runs node.sh, on resources the job already holds). Slurm's own
        authentication carries it to the node, so no compute node's host key is trusted, and
        clusters that forbid SSH to compute nodes (no pam_slurm_adopt) allow it. Only while the
        job runs, and only when it is this run's: its name and its user must be the recorded
        ones, so a reused job id never opens a shell in another job, or another user's."""
        if self.job_id is None:
            raise BadInput("the run recorded no Slurm job: there is no node to open a shell on.")
        state = self.job_state(fresh=True)
        if not state:
            raise BadInput(
                f"slurm job {self.job_id} is not known to the scheduler any more (it ended): "
                "there is no node to open a shell on."
            )
        word = _word(state)
        owner = (state.get("UserId") or "").split("(")[0]
        if owner != self.user or state.get("JobName") != self.holding_name:
            raise BadInput(
                f"slurm job {self.job_id} is not this run's (it is {state.get('JobName') or '?'} "
                f"of user {owner or '?'}; the run submitted {self.holding_name} as {self.user}): "
                "no shell is opened in another job."
            )
        if word != "RUNNING":
            raise BadInput(
                f"slurm job {self.job_id} is {word or 'in no known state'}: it holds no node to "
                "open a shell on."
            )
        if len(self.job_nodes) != self.node_count:
            raise InfraError(f"slurm job {self.job_id}'s nodes could not be read from Slurm")
        here = "--pty" if not remote else ""
        shell = (
            ["/bin/sh", "-c", " ".join(remote)]
            if remote
            else ["/bin/sh", "-c", 'exec "${SHELL:-/bin/bash}" -l']
        )
        argv = [
            "srun", f"--jobid={self.job_id}", "--overlap", "--nodes=1", "--ntasks=1",
            f"--nodelist={self.job_nodes[index]}", f"--chdir={node_run_dir}", "--quiet",
        ]  # fmt: skip
        return [*argv, *([here] if here else []), *shell]

    @property
    def holding_name(self) -> str | None:
        """The name of the job that holds the run's nodes (the run's own job)."""
        return self.job_name

    def step_transport(self) -> Transport | None:
        """The login node over SSH, whose key `reproduce ssh` pins; None: it is this host."""
        return None if self.login is None else self.login_transport()

    def add_run_dir(self, node_run_dir: str) -> None:
        """A node's run directory (each node's execution says), marked first by a cancel."""
        if node_run_dir not in self.run_dirs:
            self.run_dirs.append(node_run_dir)

    def _mark_cancelled(self) -> None:
        """Every node's cancel mark before the job is ended: each node's EXIT trap then reads
        its stage as cancelled, whichever node's cancel came first."""
        if self.run_dirs:
            marks = " ".join(shlex.quote(f"{d}/{CANCEL_MARK}") for d in self.run_dirs)
            self._run(f"touch {marks} 2>/dev/null; true")

    def _wait(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.job_state(fresh=True)
            if not self.alive():
                return
            time.sleep(0.3)

    def release(self) -> None:
        """A job of this run still holding nodes is ended (not after a detach: the runner keeps
        the cluster then); the connection to the login node is closed."""
        try:
            if self.job_id is None and self.submitting:
                self.job_id = self._submitted_unrecorded()
            if self.job_id is not None and self.alive():
                left = self.cancel_job(120)
                if left:
                    raise InfraError(f"could not end {left}; end it with `scancel {self.job_id}`")
            try:
                self._learn_end()
            except (InfraError, OSError):
                pass  # no answer: the run's release is its end, as on a host
        finally:
            if self._transport is not None:
                self._transport.close()

    def to_record(self) -> dict[str, Any]:
        """What attach, cancel and logs need to find the job again (run.json; no secrets)."""
        return {
            "kind": "slurm",
            "login": asdict(self.login) if self.login is not None else None,
            "job_id": self.job_id,
            "user": self.user,
            "nodes": self.node_count,
            "job_nodes": self.job_nodes,
            "started_at": self.started_at,
            "job_name": self.job_name,
        }


def recorded_job(record: Mapping[str, Any]) -> dict[str, Any]:
    """What a recorded run's job and a group's step both keep, read as clusters.check_record
    has already checked it (every field present and of its JSON type: no default stands in for
    a missing one)."""
    started = record["started_at"]
    return {
        "job_id": record["job_id"],
        "user": record["user"],
        "nodes": record["nodes"],
        "job_nodes": [str(n) for n in record["job_nodes"]],
        "started_at": float(started) if started is not None else None,
    }


def refuse_misfit(
    run: Callable[[str], CommandResult], recipe: Recipe, profile: SlurmProfile
) -> None:
    """BadInput when the partition has too few nodes with the recipe's GPUs per node (sinfo's
    gres, whatever the nodes' state: a node down now may be up when the job starts)."""
    part = shlex.quote(str(profile.partition))
    answer = run(f"sinfo -h -N -p {part} -o '%N|%G'")
    if answer.exit_code != 0:
        raise InfraError(
            f"sinfo could not list partition {profile.partition}: "
            f"{excerpt(answer.stderr or answer.stdout, 2, 300)}"
        )
    per_node: dict[str, int] = {}
    for line in answer.stdout.splitlines():
        name, _, gres = line.partition("|")
        if name.strip():
            per_node[name.strip()] = max(per_node.get(name.strip(), 0), gpus_in(gres))
    need, count = recipe.gpus_per_node, recipe.nodes
    fit = [n for n, gpus in per_node.items() if gpus >= need]
    if not per_node:
        raise BadInput(
            f"{profile.path}: partition {profile.partition} has no nodes (sinfo lists none); "
            "nothing was submitted."
        )
    if len(fit) < count:
        most = max(per_node.values())
        raise BadInput(
            f"{recipe.path}: the recipe needs {count} node(s) with {need} GPUs each, but "
            f"partition {profile.partition} has {len(fit)} such node(s) (at most {most} GPUs "
            f"per node on {len(per_node)} node(s), as sinfo counts gres); nothing was "
            "submitted."
        )


_GRES_GPU = re.compile(r"(?:^|,)gpu(?::[A-Za-z0-9_.-]+)?:(\d+)")


def gpus_in(gres: str) -> int:
    """GPUs in sinfo's %G ("gpu:8", "gpu:h100:8(S:0-1)", "gpu:a:4,gpu:b:4"), added up."""
    return sum(int(m.group(1)) for m in _GRES_GPU.finditer(gres.strip()))


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o`'s one line of Key=Value words."""
    fields: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key and key not in fields:
            fields[key] = value
    return fields


def run_seconds(text: str) -> float | None:
    """scontrol's RunTime ([D-]HH:MM:SS) in seconds; None when it is not one."""
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if (
        not all(p.isdigit() for p in parts)
        or not 1 <= len(parts) <= 3
        or (days and not days.isdigit())
    ):
        return None
    seconds = 0
    for p in parts:
        seconds = seconds * 60 + int(p)
    return float(seconds + (int(days) * 86400 if days else 0))


def _word(state: Mapping[str, str]) -> str:
    """The job's state word (squeue's and scontrol's may carry a suffix: "CANCELLED by 0")."""
    text = state.get("JobState") or ""
    return text.split()[0] if text.split() else ""
