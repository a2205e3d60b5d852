"""A run's log read without taking the run over: `reproduce logs`, and `status` of a detached run.

Why not `attach`: attach takes the run's follow lock, appends to its run directory and releases
the node at the end. A person who only wants to look must not change the record or who owns the
run. So this reads the run directory's copy (logs/node.log, or node K's logs/node-K/node.log) and,
while the run is not over, the rest from the node itself, from the byte where the local copy ends,
through the cluster's own transport (the node protocol's `read_log`, by offset): nothing is
written to the run directory, no lock is taken, nothing is released. The local copy plus the
node's bytes from its size on are the node's log byte for byte, because the follower only ever
appends what the node wrote at that offset (docs/architecture.md, "The node protocol").

A stage's lines (`--stage NAME`) are those printed while NAME was the innermost open stage, the
rule of the runner's splitter (launcher/runner/stream.py); the markers themselves are not shown.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors import BadInput, InfraError
from launcher.excerpt import open_regular
from launcher.plan.markers import MAX_MARKER_LINE, SAFE_STAGE, MarkerGate
from launcher.records.rundir import FINAL_STATES, MAX_STAGES, Files, RunDir

if TYPE_CHECKING:
    from launcher.clusters.execution import Execution

CHUNK = 1 << 20
RECONNECT_S = 60.0  # how long --follow keeps trying a node it lost before it gives up


def recorded_nodes(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes run.json keeps, node 0 first (a run recorded before node lists: its one node)."""
    nodes = record.get("nodes") or ([record["node"]] if record.get("node") else [])
    return [n for n in nodes if isinstance(n, dict)]


def local_logs(rd: RunDir, index: int) -> Path:
    """Where the run directory keeps node `index`'s logs (node 0's are the run's)."""
    return rd.logs if index == 0 else rd.logs / f"node-{index}"


def check_node(rd: RunDir, index: int) -> None:
    """BadInput unless node `index` is one this run has."""
    count = len(recorded_nodes(rd.record())) or 1
    if not 0 <= index < count:
        raise BadInput(
            f"--node {index}: run {rd.path.name} has {count} node(s), numbered 0 to {count - 1}."
        )


def is_live(rd: RunDir) -> bool:
    """Could the node still have bytes the run directory lacks? (Not over, and it reached one.)"""
    record = rd.record()
    state = rd.status().get("state")
    return state not in FINAL_STATES and bool(recorded_nodes(record)) and "cluster" in record


def open_execution(rd: RunDir, index: int) -> Execution:
    """The node protocol to node `index` of a recorded run, as attach builds it, but only to
    read: the caller never stages, cancels or releases through it."""
    from launcher import clusters
    from launcher.clusters.base import Node
    from launcher.clusters.contract import execution_for
    from launcher.runner.nodes import place_of

    record = rd.record()
    nodes = [Node(**n) for n in recorded_nodes(record)]
    cluster = clusters.from_record(record["cluster"], rd.path)
    place = place_of(
        nodes[index],
        index,
        len(nodes),
        str(record.get("run_id") or rd.path.name),
        str(record["node_run_dir"]),
        str(record["container"]),
    )
    return execution_for(cluster, nodes[index], place)


