"""What a node printed, quoted in our messages, is bounded (issue 19, low).

A failed stage's error message embedded the stage log's whole last line: a 96 MiB line became a
100-million-character message. Every excerpt goes through launcher/excerpt.py now; these tests
hand each place that quotes output a hostile one (a huge line, many lines, control characters)
and bound the message.
"""

from __future__ import annotations

import tracemalloc

import pytest

from launcher.clusters.base import CommandResult
from launcher.clusters.local import command_failed
from launcher.errors import InfraError
from launcher.excerpt import MAX_LINE_CHARS, MAX_LINES, TAIL_BYTES, excerpt_lines, log_tail
from launcher.plan.preflight import parse_report
from launcher.records.rundir import RunDir, Stage, Timeline
from launcher.runner.outcome import failure, tail_of

HUGE = 24 * 1024 * 1024  # a 24 MiB line (the finding's was 96 MiB; the bound is the same)
BOUND = MAX_LINES * (MAX_LINE_CHARS + 60) + 2000  # lines, their markers and our own words


def _hostile(last: str = "the real error: CUDA out of memory") -> str:
    return "\n".join(f"line {i}" for i in range(5000)) + "\n" + "x" * HUGE + " " + last + "\n"


def test_a_failed_stage_with_a_huge_last_line_gives_a_short_message(tmp_path):
    rd = RunDir.create(tmp_path / "runs", "m/h200/x", "r1")
    (rd.logs / "train.log").write_text(_hostile())
    (rd.logs / "node.log").write_text("##reproduce stage=train event=start t=1\n")
    timeline = Timeline(stages=[Stage("train", start=1, end=2, status="failed")])
    tracemalloc.start()
    try:
        stage, err = failure(rd, timeline, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stage == "train"
    message = str(err)
    assert len(message) < BOUND, len(message)
    assert "the real error: CUDA out of memory" in message  # the line's end is kept
    assert "characters left out" in message
    assert peak < HUGE // 4, f"{peak / 2**20:.0f} MiB"  # the log is read from its end, never whole


def test_tail_of_reads_only_the_end_and_strips_control_characters(tmp_path):
    log = tmp_path / "stage.log"
    log.write_bytes(b"a" * (3 * TAIL_BYTES) + b"\n\x1b]0;owned\x07first\nsecond\x1b[2J\n")
    tail = tail_of(log)
    assert "\x1b" not in tail and "\x07" not in tail
    assert tail.splitlines()[-1].strip() == "second\\x1b[2J"  # its escape, not itself
    assert len(tail) < BOUND


@pytest.mark.parametrize("where", ["stderr", "stdout"])
def test_a_failed_node_command_quotes_a_bounded_excerpt(where):
    out = _hostile()
    result = CommandResult(1, out if where == "stdout" else "", out if where == "stderr" else "")
    message = str(command_failed("node0", "docker pull x", result))
    assert len(message) < BOUND and "CUDA out of memory" in message


def test_a_preflight_without_a_report_quotes_a_bounded_excerpt():
    with pytest.raises(InfraError) as info:
        parse_report(_hostile())
    text = str(info.value) + str(info.value.hint or "")
    assert len(text) < BOUND and "CUDA out of memory" in text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n\n",
        "one",
        "x" * 10_000_000,
        "\n".join("y" * 1000 for _ in range(10_000)),
        "\x00\x1b\x9b" * 1000,
    ],
)
def test_every_excerpt_is_bounded(text, tmp_path):
    lines = excerpt_lines(text)
    assert len(lines) <= MAX_LINES
    assert all(len(line) <= MAX_LINE_CHARS + 60 for line in lines)
    assert not any(c in "".join(lines) for c in "\x00\x1b\x9b")
    path = tmp_path / "log"
    path.write_text(text)
    assert log_tail(path) == lines or len(text) > TAIL_BYTES
