"""The shared runner: every backend (local, SSH, AWS) executes a Plan's node script through here.

    acquire -> stage node.sh + scripts/ into NODE_RUN_DIR -> launch detached -> stream node.log by
    byte offset into the run dir -> fetch exit code, collect *.json -> release -> measure + judge

The node script runs in its own session (setsid) under a small wrapper that records its pid (= its
process group) and, whatever happens to node.sh, its exit code. So the run survives the
launcher's death and a dropped SSH connection; `attach` picks the stream up at the size of the
local logs/node.log, and `cancel` kills exactly that process group and the run's container.
"""

from __future__ import annotations

import fcntl
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

import yaml

from launcher.clusters.base import Cluster, Node, Transport
from launcher.errors import BadInput, CheckFailed, InfraError, Interrupted, ReproduceError
from launcher.rundir import FINAL_STATES, TRAIN_STAGE, LogSplitter, RunDir, Timeline

INTERRUPT_CHOICES = ("ask", "cancel", "detach")
READ_CHUNK = 1 << 20

# Runs node.sh detached. Trapping (not ignoring) TERM keeps the wrapper alive to write the exit
# code after node.sh dies, while node.sh itself still gets the default TERM behaviour.
WRAPPER = """#!/bin/bash
# Written by reproduce: runs node.sh in its own session; records pid (= process group) and exit code.
cd "$(dirname "$0")" || exit 1
echo $$ > pid
trap 'echo "reproduce: wrapper got SIGTERM" >&2' TERM
trap '' HUP
bash node.sh > node.log 2>&1 < /dev/null
rc=$?
echo "$rc" > exit_code.tmp && mv -f exit_code.tmp exit_code
"""

_COLLECT_RESERVED = {"run.json", "status.json", "timeline.json", "plan.json", "verdict.json"}
_JSON_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.json$")
_STEP_LINE = re.compile(rb"log_utils\.py:\d+ - step (\d+):")


@dataclass
class Outcome:
    """How a run ended, as far as the runner knows; `measurement` is (Result, Verdict) when measured."""

    state: str  # done | failed | cancelled | detached
    exit_code: int | None
    run_dir: Path
    measurement: Any = None


def outcome_exit_code(outcome: Outcome) -> int:
    """0: done and, where judged, reproduced; 1: judged and not reproduced (the CLI contract)."""
    if outcome.state != "done":
        return 130 if outcome.state == "cancelled" else 3
    verdict = (
        outcome.measurement[1]
        if isinstance(outcome.measurement, tuple) and len(outcome.measurement) > 1
        else None
    )
    if verdict is None:
        return 0
    return 0 if getattr(verdict, "status", None) == "reproduced" else 1


# --------------------------------------------------------------------------------------------
# Node-side commands (every value quoted)


def launch_command(node_run_dir: str) -> str:
    d = shlex.quote(node_run_dir)
    return (
        f"cd {d} && if [ -e pid ]; then echo 'a run was already launched in '{d} >&2; exit 1; fi\n"
        "setsid nohup bash run_node.sh </dev/null >/dev/null 2>&1 &\n"
        "for _ in $(seq 200); do [ -s pid ] && break; sleep 0.05; done\n"
        "cat pid"
    )


# Is anything of the run's session (sid = pgid = the wrapper's pid) still running? Zombies do not
# count: a node whose init does not reap them must not look busy forever.
ALIVE_FN = (
    '_alive() { if command -v ps >/dev/null 2>&1; then ps -s "$1" -o stat= 2>/dev/null | grep -qv "^Z"; '
    'else kill -0 -- "-$1" 2>/dev/null; fi; }\n'
)


def poll_command(node_run_dir: str) -> str:
    d = shlex.quote(node_run_dir)
    return (
        ALIVE_FN + f"cd {d} 2>/dev/null || {{ echo gone; exit 0; }}\n"
        'if [ -f exit_code ]; then echo "exit $(cat exit_code)"\n'
        'elif [ -s pid ] && _alive "$(cat pid)"; then echo alive\n'
        "else echo gone; fi"
    )


