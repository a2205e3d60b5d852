"""A Ctrl-C, SIGTERM or SIGHUP is never lost while a run is followed (issue 22).

Python raises a signal's exception in whatever Python code runs when the handler does; when that
code is a finalizer (`Popen.__del__`, collected after every node command; any `__del__` or weakref
callback), the exception is printed as "Exception ignored in ..." and dropped. A Ctrl-C that landed
there was lost: the launcher went on following a run that sleeps for minutes
(tests/test_docker_exec.py::test_cancel_leaves_no_container_and_no_process[ctrl-c] under load).
Here the node is slow to answer (each poll takes a while) and the signal arrives, deterministically,
inside a finalizer: the run must still be cancelled on the node, at once, and say so.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from support.helpers import group_alive
from support.nodescript import job

from launcher.clusters.base import CommandResult, Node
from launcher.clusters.local import LocalCluster, LocalTransport
from launcher.errors import Interrupted
from launcher.plan import protocol
from launcher.runner.runner import Runner


class _SignalInFinalizer:
    """An object whose finalizer is where the signal's handler runs (raise_signal runs it at
    once), so the handler's exception is raised inside __del__: Python drops it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        signal.raise_signal(self.signum)


def slow_node(poll: str, signum: int, *, after_polls: int = 3) -> type[LocalCluster]:
    """This host as a node slow to answer its polls; at the `after_polls`-th one the signal comes,
    landing in a finalizer (as it can after any node command: Popen.__del__)."""

    class SlowTransport(LocalTransport):
        polls = 0

        def run(self, command: str, **kw: object) -> CommandResult:
            if command == poll:
                time.sleep(0.3)  # a node slow to answer
                SlowTransport.polls += 1
                if SlowTransport.polls == after_polls:
                    _SignalInFinalizer(signum)  # collected at once: the handler runs in __del__
            return super().run(command, **kw)  # type: ignore[arg-type]

    class SlowCluster(LocalCluster):
        def transport(self, node: Node) -> LocalTransport:
            return SlowTransport(node.name)

    return SlowCluster


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped one
@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_a_signal_that_lands_in_a_finalizer_still_cancels_the_run(tmp_path: Path, signum: int):
    rd, plan = job(tmp_path / "runs", tmp_path / "node", "_mark train start\nsleep 60\n")
    cluster = slow_node(protocol.poll_command(plan.node_run_dir), signum)()
    runner = Runner(poll_s=0.05, measure=False, on_interrupt="cancel")
    started = time.monotonic()
    try:
        with pytest.raises(Interrupted, match="cancelled"):
            runner.execute(plan, rd, cluster)
    finally:
        LocalTransport().run(
            protocol.cancel_command(plan.node_run_dir, plan.container), check=False
        )
    assert time.monotonic() - started < 30, "the interrupt was honoured only when the run ended"
    assert rd.status()["state"] == "cancelled"
    assert not group_alive(int(rd.record()["pid"])), "the run goes on on the node"
    assert rd.timeline().stages[-1].status == "cancelled"
