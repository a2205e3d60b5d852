"""Following a launched node: its log streamed by byte offset into the run dir, its state polled.

The offset that streaming continues from is the size of the local logs/node.log itself, so the
local log and the offset can never disagree, whatever moment the launcher died at. Stage logs and
the timeline's stages are pure functions of node.log and are rebuilt from it on attach.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from launcher.clusters.execution import Execution
from launcher.errors import BadInput, InfraError
from launcher.judge.parse.miles import last_step
from launcher.judge.parse.shapes import last_step_time
from launcher.plan.markers import MAX_MARKER_LINE, SAFE_STAGE, MarkerGate
from launcher.plan.protocol import HEARTBEAT_S, progress_in
from launcher.records.rundir import MAX_STAGES, TRAIN_STAGE, RunDir, RunDirUnwritable, Timeline
from launcher.runner.reporter import Reporter
from launcher.runner.signals import raise_pending

READ_CHUNK = 1 << 20
# A drain while the run goes on reads at most this many times (the next poll goes on from there).
MAX_DRAIN_READS = 64
# The console is shown whole lines only; a line longer than this is nothing it shows (not kept).
MAX_SHOWN_LINE = 1 << 16
T = TypeVar("T")


class LogSplitter:
    """Appends node output to logs/node.log and splits complete lines into logs/<stage>.log.

    A line belongs to the innermost stage open when it was printed; marker lines are kept in
    node.log only. Lines outside any stage are only in node.log. Every byte is looked at once: a
    line without its newline yet is held only while it could still be a marker (MAX_MARKER_LINE),
    then written on to its stage as it grows.
    """

    def __init__(
        self,
        logs: Path,
        timeline: Timeline,
        on_marker: Callable[[dict[str, str]], Any] | None = None,
    ) -> None:
        self.logs = logs
        self.timeline = timeline
        self.on_marker = on_marker
        self.open_stages: list[str] = []
        self._partial = bytearray()  # the start of a line that may still be a marker
        self._spilling = False  # the current line is too long to be a marker: written as it comes
        self._handles: dict[str, IO[bytes]] = {}
        self._gate = MarkerGate()  # which marker lines are node.sh's (protocol.py says why)

    @property
    def node_log(self) -> Path:
        return self.logs / "node.log"

    def offset(self) -> int:
        return self.node_log.stat().st_size if self.node_log.exists() else 0

    def rebuild(self) -> None:
        """Re-derive the stage logs and the timeline's stages from node.log (used on attach)."""
        self.close()
        for old in self.logs.glob("*.log"):
            if old.name != "node.log":
                old.unlink()
        (self.logs / f"{TRAIN_STAGE}.log").touch()
        self.timeline.stages = []
        self.open_stages = []
        self._partial = bytearray()
        self._spilling = False
        self._gate = MarkerGate()
        if self.node_log.exists():
            with open(self.node_log, "rb") as fh:
                for chunk in iter(lambda: fh.read(READ_CHUNK), b""):
                    self._split(chunk, replay=True)

    def append(self, data: bytes) -> None:
        """New bytes from the node: first to node.log (the offset), then to the stage logs."""
        if not data:
            return
        with open(self.node_log, "ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        self._split(data, replay=False)

    def _split(self, data: bytes, *, replay: bool) -> None:
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._hold(data[start:])
                return
            if self._spilling:  # the end of a long line: its stage was decided when it began
                self._write_open(data[start : end + 1])
                self._spilling = False
            elif self._partial:
                self._partial += data[start : end + 1]
                line, self._partial = bytes(self._partial), bytearray()
                self._line(line, replay)
            else:
                self._line(data[start : end + 1], replay)
            start = end + 1

    def _hold(self, tail: bytes) -> None:
        """The unterminated end of a chunk: held while it could be a marker, else written on."""
        if not tail:
            return
        if self._spilling:
            self._write_open(tail)
            return
        self._partial += tail
        if len(self._partial) > MAX_MARKER_LINE:
            self._write_open(bytes(self._partial))
            self._partial = bytearray()
            self._spilling = True

    def _write_open(self, data: bytes) -> None:
        if self.open_stages:
            self._stage_handle(self.open_stages[-1]).write(data)

    def _line(self, line: bytes, replay: bool) -> None:
        marker = self._gate.marker(line.rstrip(b"\n")) if len(line) <= MAX_MARKER_LINE else None
        if marker is None:
            if self.open_stages:
                self._stage_handle(self.open_stages[-1]).write(line)
            return
        name = marker["stage"]
        if not SAFE_STAGE.match(name):
            return
        self.timeline.on_marker(marker)
        if marker["event"] == "start":
            if len(self.open_stages) < MAX_STAGES:  # a flood of starts: bounded, like the timeline
                self.open_stages.append(name)
        elif name in self.open_stages:
            del self.open_stages[len(self.open_stages) - 1 - self.open_stages[::-1].index(name)]
        if self.on_marker is not None and not replay:
            self.on_marker(marker)

    def _stage_handle(self, name: str) -> IO[bytes]:
        if name not in self._handles:
            self._handles[name] = open(self.logs / f"{name}.log", "ab")
        return self._handles[name]

    def flush_partial(self) -> None:
        """At the very end a last line without a newline still belongs to its stage."""
        if self._partial:
            self._write_open(bytes(self._partial))
        self._partial = bytearray()
        self._spilling = False
        self.flush()

    def flush(self) -> None:
        for handle in self._handles.values():
            handle.flush()

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles = {}


@contextmanager
def follow_lock(rd: RunDir) -> Iterator[None]:
    """One follower per run dir: two would both append to node.log and double it."""
    with open(rd.path / ".follow.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInput(
                f"run {rd.path} is being followed by another reproduce process right now"
            ) from None
        yield


@dataclass(frozen=True)
class Ended:
    """The node script ended; `code` is None when it vanished without writing one."""

    code: int | None


class Follower:
    """One node's log streamed into a logs dir; its script polled until it ends."""

    def __init__(
        self,
        execution: Execution,
        logs: Path,
        *,
        timeline: Timeline,
        reporter: Reporter,
        on_marker: Callable[[dict[str, str]], Any] | None = None,
        steps_total: int | None = None,
        poll_s: float = 1.0,
        reconnect_s: float = 60.0,
        while_reconnecting: Callable[[], Any] | None = None,
    ) -> None:
        self.execution = execution
        self.while_reconnecting = while_reconnecting  # e.g. the budget check: it may raise
        self.timeline = timeline
        self.reporter = reporter
        self.steps_total = steps_total
        self.poll_s = poll_s
        self.reconnect_s = reconnect_s
        self.last_step: int | None = None
        self._beat_at = float("-inf")
        self._shown_carry = b""  # the start of a line the console has not seen whole yet
        logs.mkdir(parents=True, exist_ok=True)
        self.splitter = LogSplitter(logs, timeline, on_marker=on_marker)

    def _on_data(self, data: bytes) -> None:
        """What the console is shown comes from whole lines only: a read may end anywhere, and a
        step time cut after its first digit would show a speed ten times too high."""
        chunk = self._shown_carry + data
        cut = chunk.rfind(b"\n") + 1
        # the cut line waits for its end (bounded: a line that long is nothing the console shows)
        self._shown_carry = chunk[cut:] if len(chunk) - cut <= MAX_SHOWN_LINE else b""
        if cut:
            self._show(chunk[:cut])

    def _show(self, chunk: bytes) -> None:
        for progress in progress_in(chunk):  # a long stage's transfer (protocol.Progress)
            self.reporter.progress(progress)
        timed = last_step_time(chunk)  # the current speed, shown with the step
        if timed is not None:
            self.reporter.step_time(*timed)
        step = last_step(chunk)
        if step is not None and step != self.last_step:
            self.last_step = step
            self.reporter.step(step + 1, self.steps_total)

    def drain(self, *, to_end: bool = False) -> int:
        """Copy every byte the node has that we do not; returns how many.

        Only an empty read is the end: a transport may return fewer bytes than asked while more
        are there (an SFTP read cut short, a job server's tail), and after the script ended
        (`to_end`) a short read taken for the end would lose the log's last lines. While the run
        goes on, one drain stops after MAX_DRAIN_READS reads so a fast writer cannot hold the
        loop (the next poll goes on from the offset).
        """
        total = reads = 0
        while to_end or reads < MAX_DRAIN_READS:
            self.beat()
            data = self.execution.read_log(self.splitter.offset(), READ_CHUNK)
            reads += 1
            if not data:
                break
            self._keep(data)
            self._on_data(data)
            total += len(data)
        self._keep(b"")
        return total

    def beat(self) -> None:
        """Tell the node a follower is reading it (every HEARTBEAT_S at most): an aws node that
        ends itself after the run counts its grace from the last beat, so a long catch-up read
        after an attach is never cut by the node powering off."""
        now = time.monotonic()
        if now - self._beat_at >= HEARTBEAT_S:
            self._beat_at = now
            self.execution.heartbeat()

    def drain_to_end(self) -> int:
        """After the script ended: every byte node.log will ever have."""
        return self.drain(to_end=True)

    def _keep(self, data: bytes) -> None:
        """Bytes from the node into the run dir; a local write that fails is the launcher's disk,
        never the connection (RunDirUnwritable is not retried as a reconnect)."""
        try:
            self.splitter.append(data)
            self.splitter.flush()
        except OSError as err:
            raise RunDirUnwritable(
                f"cannot write {self.splitter.logs}: {err.strerror or err}"
                + (" (the launcher's disk is full)" if err.errno == errno.ENOSPC else "")
            ) from err

    def drain_quietly(self) -> None:
        """Drain what can still be drained; at the end of a cancel a lost node changes nothing."""
        try:
            self.drain(to_end=True)
        except (InfraError, OSError, EOFError):
            pass

    def poll(self) -> tuple[str, int | None]:
        return self.execution.poll()

    def with_reconnect(self, action: Callable[[], T]) -> T:
        """Retry a node operation while the connection comes back, up to reconnect_s.

        Between tries `while_reconnecting` runs (the budget check), so a node that cannot be
        reached still stops at the budget. A failure to write the run dir is not retried.
        """
        deadline = time.monotonic() + self.reconnect_s
        warned = False
        while True:
            try:
                return action()
            except RunDirUnwritable:
                raise
            except (InfraError, OSError, EOFError) as err:
                if self.while_reconnecting is not None:
                    self.while_reconnecting()
                if time.monotonic() >= deadline:
                    raise InfraError(
                        f"lost the connection to the node and could not reconnect: {err}"
                    ) from err
                if not warned:
                    self.reporter.say(
                        f"connection problem ({err}); reconnecting (up to {self.reconnect_s:.0f} s)"
                    )
                    warned = True
                self.execution.close()
                raise_pending()  # a Ctrl-C while the node does not answer is never lost
                time.sleep(min(2.0, max(0.2, self.poll_s)))

    def check(self) -> Ended | None:
        """Bring the log up to date and ask the node: Ended when its script ended, else None."""
        self.with_reconnect(self.drain)
        state, code = self.with_reconnect(self.poll)
        if state == "alive":
            return None
        self.with_reconnect(self.drain_to_end)
        if state == "gone":
            state, code = self.with_reconnect(self.poll)  # it may have just finished
            if state == "exit":
                self.with_reconnect(self.drain_to_end)
        return Ended(code if state == "exit" else None)

    def finish_logs(self, stage_status: str) -> None:
        """The end of following: the last partial line kept, open stages closed as given."""
        self.splitter.flush_partial()
        self.splitter.close()
        self.timeline.close_open(stage_status)
