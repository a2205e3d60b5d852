"""No byte of node.log is lost, doubled or misplaced on its way to the run directory (issue 22).

The follower reads the node's node.log by byte offset, in whatever pieces the transport returns,
while the node writes it at its own pace. Whatever the pieces: logs/node.log is the node's file
byte for byte, each stage's log is exactly the lines printed inside it (a reference split of the
whole file, written here independently), and what the console is shown (the step, its speed, the
progress of a transfer) comes from whole lines only. Adversaries: a cut at every offset of a log
holding markers, progress lines, step lines, multi-byte UTF-8, CRLF and an over-long line; reads
that return short, at random; a writer that is slow, cutting lines and characters; the last
bytes written just before exit_code appears.
"""

from __future__ import annotations

import random
import subprocess
import threading
import time
from pathlib import Path

import pytest
from support.stream import Seen, follower

from launcher.clusters.base import Node
from launcher.clusters.execution import Place
from launcher.clusters.local import LocalTransport
from launcher.plan import protocol
from launcher.plan.protocol import Progress
from launcher.records.rundir import Timeline
from launcher.runner import stream
from launcher.runner.stream import LogSplitter

ACTOR = "\x1b[36m(MegatronTrainRayActor pid=5123)\x1b[0m "


def perf(step: int, seconds: float) -> str:
    return (
        f"{ACTOR}[2026-10-21 10:00:{step:02d}.000 actor_cell0_rank0] train_metric_utils.py:56 - "
        f"perf {step}: {{'perf/actor_train_time': {seconds - 0.5!r}, "
        f"'perf/step_time': {seconds!r}}}\n"
    )


def step_line(step: int) -> str:
    return (
        f"{ACTOR}[2026-10-21 10:00:{step:02d}.000 actor_cell0_rank0] log_utils.py:542 - "
        f"step {step}: {{'train/loss': 1.5, 'train/step': {step}}}\n"
    )


def node_log(long_line: int = 120) -> bytes:
    """A node.log in the node script's shape: stages, progress, miles lines, odd bytes."""
    parts = [
        "reproduce: node script starting\n",  # outside any stage: node.log only
        "##reproduce stage=image event=start t=1.5\n",
        "pulling 4ddc566b57ff\r\n",
        Progress("image", 10, 40, item="0/1 layers").line() + "\n",
        Progress("image", 40, 40, item="1/1 layers").line() + "\n",
        "##reproduce stage=image event=end status=ok t=2.5\n",
        "##reproduce stage=train event=start t=3.0\n",
        "données → étape ✓ 🚀\n",  # multi-byte characters, cut anywhere below
        step_line(0),
        perf(0, 18.96),
        "x" * long_line + "\n",  # longer than a marker can be
        "##reproduce stage=inner event=start t=3.5\n",
        "nested ✓\n",
        "##reproduce stage=inner event=end status=ok t=3.6\n",
        step_line(1),
        perf(1, 19.25),
        "##reproduce stage=train event=end status=ok t=9.0\n",
        "after the stages\n",
        "a last line without its newline",
    ]
    return "".join(parts).encode()


def reference_split(data: bytes) -> dict[str, bytes]:
    """Each stage's lines, by the protocol's rule, written independently of LogSplitter: a line
    belongs to the innermost stage open when it is printed; marker lines belong to none."""
    logs: dict[str, bytearray] = {"train": bytearray()}
    open_stages: list[str] = []
    for line in data.splitlines(keepends=True):
        marker = protocol.parse_marker(line.rstrip(b"\n"))
        if marker is None:
            if open_stages:
                logs.setdefault(open_stages[-1], bytearray()).extend(line)
        elif marker["event"] == "start":
            open_stages.append(marker["stage"])
            logs.setdefault(marker["stage"], bytearray())
        elif marker["stage"] in open_stages:
            open_stages.reverse()
            open_stages.remove(marker["stage"])
            open_stages.reverse()
    return {name: bytes(text) for name, text in logs.items()}


def stage_logs(logs: Path) -> dict[str, bytes]:
    return {p.stem: p.read_bytes() for p in logs.glob("*.log") if p.name != "node.log"}


class FileExecution:
    """The node protocol's reads over a file written by the test: `sizes` says how many bytes
    each read returns at most (a transport may return fewer than asked: SFTP, a job's log)."""

    node = Node(name="n", host="127.0.0.1")
    place = Place("r", "/nonexistent", "c")

    def __init__(self, path: Path, sizes: random.Random | None = None) -> None:
        self.path = path
        self.sizes = sizes
        self.state: tuple[str, int | None] = ("alive", None)

    def read_log(self, offset: int, max_bytes: int) -> bytes:
        if not self.path.exists():
            return b""
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            limit = max_bytes if self.sizes is None else self.sizes.randint(1, 97)
            return fh.read(min(limit, max_bytes))

    def poll(self) -> tuple[str, int | None]:
        return self.state

    def heartbeat(self) -> None:
        return None

    def close(self) -> None:
        return None


def test_a_log_cut_in_two_at_every_offset_is_split_as_a_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(stream, "MAX_MARKER_LINE", 100)  # the long line outgrows a marker
    data = node_log()
    want = reference_split(data)
    for cut in range(len(data) + 1):
        logs = tmp_path / f"cut{cut}"
        logs.mkdir()
        splitter = LogSplitter(logs, Timeline())
        splitter.append(data[:cut])
        splitter.append(data[cut:])
        splitter.flush_partial()
        splitter.close()
        assert (logs / "node.log").read_bytes() == data, cut
        assert stage_logs(logs) == want, f"cut at byte {cut}: {data[cut - 20 : cut + 20]!r}"
        assert [s.name for s in splitter.timeline.stages] == ["image", "train", "inner"]


