"""A run as a job on an existing Ray cluster, through its job server (the Ray Jobs API).

`RayJobExecution` is the runner's `Execution` (launcher/clusters/execution.py) for `kind: ray`: the
launcher has no shell on the cluster's nodes, so where the node protocol stages files, starts a
detached wrapper and reads node.log by offset, this submits node.sh as a job
(`JobSubmissionClient.submit_job`, its working_dir carrying node.sh and the launcher's node
programs), follows the job's log, asks the job's status, stops the job (`stop_job`) and reads the
result files from the block node.sh prints at its end. The cluster itself is never stopped: it is
not ours.

The job server has no byte offsets, so they are counted here. While the job runs, its log is
followed over the server's websocket (`tail_job_logs`, in a thread): new text only, whatever the
log's size; a reader that starts at offset N (an attach) skips the first N bytes of it. Once the job
has ended, the whole log is read once more (`get_job_logs`) and is the authority for the rest, so
nothing the tail missed is lost. Text is counted as UTF-8, the way both reads return it.

Secrets never travel to a Ray cluster: a submission (its runtime env included) is readable by
everyone who can reach the dashboard. A cluster that needs HF_TOKEN gets it from its own
environment. See docs/architecture.md ("Running on an existing Ray cluster").
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from launcher.clusters.base import Node
from launcher.errors import InfraError
from launcher.plan.protocol import RESULTS_BEGIN, RESULTS_END, parse_collect
from launcher.records.rundir import Files

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

    from launcher.clusters.execution import Place

T = TypeVar("T")

NODE_SCRIPT = Files.NODE_SCRIPT
# The job's states (ray.job_submission.JobStatus values): still going, or how it ended.
GOING = ("PENDING", "RUNNING")
STOPPED = "STOPPED"
TAIL_TRIES = 3


def parse_results(log: str) -> tuple[dict[str, bytes], list[str]]:
    """The last complete results block of a job's log, as protocol.parse_collect reads it."""
    end = log.rfind(f"\n{RESULTS_END}")
    begin = log.rfind(f"{RESULTS_BEGIN}\n", 0, end) if end >= 0 else -1
    if begin < 0:
        return {}, []
    return parse_collect(log[begin + len(RESULTS_BEGIN) + 1 : end + 1])


def client(address: str) -> JobSubmissionClient:
    """A Jobs API client for the job server at `address`; InfraError when it does not answer."""
    _ray_client_ready()
    from ray.job_submission import JobSubmissionClient

    return _call(address, "connect to", lambda: JobSubmissionClient(address))


def _ray_client_ready() -> None:
    """Ray's client is importable (an optional extra), and its own INFO lines (package uploads)
    stay off the user's terminal: the runner reports what happens."""
    import logging

    try:
        import ray.job_submission  # noqa: F401 - only whether it is there
    except ImportError as err:
        raise InfraError(
            f"profiles of kind ray need the Ray job client on this machine ({err}); "
            "install it with `pip install 'reproduce[ray]'`"
        ) from err
    logging.getLogger("ray").setLevel(logging.WARNING)


def _call(address: str, what: str, action: Callable[[], T]) -> T:
    """One Jobs API request; any failure of it is the job server's, said as such (InfraError:
    the runner retries within its reconnect window)."""
    try:
        return action()
    except InfraError:
        raise
    except Exception as err:  # noqa: BLE001 - requests, aiohttp and RuntimeError all mean "no answer"
        text = str(err).strip().splitlines()
        raise InfraError(
            f"Ray job server {address}: could not {what}: "
            f"{type(err).__name__}: {text[-1] if text else ''}"
        ) from err