@dataclass
class StageFilter:
    """The lines of one stage out of node.log bytes, fed in any pieces (the splitter's rule).

    Bounded like the splitter (launcher/runner/stream.py): a line without its newline yet is held
    only while it could still be a marker (MAX_MARKER_LINE); a longer one is passed on (or
    dropped) as it arrives, its stage decided when it began. So a line of 256 MiB costs linear
    time and at most one piece of memory, never the whole line again for every piece."""

    stage: str
    open_stages: list[str] = field(default_factory=list)
    gate: MarkerGate = field(default_factory=MarkerGate)
    last_started: str | None = None
    _partial: bytearray = field(default_factory=bytearray, init=False)
    # the current line is too long to be a marker: passed on as it comes
    _spilling: bool = field(default=False, init=False)

    def _ours(self) -> bool:
        return bool(self.open_stages) and self.open_stages[-1] == self.stage

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._hold(data[start:], out)
                return bytes(out)
            piece = data[start : end + 1]
            start = end + 1
            if self._spilling:  # the end of a long line: its stage was decided when it began
                self._spilling = False
                if self._ours():
                    out += piece
                continue
            if self._partial:
                self._partial += piece
                line, self._partial = bytes(self._partial), bytearray()
            else:
                line = piece
            self._line(line, out)

    def _hold(self, tail: bytes, out: bytearray) -> None:
        if not tail:
            return
        if self._spilling:
            if self._ours():
                out += tail
            return
        self._partial += tail
        if len(self._partial) > MAX_MARKER_LINE:
            if self._ours():
                out += self._partial
            self._partial = bytearray()
            self._spilling = True

    def _line(self, line: bytes, out: bytearray) -> None:
        marker = self.gate.marker(line[:-1]) if len(line) <= MAX_MARKER_LINE else None
        if marker is None:
            if self._ours():
                out += line
            return
        name = marker["stage"]
        if not SAFE_STAGE.match(name):
            return
        if marker["event"] == "start":
            if len(self.open_stages) < MAX_STAGES:  # the splitter's cap (a flood of starts)
                self.open_stages.append(name)
            self.last_started = name
        elif name in self.open_stages:
            at = len(self.open_stages) - 1 - self.open_stages[::-1].index(name)
            del self.open_stages[at]

    def skip(self) -> None:
        """Bytes were left out here: what follows is the middle of a line until its newline."""
        self._partial = bytearray()
        self._spilling = True

    def finish(self) -> bytes:
        """A last line without its newline, when the log ends there."""
        rest, self._partial = bytes(self._partial), bytearray()
        if rest and not self._spilling and self._ours():
            return rest
        return b""


def check_stage(name: str) -> None:
    if not SAFE_STAGE.match(name):
        raise BadInput(
            f"--stage {name!r}: expected a stage name (letters, digits, '.', '_', '-'), e.g. "
            "image, assets, train."
        )


def read_local(path: Path) -> Iterator[bytes]:
    """A file of the run directory in chunks (a log may be gigabytes); nothing when it is
    missing, BadInput naming it when it is not a regular file (a FIFO would block, a link
    points anywhere: the run directory is anyone's)."""
    try:
        fh = open_regular(path)
    except FileNotFoundError:
        return
    except OSError as err:
        raise BadInput(f"{path} is not a log the run directory holds: {err.strerror}.") from None
    with fh:
        yield from iter(lambda: fh.read(CHUNK), b"")