def test_what_the_console_is_shown_never_comes_from_half_a_line(tmp_path):
    """A step line or a progress line cut by a read is shown once it is whole, never half
    read (a step time cut after its first digit would show a speed ten times too high)."""
    data = node_log()
    for cut in range(len(data) + 1):
        seen = Seen()
        path = tmp_path / f"node{cut}.log"
        path.write_bytes(b"")
        f = follower(FileExecution(path), tmp_path / f"logs{cut}", seen)
        for piece in (data[:cut], data[cut:]):
            with open(path, "ab") as fh:
                fh.write(piece)
            f.drain()
        assert seen.speeds and seen.speeds[-1] == (1, 19.25), (cut, seen.speeds)
        assert all(s in ((0, 18.96), (1, 19.25)) for s in seen.speeds), (cut, seen.speeds)
        assert seen.steps[-1] == 2, (cut, seen.steps)
        assert {(p.done, p.total) for p in seen.progress_seen} >= {(40, 40)}, cut


@pytest.mark.parametrize("seed", range(8))
def test_reads_that_return_short_lose_and_double_nothing(tmp_path, seed):
    data = node_log() * 3
    path = tmp_path / "node.log"
    path.write_bytes(data)
    execution = FileExecution(path, random.Random(seed))
    execution.state = ("exit", 0)  # the script has ended: the last read must take everything
    f = follower(execution, tmp_path / "logs")
    assert f.check() == stream.Ended(0)
    f.finish_logs("ok")
    assert (tmp_path / "logs" / "node.log").read_bytes() == data
    assert stage_logs(tmp_path / "logs") == reference_split(data)


def slow_writer(path: Path, data: bytes, rnd: random.Random, then: Path | None) -> None:
    """The node writing node.log slowly, in pieces that cut lines and characters anywhere, and
    (like the wrapper) writing exit_code only after its last byte."""
    with open(path, "ab", buffering=0) as fh:
        at = 0
        while at < len(data):
            n = rnd.randint(1, 60)
            fh.write(data[at : at + n])
            at += n
            if rnd.random() < 0.3:
                time.sleep(rnd.random() * 0.004)
    if then is not None:
        tmp = then.with_suffix(".tmp")
        tmp.write_text("0\n")
        tmp.rename(then)


@pytest.mark.parametrize("seed", range(4))
def test_a_follower_reading_while_a_slow_writer_writes_gets_every_byte_once(tmp_path, seed):
    """The real node protocol on this host: the wrapper's files, the poll command, reads by
    offset through the local transport; the writer ends with exit_code, as the wrapper does."""
    node = tmp_path / "node"
    node.mkdir()
    # a live session of its own, as the wrapper's setsid makes (this process's session may be
    # one started outside its PID namespace, which ps cannot see: getsid() is 0 there)
    session = subprocess.Popen(["sleep", "600"], start_new_session=True)
    (node / "pid").write_text(f"{session.pid}\n")  # only exit_code ends it
    data = node_log() * 20
    from launcher.clusters.execution import WrapperExecution

    execution = WrapperExecution(
        Node(name="local", host="localhost"), LocalTransport(), Place("r", str(node), "c")
    )
    f = follower(execution, tmp_path / "logs")
    writer = threading.Thread(
        target=slow_writer,
        args=(node / "node.log", data, random.Random(seed), node / "exit_code"),
    )
    writer.start()
    try:
        ended = None
        while ended is None:
            ended = f.check()
    finally:
        writer.join()
        session.kill()
        session.wait()
    f.finish_logs("ok")
    assert ended == stream.Ended(0)
    assert (tmp_path / "logs" / "node.log").read_bytes() == data
    assert stage_logs(tmp_path / "logs") == reference_split(data)


def test_the_last_bytes_written_just_before_exit_code_are_collected(tmp_path):
    """The node writes its last line and then exit_code between the follower's read and its
    poll: the read after "exit" takes them, however the transport cuts that read."""
    path = tmp_path / "node.log"
    path.write_bytes(b"##reproduce stage=train event=start t=1\nfirst\n")
    last = b"the last words\n##reproduce stage=train event=end status=ok t=2\n" * 50

    class LastWords(FileExecution):
        def poll(self) -> tuple[str, int | None]:
            with open(self.path, "ab") as fh:  # written just before exit_code appears
                fh.write(last)
            return ("exit", 0)

    f = follower(LastWords(path, random.Random(1)), tmp_path / "logs")
    assert f.check() == stream.Ended(0)
    f.finish_logs("ok")
    assert (tmp_path / "logs" / "node.log").read_bytes() == path.read_bytes()
    assert (tmp_path / "logs" / "train.log").read_bytes().endswith(b"the last words\n")


def test_the_image_pulls_status_lines_keep_a_character_cut_between_two_reads(tmp_path, capsys):
    """docker pull's screen is read from a pseudo-terminal in pieces: a character cut between
    two of them is decoded whole (a chunk decoded alone turned it into U+FFFD)."""
    from support.node_scripts import load_script

    pull = load_script("pull_progress")
    docker = tmp_path / "docker"
    docker.write_text(
        "#!/bin/bash\n"
        '[ "$1" = pull ] || exit 1\n'
        "printf 'Status: r\\xc3'; sleep 0.3; printf '\\xa9ussi \\xe2\\x9c'; sleep 0.3\n"
        "printf '\\x93\\r\\n'\n"
    )
    docker.chmod(0o755)
    assert pull.pull("registry.test/img@sha256:" + "0" * 64, docker=str(docker)) == 0
    assert "Status: réussi ✓" in capsys.readouterr().out.splitlines()
