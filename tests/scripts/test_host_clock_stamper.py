"""scripts/host_clock.py, the real program on real pipes: every byte passes unchanged, a clock
line with the nonce stands before each line that begins a gap after the last, never inside a
line; a huge or unterminated line passes whole; TERM does not end it (it drains and exits at the
end of its input); and the launcher's parser reads back what it wrote (launcher/judge/parse/clock.py).

No timed assertions: the writer's pace decides only which lines may get a clock line (a line
printed after a pause longer than the gap must; the clock lines' times must grow), never how
fast anything ran.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

from support.node_scripts import SCRIPTS

from launcher.judge.parse.clock import CLOCK, CLOCK_GAP_S, HostClock

STAMPER = SCRIPTS / "host_clock.py"
NONCE = "0123456789abcdef0123456789abcdef"
_LINE = re.compile(rb"##reproduce clock t=([0-9]+\.[0-9]{9}) n=" + NONCE.encode() + rb"\n")


def stamper(gap: float = 0.2, stdout: int = subprocess.PIPE) -> subprocess.Popen:
    env = {**os.environ, "REPRODUCE_CLOCK_NONCE": NONCE}
    return subprocess.Popen(
        [sys.executable, str(STAMPER), "--gap", str(gap)],
        stdin=subprocess.PIPE,
        stdout=stdout,
        env=env,
    )


def split(out: bytes) -> tuple[bytes, list[tuple[int, float]]]:
    """(what remains once the clock lines are taken out, [(offset in it, t)])."""
    rest, clocks, pos = b"", [], 0
    for m in _LINE.finditer(out):
        rest += out[pos : m.start()]
        clocks.append((len(rest), float(m.group(1))))
        pos = m.end()
    return rest + out[pos:], clocks


def paced(chunks: list[tuple[float, bytes]], gap: float = 0.2) -> bytes:
    """Feed chunks to the real stamper; before a chunk's pause, wait until the chunk before it
    came out, so the pause lies between the stamper's two reads however late it runs (a pause
    longer than the gap then must bring a clock line). Its whole output."""
    proc = stamper(gap)
    assert proc.stdin is not None and proc.stdout is not None
    out = bytearray()
    fd = proc.stdout.fileno()

    def read() -> None:
        while data := os.read(fd, 1 << 16):
            out.extend(data)

    reader = threading.Thread(target=read)
    reader.start()
    sent = b""
    for pause, data in chunks:
        if pause:
            deadline = time.monotonic() + 30
            while not split(bytes(out))[0].endswith(sent) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(pause)
        proc.stdin.write(data)
        proc.stdin.flush()
        sent += data
    proc.stdin.close()
    reader.join(30)
    assert proc.wait(timeout=30) == 0
    return bytes(out)


def test_every_byte_passes_and_a_clock_line_stands_before_each_line_after_a_pause():
    chunks = [
        (0.0, b"first\n"),
        (0.5, b"after a pause\n"),
        (0.0, b"at once\n"),
        (0.5, b"part"),  # a line begun after a pause ...
        (0.5, b"ial\nnext\n"),  # ... and ended after another: the clock goes before `next`
    ]
    out = paced(chunks)
    rest, clocks = split(out)
    assert rest == b"".join(data for _, data in chunks)
    offsets = [o for o, _ in clocks]
    paused = [rest.index(b"first"), rest.index(b"after"), rest.index(b"part"), rest.index(b"next")]
    assert set(paused) <= set(offsets)  # before each line begun after a pause ...
    assert all(rest[o - 1 : o] == b"\n" for o in offsets if o)  # ... and never inside a line
    times = [t for _, t in clocks]
    assert times == sorted(times) and times[0] > 1e9  # host epoch seconds, never backwards


def test_a_huge_line_and_binary_bytes_pass_whole_and_a_last_line_without_newline_too():
    huge = b"x" * (3 << 20) + b"\n"  # longer than any read: still one line, no clock inside
    binary = bytes(range(256)) * 64  # newlines inside, invalid UTF-8, NULs
    out = paced([(0.0, huge), (0.3, binary), (0.3, b"no newline at the end")])
    rest, clocks = split(out)
    assert rest == huge + binary + b"no newline at the end"
    assert clocks[0][0] == 0 and all(o >= len(huge) for o, _ in clocks[1:])


def test_term_does_not_end_it_it_drains_to_the_end_of_its_input():
    proc = stamper()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"before the cancel\n")
    proc.stdin.flush()
    assert proc.stdout.readline().startswith(CLOCK.encode())
    assert proc.stdout.readline() == b"before the cancel\n"  # it runs: the TERM comes now
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        proc.send_signal(sig)
    proc.stdin.write(b"the container's last words\n")  # its stage's end marker, after TERM
    proc.stdin.close()
    rest, _ = split(proc.stdout.read())
    assert rest == b"the container's last words\n"
    assert proc.wait(timeout=30) == 0


def test_a_broken_output_never_blocks_the_writer():
    r, w = os.pipe()
    proc = stamper(stdout=w)
    os.close(w)
    os.close(r)  # nobody reads: its writes fail
    assert proc.stdin is not None
    proc.stdin.write(b"y" * (4 << 20))  # more than a pipe holds: read on, not blocked
    proc.stdin.close()
    assert proc.wait(timeout=30) == 1


def test_without_a_nonce_it_passes_the_output_unstamped_and_says_so():
    env = {k: v for k, v in os.environ.items() if k != "REPRODUCE_CLOCK_NONCE"}
    done = subprocess.run(
        [sys.executable, str(STAMPER)], input=b"a\nb", capture_output=True, env=env, check=False
    )
    assert done.stdout == b"a\nb" and done.returncode == 2 and b"nonce" in done.stderr


def test_the_parser_reads_back_what_it_wrote():
    out = paced([(0.0, b"one\n"), (0.3, b"two\n")])
    clock = HostClock(NONCE)
    for line in out.decode().splitlines():
        if line.startswith(CLOCK):
            clock.line(line)
    assert clock.lines >= 2 and clock.refused == 0 and clock.t is not None


def test_node_sh_passes_the_gap_the_judge_reads():
    from launcher.plan.host_clock import host_clock_pipe

    assert f"--gap {CLOCK_GAP_S:g} " in "\n".join(host_clock_pipe("true"))
