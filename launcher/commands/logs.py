"""`reproduce logs RUN`: a run's log, looked at without taking the run over."""

from __future__ import annotations

import codecs
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import typer

from launcher.commands import options as o
from launcher.commands.output import fail
from launcher.errors import BadInput, InfraError, ReproduceError
from launcher.excerpt import printable


def logs_cmd(
    run: o.RunArg,
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Go on printing until the run ends on its node."
    ),
    stage: str | None = typer.Option(
        None, "--stage", help="Only this stage's lines (image, assets, train, ...)."
    ),
    node: o.Node = 0,
    runs_dir: o.RunsDir = None,
) -> None:
    """A run's log: the run directory's copy and, while it runs, the rest from the node; never takes the run over (no attach, nothing written)."""  # noqa: E501 - typer shows its line breaks

    try:
        code = logs_command(run, runs_dir, follow=follow, stage=stage, node=node)
    except ReproduceError as err:
        raise fail(err) from None
    raise typer.Exit(code)


def logs_command(
    ref: str,
    runs_dir: Path | None,
    *,
    follow: bool = False,
    stage: str | None = None,
    node: int = 0,
    out: BinaryIO | None = None,
) -> int:
    """The run's log (node K's, or one stage's) on stdout; while it runs, up to the node's last
    byte, and with --follow on to the run's end. Never writes the run directory."""
    from launcher.records.rundir import RunDir
    from launcher.runner import runlogs

    sink = out or sys.stdout.buffer
    rd = RunDir.find(ref, runs_dir)
    runlogs.check_node(rd, node)
    if stage is not None:
        runlogs.check_stage(stage)
    logs = runlogs.local_logs(rd, node)
    if not runlogs.is_live(rd):
        path = logs / (f"{stage}.log" if stage else "node.log")
        if stage and not path.is_file():
            have = sorted(p.stem for p in logs.glob("*.log") if p.stem != "node")
            raise BadInput(
                f"--stage {stage}: run {rd.path.name} has no log of that stage; it has "
                f"{', '.join(have) or 'none'}."
            )
        _emit(sink, runlogs.read_local(path))
        if follow:
            print(f"(run {rd.path.name} is over: {rd.status().get('state')})", file=sys.stderr)
        return 0
    node_log = logs / "node.log"
    size = node_log.stat().st_size if node_log.exists() else 0  # the node is read from here on
    filt = runlogs.StageFilter(stage) if stage else None

    def shown(chunks: Iterator[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            yield filt.feed(chunk) if filt is not None else chunk

    _emit(sink, shown(_capped(runlogs.read_local(node_log), size)))
    execution = runlogs.open_execution(rd, node)
    try:
        _emit(sink, shown(runlogs.read_node(execution, size, follow=follow)))
    except InfraError as err:
        raise InfraError(
            f"{err}. Shown above: the run directory's copy ({size} bytes of {node_log}).",
            hint="`reproduce status RUN` says where the run is.",
        ) from None
    finally:
        runlogs.close_quietly(execution)
    if filt is not None:
        _emit(sink, iter([filt.finish()]))
    return 0


def _capped(chunks: Iterator[bytes], limit: int) -> Iterator[bytes]:
    """The first `limit` bytes: the local copy as it was when the node's part was placed."""
    left = limit
    for chunk in chunks:
        if left <= 0:
            return
        yield chunk[:left]
        left -= len(chunk)


def _emit(sink: BinaryIO, chunks: Iterator[bytes]) -> None:
    """The log's bytes as they are into a pipe or a file (a copy of the log is the log); at a
    terminal made printable (launcher/excerpt.py): the log is what the recipe's code printed, and
    an ESC sequence or a bidi override in it would act on the terminal instead of being read."""
    if _is_terminal(sink):
        chunks = _printable_chunks(chunks)
    for chunk in chunks:
        if chunk:
            sink.write(chunk)
            sink.flush()


def _is_terminal(sink: BinaryIO) -> bool:
    try:
        return sink.isatty()
    except (OSError, ValueError, AttributeError):
        return False


def _printable_chunks(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Each chunk decoded as UTF-8 across chunk boundaries (a character cut in two is whole),
    made printable but for its line breaks and tabs, and encoded again."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in chunks:
        yield printable(decoder.decode(chunk), keep="\n\t").encode("utf-8")
    yield printable(decoder.decode(b"", final=True), keep="\n\t").encode("utf-8")