def read_node(
    execution: Execution,
    offset: int,
    *,
    follow: bool = False,
    poll_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[bytes]:
    """The node's log from byte `offset`: what is there now, or (`follow`) on until the run ends
    there, a lost connection retried for RECONNECT_S. InfraError when the node cannot be read."""
    lost_since: float | None = None
    while True:
        try:
            data = execution.read_log(offset, CHUNK)
            if data:
                offset += len(data)
                lost_since = None
                yield data
                continue
            if not follow:
                return
            state, _code = execution.poll()
            lost_since = None
            if state != "alive":
                # the end: what it printed after the last read, then stop
                while data := execution.read_log(offset, CHUNK):
                    offset += len(data)
                    yield data
                return
        except (InfraError, OSError, EOFError) as err:
            if not follow:
                raise _unreadable(err) from err
            now = time.monotonic()
            lost_since = now if lost_since is None else lost_since
            if now - lost_since > RECONNECT_S:
                raise _unreadable(err) from err
            close_quietly(execution)
        sleep(poll_s)


def close_quietly(execution: Execution) -> None:
    """Drop the connection; closing a broken one must not fail."""
    with contextlib.suppress(Exception):
        execution.close()


def _unreadable(err: BaseException) -> InfraError:
    return InfraError(f"cannot read the log on the node: {err}")


@dataclass(frozen=True)
class NodeProgress:
    step: int | None  # optimizer steps done, as the node's log has them now
    stage: str | None  # the innermost stage open there now
    new_bytes: int  # how much the node had beyond the run directory's copy
    skipped: int = 0  # of those, how many were not read (between the scan and the tail)


# `status` reads at most this much of the node's new log from where the run directory's copy
# ends (its stage markers), then only its last TAIL_BYTES (the step): a detached run's log may
# have grown by gigabytes, and status must cost bounded bytes, memory and time whatever its size.
SCAN_BYTES = 4 << 20
TAIL_BYTES = 1 << 20


def node_progress(
    rd: RunDir, max_bytes: int = TAIL_BYTES, scan_bytes: int = SCAN_BYTES
) -> NodeProgress:
    """Where a run nobody follows is, from its node's log as it is now: the run directory's copy
    plus what the node has beyond it (read, never appended). Bounded: the first `scan_bytes`
    of the node's new bytes are read for stage markers, then, when there is more, only the last
    `max_bytes` (found by probing single bytes, never by reading what lies between), so memory and
    bytes read stay under scan_bytes + max_bytes + one chunk whatever the log's size. InfraError
    when the node cannot be read; BadInput when the run's record cannot reach it."""
    from launcher.judge.parse.lines import last_step
    from launcher.judge.timeline import RunTimeline
    from launcher.records.runs import current_stage

    path = local_logs(rd, 0) / "node.log"
    written = rd.read_json(Files.TIMELINE, {})
    timeline = RunTimeline.of(written if isinstance(written, dict) else {})
    running = [str(s.name) for s in timeline.stages if s.status == "running"]
    # the nonce is on node.log's first line; where the follower left the container's stages
    # is in the timeline it built
    stage_filter = StageFilter("", running, gate=MarkerGate.of_log(path))
    stage_filter.gate.resume(timeline.stages)
    size = path.stat().st_size if path.exists() else 0
    tail = bytearray()
    offset, skipped = size, 0
    execution = open_execution(rd, 0)
    try:
        for data in _read_upto(execution, offset, scan_bytes):
            offset += len(data)
            stage_filter.feed(data)
            tail = (tail + data)[-max_bytes:]
        if offset - size >= scan_bytes:  # more may follow: only its end is read
            end = _end_of(execution, offset)
            start = max(offset, end - max_bytes)
            skipped = start - offset
            if skipped:
                stage_filter.skip()
                tail = bytearray()
            offset = start
            for data in _read_upto(execution, offset, max_bytes + CHUNK):
                offset += len(data)
                stage_filter.feed(data)
                tail = (tail + data)[-max_bytes:]
    finally:
        close_quietly(execution)
    new_bytes = offset - size
    if len(tail) < max_bytes and not skipped:
        try:
            with open_regular(path) as fh:
                fh.seek(max(0, size - (max_bytes - len(tail))))
                tail = bytearray(fh.read(max_bytes - len(tail))) + tail
        except OSError:
            pass
    last = last_step(bytes(tail))
    open_stages = stage_filter.open_stages
    stage = open_stages[-1] if open_stages else stage_filter.last_started
    stage = stage or current_stage(timeline)
    return NodeProgress(last + 1 if last is not None else None, stage, new_bytes, skipped)


def _read_upto(execution: Execution, offset: int, limit: int) -> Iterator[bytes]:
    """The node's log from `offset`, in chunks, at most `limit` bytes; InfraError when the node
    cannot be read."""
    done = 0
    try:
        while done < limit:
            data = execution.read_log(offset + done, min(CHUNK, limit - done))
            if not data:
                return
            done += len(data)
            yield data
    except (InfraError, OSError, EOFError) as err:
        raise _unreadable(err) from err


def _end_of(execution: Execution, known: int) -> int:
    """The size of the node's log, known to be at least `known`: found by reading one byte at
    offsets growing twice as far each time, then halving the gap (about 2 log2(size / 1 MiB)
    reads of one byte), never by reading what lies between."""
    try:
        low, step = known, CHUNK  # the size is at least `low`
        while execution.read_log(low + step - 1, 1):
            low, step = low + step, step * 2
        high = low + step - 1  # and at most `high`
        while low < high:
            mid = (low + high + 1) // 2
            if execution.read_log(mid - 1, 1):
                low = mid
            else:
                high = mid - 1
        return low
    except (InfraError, OSError, EOFError) as err:
        raise _unreadable(err) from err
