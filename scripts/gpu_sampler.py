#!/usr/bin/env python3
"""Sample the node's GPUs from the host while the training container runs, into a host-only file.

Why: the host's clock (host_clock.py) proves the step lines arrived at the pace they claim, not
that the GPUs did the work: a container could print its lines at the claimed pace having trained
earlier, or not at all. node.sh runs this program on the host (never in a container) for the life
of the training `docker run`; it asks nvidia-smi for every GPU's utilization and power about once
a second and writes one line per GPU per sample, stamped with the host's epoch time on the same
clock as host_clock.py's clock lines (the epoch read once, then the monotonic clock), so the
window's host span maps onto the samples (docs/measurement.md, the evidence gate, check 7). The
file lies in the node run directory, which no container mounts.

The file (appended to; `#` lines are comments, the rest samples):

    # gpu_sampler start t=<epoch s.ns> interval_ms=<ms>
    <epoch s.ns>,<index>,<utilization.gpu %>,<power.draw W or [N/A]>
    # no samples: <why>         (no nvidia-smi, or it failed before its first sample)
    # nvidia-smi: <a line of its that is not a sample>   # stopped   # truncated at N bytes

What it promises:
- it never stops the run: without nvidia-smi, or when it fails, the file says so and the
  program ends 0; node.sh starts it in the background with its output discarded;
- a bounded file: at most --max-bytes (then `# truncated`, and it stops), so collection (4 MiB a
  file) brings it back whole;
- it ends on TERM or INT (node.sh's stop, the cancel's TERM), when the process --while-pid names
  is gone (node.sh ended on any path), or when nvidia-smi ends; it ends nvidia-smi with it.

Usage: gpu_sampler.py --out PATH [--interval-ms 1000] [--while-pid PID] [--max-bytes N]
(python 3.8+, the standard library only)
"""

from __future__ import annotations

import argparse
import os
import re
import select
import signal
import subprocess
import sys

from host_clock import Clock  # the same clock as the clock lines: scripts/ is its path

QUERY = "index,utilization.gpu,power.draw"
_SAMPLE = re.compile(rb"\s*([0-9]{1,3})\s*,\s*([^,]*?)\s*,\s*([^,]*?)\s*")
_MAX_LINE = 4096  # nvidia-smi's lines are short; a longer one is cut, never held


def stamp(t_ns: int) -> bytes:
    return b"%d.%09d" % (t_ns // 10**9, t_ns % 10**9)


class Out:
    """The sample file: appended, never through a link, at most max_bytes written."""

    def __init__(self, path: str, max_bytes: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        self.fd = os.open(path, flags, 0o600)
        self.left = max_bytes
        self.full = False

    def line(self, data: bytes) -> None:
        data = data.rstrip(b"\n") + b"\n"
        if self.full:
            return
        if len(data) + 64 > self.left:
            data = b"# truncated at the file's limit\n"
            self.full = True
        self.left -= len(data)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


def alive(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sample_lines(chunk: bytes, pending: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines of nvidia-smi's output so far, and what is left of a line."""
    data = pending + chunk
    *lines, rest = data.split(b"\n")
    if len(rest) > _MAX_LINE:  # a line without end: cut, never held
        lines.append(rest[:_MAX_LINE])
        rest = b""
    return lines, rest


def run(out: Out, clock: Clock, interval_ms: int, while_pid: int | None) -> int:
    stopping = []

    def stop(_sig: int, _frame: object) -> None:
        stopping.append(True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    out.line(b"# gpu_sampler start t=" + stamp(clock.now_ns()) + b" interval_ms=%d" % interval_ms)
    argv = [
        "nvidia-smi",
        "--query-gpu=" + QUERY,
        "--format=csv,noheader,nounits",
        "-lms",
        str(interval_ms),
    ]
    try:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
    except OSError as err:
        out.line(b"# no samples: nvidia-smi cannot be run: " + str(err).encode()[:200])
        return 0
    assert child.stdout is not None
    fd = child.stdout.fileno()
    samples, pending = 0, b""
    try:
        while not stopping and not out.full and alive(while_pid):
            try:
                ready, _, _ = select.select([fd], [], [], 1.0)
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            now = stamp(clock.now_ns())
            lines, pending = sample_lines(chunk, pending)
            for raw in lines:
                m = _SAMPLE.fullmatch(raw.rstrip(b"\r"))
                if m is None:
                    if raw.strip():
                        out.line(b"# nvidia-smi: " + raw.strip()[:200])
                    continue
                out.line(b"%s,%s,%s,%s" % (now, m.group(1), m.group(2), m.group(3)))
                samples += 1
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    code = child.returncode
    if not samples:
        out.line(b"# no samples: nvidia-smi ended (exit %d) before its first sample" % code)
    elif stopping or not alive(while_pid):
        out.line(b"# stopped")
    else:
        out.line(b"# nvidia-smi ended (exit %d)" % code)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the sample file (appended to)")
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--while-pid", type=int, default=None, help="stop once it is gone")
    parser.add_argument("--max-bytes", type=int, default=(4 << 20) - (64 << 10))
    args = parser.parse_args(argv)
    if args.interval_ms < 100 or args.max_bytes < 1024:
        print("gpu_sampler.py: needs --interval-ms >= 100 and --max-bytes >= 1024", file=sys.stderr)
        return 2
    try:
        out = Out(args.out, args.max_bytes)
    except OSError as err:
        print(f"gpu_sampler.py: cannot open {args.out}: {err.strerror}", file=sys.stderr)
        return 2
    return run(out, Clock(), args.interval_ms, args.while_pid)


if __name__ == "__main__":
    sys.exit(main())
