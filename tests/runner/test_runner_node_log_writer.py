"""node.log only grows, whatever a node program does with its output (issue 22, finding 1).

The follower reads node.log by byte offset; a file that shrinks or is rewritten under it would
lose the evidence it has not read yet, or leave the collected copy different from the node's. A
program opening its output anew is ordinary shell (`echo x > /dev/stderr`); on Linux that opens
the file again with O_TRUNC. The wrapper (launcher/plan/protocol.py WRAPPER) gives node.sh a pipe
with one copier behind it, so every such open is an open of the pipe. Each adversary below is one
way a program reopens, truncates or rewrites its output; each runs through the real wrapper, the
real poll and the follower on this host, and every line it printed must be in node.log, in order,
with the collected copy equal to the node's byte for byte.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest
from support.stream import follower

from launcher.clusters.base import Node
from launcher.clusters.execution import Place, WrapperExecution
from launcher.clusters.local import LocalTransport
from launcher.runner import stream

LINES = 40

ADVERSARIES = {
    "echo > /dev/stderr": 'echo "line $k" > /dev/stderr',
    "echo > /dev/stdout": 'echo "line $k" > /dev/stdout',
    "truncate /dev/stderr, then print": ': > /dev/stderr; echo "line $k"',
    "exec 1> /proc/self/fd/1": 'exec 1> /proc/self/fd/1; echo "line $k"',
    "python opens /dev/stdout": (
        "python3 -c \"import sys; open('/dev/stdout', 'w').write('line ' + sys.argv[1] + '\\\\n')\""
        ' "$k"'
    ),
    "tee to /dev/stderr": 'echo "line $k" | tee /dev/stderr > /dev/null',
}


def _node_script(body: str) -> str:
    return textwrap.dedent(
        f"""\
        #!/bin/bash
        set -euo pipefail
        echo "##reproduce stage=train event=start t=1"
        for k in $(seq 1 {LINES}); do
          {body}
          [ $((k % 10)) -eq 0 ] && sleep 0.05
        done
        echo "##reproduce stage=train event=end status=ok t=2"
        """
    )


def _run(tmp_path: Path, script: str) -> tuple[stream.Ended, bytes, bytes]:
    node = tmp_path / "node"
    execution = WrapperExecution(
        Node(name="local", host="localhost"), LocalTransport(), Place("r", str(node), "c")
    )
    execution.stage(script, None, None)
    execution.launch({})
    f = follower(execution, tmp_path / "logs")
    deadline = time.monotonic() + 60
    ended = None
    while ended is None:
        assert time.monotonic() < deadline, "the run did not end within 60 s"
        ended = f.check()
    f.finish_logs("ok")
    return ended, (node / "node.log").read_bytes(), (tmp_path / "logs" / "node.log").read_bytes()


@pytest.mark.parametrize("how", sorted(ADVERSARIES))
def test_a_program_that_reopens_its_output_never_rewrites_the_log(tmp_path, how):
    ended, on_node, collected = _run(tmp_path, _node_script(ADVERSARIES[how]))
    assert ended == stream.Ended(0)
    printed = [ln for ln in on_node.decode().splitlines() if ln.startswith("line ")]
    assert printed == [f"line {k}" for k in range(1, LINES + 1)], on_node.decode()[:2000]
    assert collected == on_node
    train = (tmp_path / "logs" / "train.log").read_text().splitlines()
    assert [ln for ln in train if ln.startswith("line ")] == printed


def test_a_daemon_left_holding_the_output_does_not_hold_the_exit_code(tmp_path):
    """A program node.sh started in the background keeps the pipe open after node.sh ended: the
    exit code still arrives (the wrapper waits for the copier at most 10 s), and what the daemon
    printed before it was stopped is in node.log."""
    script = _node_script('echo "line $k"').replace(
        "set -euo pipefail\n", "set -euo pipefail\n( sleep 30; echo 'daemon late' ) &\n", 1
    )
    started = time.monotonic()
    ended, on_node, collected = _run(tmp_path, script)
    assert ended == stream.Ended(0)
    assert time.monotonic() - started < 25  # not the daemon's 30 s
    assert collected == on_node
    assert on_node.decode().count("line ") == LINES