class _Tail:
    """The job's log over the job server's websocket, in a thread, from byte `skip` on."""

    def __init__(self, job_client: JobSubmissionClient, submission_id: str, skip: int) -> None:
        self.start = skip  # the log offset of data[0]
        self.data = bytearray()
        self.error: BaseException | None = None
        self.done = False
        self._lock = threading.Lock()
        self._skip = skip
        self._client = job_client
        self._id = submission_id
        self._thread = threading.Thread(target=self._run, name=f"tail {submission_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import asyncio

        async def follow() -> None:
            async for text in self._client.tail_job_logs(self._id):
                chunk = text.encode()
                with self._lock:
                    if self._skip:
                        cut = min(self._skip, len(chunk))
                        chunk, self._skip = chunk[cut:], self._skip - cut
                    self.data += chunk

        try:
            asyncio.run(follow())
        except BaseException as err:  # noqa: BLE001 - kept for the reader, who falls back
            self.error = err
        finally:
            self.done = True

    def read(self, offset: int, max_bytes: int) -> bytes | None:
        """Bytes from `offset`, dropping what was read before it; None when this tail cannot say
        (it failed, or the offset is not where it is)."""
        with self._lock:
            if self.error is not None or not self.start <= offset <= self.start + len(self.data):
                return None
            if self._skip:  # still passing over what the reader has already
                return b""
            del self.data[: offset - self.start]
            self.start = offset
            return bytes(self.data[:max_bytes])


class RayJobExecution:
    """One run as one Ray job (see the module docstring); `request` is what `launch` submits
    (None for a run found again from run.json: it is followed, stopped and collected only)."""

    def __init__(
        self, node: Node, place: Place, address: str, request: Mapping[str, Any] | None = None
    ) -> None:
        self.node = node
        self.place = place
        self.address = address
        self.request = request
        self.submission_id = str(node.meta.get("submission_id") or job_id(place.run_id))
        self._client: JobSubmissionClient | None = None
        self._tail: _Tail | None = None
        self._final: bytes | None = None  # the whole log, once the job has ended
        self._status: str | None = None
        self._workdir: Path | None = None
        self._tail_failures = 0  # a job server behind a proxy without websockets: full reads

    def _jobs(self) -> JobSubmissionClient:
        if self._client is None:
            self._client = client(self.address)
        return self._client

    def _ask(self, what: str, action: Callable[[], T]) -> T:
        return _call(self.address, what, action)

    # --- starting ------------------------------------------------------------------------------

    def stage(
        self, node_script: str, scripts_dir: Path | None, secrets: Mapping[str, str] | None
    ) -> None:
        """The job's working_dir, here: the node programs, and node.sh beside them (the Ray client
        uploads it at submission; every node of the job gets it, on its PYTHONPATH)."""
        self.discard_secrets()
        workdir = Path(tempfile.mkdtemp(prefix="reproduce-job-"))
        if scripts_dir is not None and scripts_dir.is_dir():
            for path in sorted(scripts_dir.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    dest = workdir / path.relative_to(scripts_dir)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, dest)
        (workdir / NODE_SCRIPT).write_text(node_script, encoding="utf-8")
        self._workdir = workdir

    def discard_secrets(self) -> None:
        """Nothing to discard: secrets are never sent to a Ray cluster (module docstring)."""
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def launch(self, env: Mapping[str, str]) -> str:
        if self.request is None or self._workdir is None:
            raise InfraError(f"Ray job {self.submission_id}: nothing staged to submit")
        request = dict(self.request)
        runtime_env = dict(request.pop("runtime_env"))
        runtime_env["working_dir"] = str(self._workdir)
        if env:
            runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **env}
        jobs = self._jobs()
        try:
            submitted = self._ask(
                "submit the job", lambda: jobs.submit_job(runtime_env=runtime_env, **request)
            )
        finally:
            self.discard_secrets()  # uploaded (or refused): the local copy has served
        return str(submitted)

    # --- following -----------------------------------------------------------------------------

    def poll(self) -> tuple[str, int | None]:
        jobs = self._jobs()
        info = self._ask("read the job's status", lambda: jobs.get_job_info(self.submission_id))
        status = str(getattr(info.status, "value", info.status))
        self._status = status
        if status in GOING:
            return "alive", None
        code = getattr(info, "driver_exit_code", None)
        if code is None and status == "SUCCEEDED":
            code = 0
        return ("exit", int(code)) if code is not None else ("gone", None)

    def read_log(self, offset: int, max_bytes: int) -> bytes:
        if self._status is not None and self._status not in GOING:
            if self._final is None:
                jobs = self._jobs()
                text = self._ask(
                    "read the job's log", lambda: jobs.get_job_logs(self.submission_id)
                )
                self._final = str(text).encode()
            return self._final[offset : offset + max_bytes]
        if self._tail is None and self._tail_failures < TAIL_TRIES:
            self._tail = _Tail(self._jobs(), self.submission_id, offset)
        data = self._tail.read(offset, max_bytes) if self._tail is not None else None
        if data is None:  # the tail cannot say where this offset is: read it all this once
            if self._tail is not None and self._tail.error is not None:
                self._tail_failures += 1
            self._tail = None
            jobs = self._jobs()
            text = self._ask("read the job's log", lambda: jobs.get_job_logs(self.submission_id))
            return str(text).encode()[offset : offset + max_bytes]
        return data

    # --- stopping and the end ------------------------------------------------------------------

    def cancel(self, timeout_s: float) -> str:
        """stop_job (Ray sends SIGTERM to the job's processes, then SIGKILL; its tasks and actors
        end with its driver), then wait for the job to say it ended. Never the cluster."""
        import time

        jobs = self._jobs()
        self._ask("stop the job", lambda: jobs.stop_job(self.submission_id))
        deadline = time.monotonic() + timeout_s
        while True:
            state, _ = self.poll()
            if state != "alive":
                return ""
            if time.monotonic() >= deadline:
                return f"Ray job {self.submission_id} (still {self._status})"
            time.sleep(0.5)

    def was_cancelled(self) -> bool:
        if self._status is None:
            self.poll()
        return self._status == STOPPED

    def heartbeat(self) -> None:
        """The cluster is not ours and never ends itself: nothing waits for a follower."""

    def end(self) -> None:
        """Nothing serves this job but the cluster, which stays."""

    def cleanup(self) -> None:
        """Ray removes the job's processes, tasks and actors with it; nothing else was made."""

    def collect(self) -> tuple[dict[str, bytes], list[str]]:
        if self._final is None:
            jobs = self._jobs()
            text = self._ask("read the job's log", lambda: jobs.get_job_logs(self.submission_id))
            self._final = str(text).encode()
        return parse_results(self._final.decode(errors="replace"))

    def close(self) -> None:
        self._client = None
        self._tail = None


def job_id(run_id: str) -> str:
    """The job's submission id: the run's, so `ray job status reproduce-<run id>` finds it."""
    return f"reproduce-{run_id}"


def cluster_nodes(address: str) -> list[dict[str, Any]]:
    """The cluster's nodes as its job server lists them (Ray's State API): id, address, state
    (ALIVE or DEAD), Ray's reason for a death, GPUs."""
    _ray_client_ready()
    from ray.util.state import list_nodes

    nodes = _call(
        address,
        "list the cluster's nodes",
        lambda: list_nodes(
            address=address, detail=True, limit=10_000, timeout=30, raise_on_missing_output=False
        ),
    )
    return [
        {
            "node_id": str(n.node_id),
            "ip": str(n.node_ip),
            "state": str(getattr(n.state, "value", n.state)),
            "state_message": n.state_message,
            "gpus": float((n.resources_total or {}).get("GPU", 0)),
        }
        for n in nodes
    ]