def cancel_command(node_run_dir: str, container: str) -> str:
    """Stop the run's process group and its container (which ends Ray inside it); nothing else."""
    d, c = shlex.quote(node_run_dir), shlex.quote(container)
    rm = f"if command -v docker >/dev/null 2>&1; then docker rm -f {c} >/dev/null 2>&1 || true; fi"
    return (
        ALIVE_FN
        + f"""cd {d} || exit 0
touch cancelled
pg=$(cat pid 2>/dev/null || true)
alive() {{ [ -n "$pg" ] && _alive "$pg"; }}
stop() {{  # the run's process group, and anything of its session that left the group
  kill -"$1" -- "-$pg" 2>/dev/null || true
  if command -v pkill >/dev/null 2>&1; then pkill -"$1" -s "$pg" 2>/dev/null || true; fi
}}
if alive; then stop TERM; fi
{rm}
for _ in $(seq 100); do alive || break; sleep 0.1; done
if alive; then stop KILL; sleep 0.3; fi
{rm}
[ -f exit_code ] || echo 137 > exit_code
left=""
if alive; then left="processes of group $pg"; fi
if command -v docker >/dev/null 2>&1 && [ -n "$(docker ps -aq --filter name=^{container}$ 2>/dev/null)" ]; then left="$left container {container}"; fi
echo "left:$left"
"""
    )


def cleanup_command(container: str) -> str:
    """After the script ended: remove its container if the script left one (stopped or not)."""
    c = shlex.quote(container)
    return (
        f"if command -v docker >/dev/null 2>&1; then docker rm -f {c} >/dev/null 2>&1 || true; fi"
    )


# --------------------------------------------------------------------------------------------
# Finding a recorded run's cluster again


def cluster_from_record(record: Mapping[str, Any]) -> Cluster:
    """The cluster of a recorded run: module launcher.clusters.<kind> provides `from_record(record)`.

    A backend that launched nodes returns a cluster that can release them again (AWS: terminate
    the instances named in the record).
    """
    kind = record.get("kind")
    if not kind or not re.match(r"^[a-z0-9_]+$", str(kind)):
        raise BadInput(f"run.json names no usable cluster kind ({kind!r})")
    try:
        module = import_module(f"launcher.clusters.{kind}")
    except ImportError as err:
        raise BadInput(
            f"run.json names cluster kind {kind!r}, which this launcher does not have"
        ) from err
    if not hasattr(module, "from_record"):
        raise BadInput(
            f"cluster kind {kind!r} cannot be reattached (launcher.clusters.{kind} has no from_record)"
        )
    return module.from_record(record)


def cluster_record(cluster: Any) -> dict[str, Any]:
    to_record = getattr(cluster, "to_record", None)
    return to_record() if callable(to_record) else {"kind": getattr(cluster, "name", "unknown")}


def default_scripts_dir() -> Path | None:
    from launcher.resources import data_dir

    try:
        return data_dir("scripts")
    except FileNotFoundError:
        return None


# --------------------------------------------------------------------------------------------
# Console


