"""`python -m launcher`, for an aws run whose nodes all live on this machine (tests only).

Separate machines each have their own disk; the test's "nodes" (sshd servers on loopback) share
one, so each node gets a work directory of its own under $REPRODUCE_TEST_NODE_WORK_ROOT (the
runner then keeps node K's run directory there, as an ssh host list's per-host work_dir does).
$REPRODUCE_TEST_HEALTH_EVERY_S makes the runner ask the cluster about lost nodes sooner. Nothing
else changes: the CLI, the plan, the launch and the runner are the real ones.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any


def _one_host() -> None:
    from launcher.clusters.aws.cluster import AwsCluster

    root = Path(os.environ["REPRODUCE_TEST_NODE_WORK_ROOT"])
    made = AwsCluster._node_from

    def node_from(self: AwsCluster, inst: dict, index: int, *args: Any, **kw: Any) -> Any:
        node = made(self, inst, index, *args, **kw)
        work = root / f"node{index}"
        work.mkdir(mode=0o700, parents=True, exist_ok=True)
        return dataclasses.replace(node, work_dir=str(work))

    AwsCluster._node_from = node_from
    every = os.environ.get("REPRODUCE_TEST_HEALTH_EVERY_S")
    if every:
        import launcher.runner.session as session

        session.HEALTH_EVERY_S = float(every)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository
    _one_host()
    from launcher.commands.cli import main

    sys.argv[0] = "reproduce"
    main()