class Progress:
    """Stage start/end and training step lines on stderr (rich), so a long run shows where it is."""

    def __init__(self, console: Any = None, steps_total: int | None = None) -> None:
        if console is None:
            from rich.console import Console

            console = Console(stderr=True, highlight=False)
        self.console = console
        self.steps_total = steps_total
        self.started = time.monotonic()
        self.last_step: int | None = None

    def say(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        self.console.print(
            f"[{elapsed:7.1f}s] {text}", markup=False, highlight=False, soft_wrap=True
        )

    def marker(self, marker: Mapping[str, str]) -> None:
        if marker["event"] == "start":
            self.say(f"stage {marker['stage']} started")
        else:
            self.say(f"stage {marker['stage']} {marker.get('status', 'ok')}")

    def data(self, chunk: bytes) -> None:
        steps = _STEP_LINE.findall(chunk)
        if steps:
            step = int(steps[-1])
            if step != self.last_step:
                self.last_step = step
                total = f" of {self.steps_total}" if self.steps_total else ""
                self.say(f"train step {step + 1}{total}")


# --------------------------------------------------------------------------------------------
# Following a launched run


@contextmanager
def _follow_lock(rd: RunDir) -> Iterator[None]:
    """One follower per run dir: two would both append to node.log and double it."""
    fh = open(rd.path / ".follow.lock", "w")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInput(
                f"run {rd.path} is being followed by another reproduce process right now"
            ) from None
        yield
    finally:
        fh.close()


class _Terminated(KeyboardInterrupt):
    """SIGTERM: nobody to ask, so the run is cancelled."""


@contextmanager
def _sigterm_cancels() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _reattach_hint(rd: RunDir) -> str:
    return f"Reattach with `reproduce attach {rd.path}`; stop it with `reproduce cancel {rd.path}`."


class BudgetExceeded(Exception):
    """The run reached --max-usd or --max-hours: it is cancelled on the node, then released."""


class Follower:
    """Streams a launched run's log into the run dir until the node script ends."""

    def __init__(
        self,
        rd: RunDir,
        transport: Transport,
        *,
        node_run_dir: str,
        container: str,
        timeline: Timeline,
        progress: Progress,
        poll_s: float = 1.0,
        reconnect_s: float = 60.0,
        guard: Callable[[], str | None] | None = None,
    ) -> None:
        self.rd = rd
        self.transport = transport
        self.guard = guard  # returns why the run must stop now (the budget), or None
        self.node_run_dir = node_run_dir.rstrip("/")
        self.container = container
        self.timeline = timeline
        self.progress = progress
        self.poll_s = poll_s
        self.reconnect_s = reconnect_s
        self.splitter = LogSplitter(rd.logs, timeline, on_marker=self._on_marker)

    def _on_marker(self, marker: Mapping[str, str]) -> None:
        self.rd.write_timeline(self.timeline)
        self.progress.marker(marker)

    def drain(self) -> int:
        """Copy every byte the node has that we do not; returns how many."""
        total = 0
        while True:
            data = self.transport.read_from(
                f"{self.node_run_dir}/node.log", self.splitter.offset(), READ_CHUNK
            )
            if not data:
                break
            self.splitter.append(data)
            self.progress.data(data)
            total += len(data)
            if len(data) < READ_CHUNK:
                break
        self.splitter.flush()
        return total

    def poll(self) -> tuple[str, int | None]:
        res = self.transport.run(poll_command(self.node_run_dir), timeout_s=60, check=False)
        out = res.stdout.strip()
        if out.startswith("exit "):
            try:
                return "exit", int(out.split()[1])
            except (IndexError, ValueError):
                return "exit", None
        if out in ("alive", "gone") and res.exit_code == 0:
            return out, None
        # Anything else is a broken exchange, not news about the run: let the caller retry.
        raise InfraError(
            f"unexpected answer from the node while polling (exit {res.exit_code}): {out[:200]!r}"
        )

    def _with_reconnect(self, action: Callable[[], Any]) -> Any:
        """Retry a node operation while the connection comes back, up to reconnect_s."""
        deadline = time.monotonic() + self.reconnect_s
        warned = False
        while True:
            try:
                return action()
            except (InfraError, OSError, EOFError) as err:
                if time.monotonic() >= deadline:
                    raise InfraError(
                        f"lost the connection to the node and could not reconnect: {err}"
                    ) from err
                if not warned:
                    self.progress.say(
                        f"connection problem ({err}); reconnecting (up to {self.reconnect_s:.0f} s)"
                    )
                    warned = True
                close = getattr(self.transport, "close", None)
                if callable(close):
                    close()
                time.sleep(min(2.0, max(0.2, self.poll_s)))

    def follow(self) -> int | None:
        """Until the node script ends: returns its exit code (None when it vanished without one)."""
        while True:
            self._with_reconnect(self.drain)
            state, code = self._with_reconnect(self.poll)
            if state == "exit":
                self._with_reconnect(self.drain)
                return code
            if state == "gone":
                self._with_reconnect(self.drain)
                state, code = self._with_reconnect(self.poll)  # it may have just finished
                if state == "exit":
                    self._with_reconnect(self.drain)
                    return code
                return None
            reason = self.guard() if self.guard else None
            if reason:
                raise BudgetExceeded(reason)
            time.sleep(self.poll_s)

    def finish_logs(self, stage_status: str) -> None:
        self.splitter.flush_partial()
        self.splitter.close()
        self.timeline.close_open(stage_status)
        self.rd.write_timeline(self.timeline)


# --------------------------------------------------------------------------------------------
# The run


def secrets_env(secrets: Mapping[str, str]) -> str:
    """KEY='value' lines that node.sh sources once (then deletes); never written locally."""
    lines = []
    for key, value in secrets.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise BadInput(f"secret name {key!r} is not a valid environment variable name")
        lines.append(f"{key}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def _stage_files(
    transport: Transport,
    node_run_dir: str,
    node_script: str,
    scripts_dir: Path | None,
    secrets: Mapping[str, str] | None = None,
) -> None:
    transport.run(f"mkdir -p {shlex.quote(node_run_dir)} && chmod 700 {shlex.quote(node_run_dir)}")
    if secrets:
        transport.put_text(secrets_env(secrets), f"{node_run_dir}/.secrets.env", mode=0o600)
    transport.put_text(node_script, f"{node_run_dir}/node.sh", mode=0o755)
    transport.put_text(WRAPPER, f"{node_run_dir}/run_node.sh", mode=0o755)
    if scripts_dir is not None and scripts_dir.is_dir():
        for path in sorted(scripts_dir.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                rel = path.relative_to(scripts_dir).as_posix()
                transport.put(
                    path, f"{node_run_dir}/scripts/{rel}", mode=path.stat().st_mode & 0o777
                )


def _launch(transport: Transport, node_run_dir: str) -> int:
    out = transport.run(launch_command(node_run_dir), timeout_s=60).stdout.strip()
    try:
        return int(out.splitlines()[-1])
    except (IndexError, ValueError):
        raise InfraError(
            f"the node script did not start in {node_run_dir} (no pid written)"
        ) from None


def _collect(rd: RunDir, transport: Transport, node_run_dir: str) -> list[str]:
    """The node's *.json (preflight.json, stack.json, ...) into the run dir."""
    listing = transport.run(
        f'cd {shlex.quote(node_run_dir)} && for f in *.json; do [ -f "$f" ] && echo "$f"; done; true',
        check=False,
    ).stdout.split()
    got = []
    for name in listing:
        if not _JSON_NAME.match(name):
            continue
        dest = rd.path / ("node" if name in _COLLECT_RESERVED else "") / name
        try:
            transport.get(f"{node_run_dir}/{name}", dest)
            got.append(name)
        except FileNotFoundError:
            continue
    return got


# A failed stage of these is a check of the recipe that said no (exit 1: the image's stack differs
# from the recipe's, or training failed and was judged). Any other failed stage is the
# infrastructure's (exit 3): a node that fails the preflight (too few GPUs, a bad GPU, no EFA), no
# docker, a pull or a download that failed, Ray that did not start.
CHECK_STAGES = frozenset({"stack", TRAIN_STAGE})


def _failed_stage(timeline: Timeline) -> str | None:
    failed = [s for s in timeline.stages if s["status"] not in ("ok", "running")]
    return failed[-1]["name"] if failed else None


def _check_detail(rd: RunDir, stage: str | None) -> str | None:
    """What a failed check measured, from the report the node wrote (preflight*.json, stack.json)."""
    if stage in ("preflight", "preflight-gpu"):
        path = rd.path / f"{stage}.json"
        if not path.exists():
            return None
        from launcher.preflight import parse_report

        try:
            return parse_report(path.read_text(errors="replace")).summary()
        except ReproduceError:
            return None
    if stage == "stack":
        report = rd.read_json("stack.json", None) or {}
        bad = [c for c in report.get("checks", []) if not c.get("ok")]
        if bad:
            return "the image's software differs from the recipe's stack: " + "; ".join(
                f"{c.get('name')}: {c.get('value')} (expected {c.get('expected')})" for c in bad
            )
    return None


def _failed_stage_message(rd: RunDir, timeline: Timeline, code: int | None) -> str:
    stage = _failed_stage(timeline)
    log = rd.logs / f"{stage}.log" if stage else rd.logs / "node.log"
    tail = ""
    if log.exists():
        lines = log.read_bytes().decode(errors="replace").rstrip("\n").splitlines()[-8:]
        tail = "\n  " + "\n  ".join(lines) if lines else ""
    where = f"in stage {stage} " if stage else ""
    how = f"with exit code {code}" if code is not None else "without an exit code (killed?)"
    return f"the node script failed {where}{how}; see {log}.{tail}"


class Runner:
    """One run's life on one node; `execute`, `attach` and `cancel` below are its entry points."""

    def __init__(
        self,
        rd: RunDir,
        cluster: Cluster,
        *,
        recipe_raw: Mapping[str, Any] | None,
        progress: Progress,
        on_interrupt: str = "ask",
        poll_s: float = 1.0,
        reconnect_s: float = 60.0,
        measure: bool = True,
        budget: Any = None,
    ) -> None:
        if on_interrupt not in INTERRUPT_CHOICES:
            raise BadInput(
                f"--on-interrupt must be one of {', '.join(INTERRUPT_CHOICES)}, not {on_interrupt!r}"
            )
        self.rd = rd
        self.cluster = cluster
        self.recipe_raw = recipe_raw
        self.progress = progress
        self.on_interrupt = on_interrupt
        self.poll_s = poll_s
        self.reconnect_s = reconnect_s
        self.measure = measure
        self.budget = budget  # launcher.budget.Budget or None
        record = rd.record()
        self.node_run_dir: str = record["node_run_dir"]
        self.container: str = record["container"]
        self.timeline = rd.timeline()
        self.keep_cluster = False

    def _follower(self, transport: Transport) -> Follower:
        return Follower(
            self.rd,
            transport,
            node_run_dir=self.node_run_dir,
            container=self.container,
            timeline=self.timeline,
            progress=self.progress,
            poll_s=self.poll_s,
            reconnect_s=self.reconnect_s,
            guard=self._budget_guard if self.budget is not None else None,
        )

    def _budget_guard(self) -> str | None:
        start = self.timeline.acquired_at
        return self.budget.check(time.time() - start) if start is not None else None

    def release(self) -> None:
        """End what the cluster acquired, to the end even through Ctrl-C (launcher/teardown.py)."""
        from launcher.teardown import release_hard

        if self.keep_cluster:
            return
        try:
            failure = release_hard(self.cluster)
            if failure is not None:
                raise failure
        finally:
            if self.timeline.acquired_at is not None and self.timeline.released_at is None:
                self.timeline.released_at = time.time()
            self.rd.write_timeline(self.timeline)

    def _choose(self, err: KeyboardInterrupt) -> str:
        if isinstance(err, _Terminated):
            return "cancel"
        if self.on_interrupt != "ask":
            return self.on_interrupt
        if not sys.stdin or not sys.stdin.isatty():
            return "cancel"
        try:
            answer = input(
                "\ninterrupted: [c]ancel the run on the node, or [d]etach and leave it running? [c/d] "
            )
        except (KeyboardInterrupt, EOFError):
            return "cancel"
        return "detach" if answer.strip().lower().startswith("d") else "cancel"

    def follow(self, transport: Transport) -> Outcome:
        """Stream to the end, handling Ctrl-C/SIGTERM and a lost connection; then finish."""
        follower = self._follower(transport)
        with _follow_lock(self.rd), _sigterm_cancels():
            follower.splitter.rebuild()
            self.rd.set_status("running", pid_file=f"{self.node_run_dir}/pid")
            try:
                code = follower.follow()
            except KeyboardInterrupt as err:
                choice = self._choose(err)
                if choice == "detach":
                    follower.finish_logs("running")
                    self.keep_cluster = True
                    self.rd.set_status(
                        "detached", "detached by the user; the run goes on on the node"
                    )
                    raise Interrupted(
                        "detached: the run goes on on the node and its GPUs keep costing money.",
                        hint=_reattach_hint(self.rd),
                    ) from None
                self.progress.say("cancelling the run on the node")
                self._cancel_or_say(transport, follower)
                self._safe_drain(follower)
                follower.finish_logs("cancelled")
                self.rd.set_status("cancelled", "cancelled by the user (Ctrl-C or SIGTERM)")
                raise Interrupted(
                    "cancelled: the run's processes and container on the node were stopped."
                ) from None
            except BudgetExceeded as err:
                self.progress.say(f"budget reached: {err}; cancelling the run on the node")
                self._cancel_or_say(transport, follower)
                self._safe_drain(follower)
                follower.finish_logs("cancelled")
                self.rd.set_status("cancelled", f"budget reached: {err}")
                raise CheckFailed(
                    f"stopped: {err}. The run was cancelled on the node and the node released."
                ) from None
            except InfraError as err:
                raise self._left_running(
                    follower,
                    f"lost the node: {err}",
                    f"{err}. The run may still be going on on the node (its GPUs keep costing money).",
                ) from err
            return self._finish(transport, follower, code)

    def _left_running(self, follower: Follower | None, why: str, message: str) -> InfraError:
        """The run may go on without us: keep the node, say so, and say how to reattach or cancel."""
        if follower is not None:
            follower.finish_logs("running")
        self.keep_cluster = True
        self.rd.set_status("detached", why)
        hint = _reattach_hint(self.rd)
        down = getattr(self.cluster, "down_command", None)
        if callable(down):  # a node this run launched is billed until it is ended
            cost = (
                f" (about ${self.budget.usd_per_hour:.2f}/h)"
                if self.budget and self.budget.usd_per_hour
                else ""
            )
            hint += f" The node keeps billing{cost} until you end it: `{down()}`."
        return InfraError(message, hint=hint)

    def _safe_drain(self, follower: Follower) -> None:
        try:
            follower.drain()
        except (InfraError, OSError, EOFError):
            pass

    def _cancel_or_say(self, transport: Transport, follower: Follower | None = None) -> None:
        """Cancel on the node; when that fails the run may go on, and the user is told how to end it."""
        try:
            self._cancel_on_node(transport)
        except InfraError as err:
            error = self._left_running(
                follower,
                f"cancel failed: {err}",
                f"could not cancel the run on the node: {err}. It may still be running "
                "(and costing money).",
            )
            self.keep_cluster = (
                False  # a cancel was asked for, not a detach: still end the paid node
            )
            raise error from err

    def _cancel_on_node(self, transport: Transport) -> None:
        out = transport.run(
            cancel_command(self.node_run_dir, self.container), timeout_s=120, check=False
        ).stdout
        left = out.strip().rsplit("left:", 1)[-1].strip() if "left:" in out else ""
        if left:
            raise InfraError(f"cancel could not stop everything on the node: still there: {left}")

    def _finish(self, transport: Transport, follower: Follower, code: int | None) -> Outcome:
        cancelled = (
            transport.run(
                f"test -e {shlex.quote(self.node_run_dir)}/cancelled", check=False
            ).exit_code
            == 0
        )
        ok = code == 0 and not cancelled
        follower.finish_logs("ok" if ok else ("cancelled" if cancelled else "failed"))
        self.rd.set_status("collecting")
        transport.run(cleanup_command(self.container), timeout_s=120, check=False)
        collected = _collect(self.rd, transport, self.node_run_dir)
        self.rd.update_record(exit_code=code, collected=collected)
        try:
            self.release()  # before judging: the node stops billing now, and released_at dates the GPU-hours
        except ReproduceError as err:
            # Judge the run all the same; the caller's `finally` releases again and, if something is
            # still left then, raises what is left and how to end it.
            self.progress.say(
                f"teardown did not finish yet ({str(err).splitlines()[0]}); retrying after judging"
            )
        if cancelled:
            self.rd.set_status(
                "cancelled", "cancelled on the node (reproduce cancel)", exit_code=code
            )
            raise Interrupted(f"the run was cancelled on the node (exit code {code}).")
        if not ok:
            stage = _failed_stage(self.timeline)
            message = _failed_stage_message(self.rd, self.timeline, code)
            detail = _check_detail(self.rd, stage)
            if detail:
                message = f"{detail}\n{message}"
            self.rd.set_status("failed", message.splitlines()[0], exit_code=code)
            if stage == TRAIN_STAGE and self.measure:
                self._measure()  # the figures so far and a "failed" verdict, kept in the run dir
            if stage in CHECK_STAGES:
                raise CheckFailed(message)
            raise InfraError(message)
        self.rd.set_status("done", "the node script finished; logs collected", exit_code=0)
        self.progress.say(f"node script finished; run dir {self.rd.path}")
        measurement = self._measure() if self.measure else None
        return Outcome("done", 0, self.rd.path, measurement)

    def _measure(self) -> Any:
        if self.recipe_raw is None:
            return None
        try:
            from launcher.measure import measure_run_dir
        except ImportError:
            return None
        measurement = measure_run_dir(self.rd.path, dict(self.recipe_raw))
        verdict = (
            measurement[1] if isinstance(measurement, tuple) and len(measurement) > 1 else None
        )
        if verdict is not None and hasattr(verdict, "status"):
            diff = getattr(verdict, "difference_percent", None)
            diff_text = f" ({diff:+.2f}% vs the claim)" if isinstance(diff, (int, float)) else ""
            self.progress.say(f"verdict: {verdict.status}{diff_text}")
            for reason in getattr(verdict, "reasons", []) or []:
                self.progress.say(f"  {reason}")
        return measurement


def execute(
    cluster: Cluster,
    *,
    node_script: str,
    run_id: str,
    node_run_dir: str,
    container: str,
    run_dir: RunDir,
    recipe_raw: Mapping[str, Any] | None = None,
    scripts_dir: Path | None = None,
    on_interrupt: str = "ask",
    poll_s: float = 1.0,
    reconnect_s: float = 60.0,
    console: Any = None,
    measure: bool = True,
    secrets: Mapping[str, str] | None = None,
    budget: Any = None,
) -> Outcome:
    """Run a Plan's node script on the cluster's node and bring everything back into `run_dir`.

    `secrets` (e.g. {"HF_TOKEN": ...}) go to the node only, as a 0600 `.secrets.env` that node.sh
    sources once and deletes; they are never written to the run dir or printed.

    Raises InfraError (exit 3) for connection and node failures, Interrupted (130) on Ctrl-C or
    SIGTERM; the cluster is released on every path except a deliberate detach or a lost connection
    (the run then goes on, and the message says how to reattach or cancel).
    """
    steps_total = None
    if recipe_raw:
        steps_total = (recipe_raw.get("result") or {}).get("steps_per_run")
    progress = Progress(console, steps_total)
    rd = run_dir
    rd.update_record(
        run_id=run_id,
        cluster=cluster_record(cluster),
        node_run_dir=node_run_dir.rstrip("/"),
        container=container,
        offset_source="size of logs/node.log",
        budget=(
            {
                "max_usd": budget.max_usd,
                "max_hours": budget.max_hours,
                "price_per_hour": budget.price_per_hour,
                "nodes": budget.nodes,
            }
            if budget is not None
            else None
        ),
    )
    if not (rd.path / "node.sh").exists():
        rd.write_text("node.sh", node_script)
    runner = Runner(
        rd,
        cluster,
        recipe_raw=recipe_raw,
        progress=progress,
        on_interrupt=on_interrupt,
        poll_s=poll_s,
        reconnect_s=reconnect_s,
        measure=measure,
        budget=budget,
    )
    if scripts_dir is None:
        scripts_dir = default_scripts_dir()
    launched = False
    try:
        with _sigterm_cancels():
            rd.set_status("acquiring")
            progress.say(f"acquiring a node ({getattr(cluster, 'name', 'cluster')})")
            # The clock starts when acquiring starts: a cloud bills from the launch, not from the moment
            # the node answers SSH, so GPU-hours and the budget count the boot too.
            acquire_started = time.time()
            nodes = cluster.acquire()
            runner.timeline.acquired_at = acquire_started
            rd.write_timeline(runner.timeline)
            node = nodes[0]
            rd.update_record(node=asdict(node), nodes=[asdict(n) for n in nodes])
            transport = cluster.transport(node)
            rd.set_status("staging")
            _stage_files(transport, node_run_dir, node_script, scripts_dir, secrets)
            launched = (
                True  # from here on an interrupt must cancel on the node (harmless if not started)
            )
            pid = _launch(transport, node_run_dir)
            rd.update_record(pid=pid, launched_at=time.time())
            progress.say(f"node script started on {node.name} (pid {pid}); run dir {rd.path}")
        return runner.follow(transport)
    except KeyboardInterrupt:
        # Interrupted before the script was launched (acquire/staging): nothing runs yet.
        if launched:
            runner.progress.say("cancelling the run on the node")
            runner._cancel_or_say(transport)
        rd.set_status("cancelled", "interrupted before the run started")
        raise Interrupted(
            "interrupted before the node script started; nothing was left running."
        ) from None
    except ReproduceError as err:
        if rd.status().get("state") not in FINAL_STATES + ("detached",):
            rd.set_status("failed", str(err).splitlines()[0])
        raise
    finally:
        original = sys.exc_info()[1]
        try:
            runner.release()
        except ReproduceError as failure:
            # The teardown's error (what is left, how to end it) is raised; why the run failed is printed.
            if original is not None and str(original) != str(failure):
                print(f"error: {original}", file=sys.stderr, flush=True)
            raise


def attach(
    ref: str,
    *,
    runs_root: Path | None = None,
    on_interrupt: str = "ask",
    poll_s: float = 1.0,
    reconnect_s: float = 60.0,
    console: Any = None,
    measure: bool = True,
) -> Outcome:
    """Reattach to a run in progress and continue exactly where collection stopped."""
    rd = RunDir.find(ref, runs_root)
    record = rd.record()
    state = rd.status().get("state")
    if state in FINAL_STATES:
        raise BadInput(f"run {rd.path} has already ended ({state}); nothing to attach to.")
    if "node" not in record or "cluster" not in record:
        raise BadInput(f"run {rd.path} never reached a node (state {state}); nothing to attach to.")
    recipe_raw = _recipe_raw(rd)
    steps_total = (recipe_raw or {}).get("result", {}).get("steps_per_run") if recipe_raw else None
    progress = Progress(console, steps_total)
    cluster = cluster_from_record(record["cluster"])
    transport = cluster.transport(Node(**record["node"]))
    budget = None
    if record.get("budget"):  # the limits the run was started with still hold after a reattach
        from launcher.budget import Budget

        budget = Budget(**record["budget"])
    runner = Runner(
        rd,
        cluster,
        recipe_raw=recipe_raw,
        progress=progress,
        on_interrupt=on_interrupt,
        poll_s=poll_s,
        reconnect_s=reconnect_s,
        measure=measure,
        budget=budget,
    )
    progress.say(
        f"reattaching to {rd.path} at byte {(rd.logs / 'node.log').stat().st_size if (rd.logs / 'node.log').exists() else 0}"
    )
    try:
        return runner.follow(transport)
    finally:
        runner.release()


def cancel(ref: str, *, runs_root: Path | None = None, console: Any = None) -> RunDir:
    """Stop a run's process group and container on its node, collect what it printed, release."""
    rd = RunDir.find(ref, runs_root)
    record = rd.record()
    if "node" not in record or "cluster" not in record:
        rd.set_status("cancelled", "cancelled before it reached a node")
        return rd
    progress = Progress(console)
    cluster = cluster_from_record(record["cluster"])
    transport = cluster.transport(Node(**record["node"]))
    runner = Runner(rd, cluster, recipe_raw=None, progress=progress, measure=False)
    try:
        runner._cancel_on_node(transport)
    except InfraError:
        runner.release()  # the node cannot be reached or cleaned: still end what was acquired (AWS: terminate)
        raise
    progress.say(
        f"stopped the run's processes and container {runner.container} on {record['node']['name']}"
    )
    try:
        with _follow_lock(rd):
            try:
                follower = runner._follower(transport)
                follower.splitter.rebuild()
                runner._safe_drain(follower)
                follower.finish_logs("cancelled")
                rd.set_status("cancelled", "cancelled with `reproduce cancel`")
            finally:
                runner.release()
    except BadInput:
        # A live follower holds the run: it sees the run end, collects and releases itself.
        progress.say("the launcher following this run will collect its logs and release the node")
    return rd


def _recipe_raw(rd: RunDir) -> dict | None:
    path = rd.path / "recipe.yaml"
    if not path.exists():
        return None
    data = yaml.safe_load(path.read_text())
    return data if isinstance(data, dict) else None
