"""A 4-node run on AWS (moto), followed by the real runner to its verdict, and one node lost.

The cluster is AwsCluster against moto; its 4 nodes are real sshd on this machine (the head on
127.0.0.1, the others at 127.0.0.5-7 reached through it: tests/support/aws.py). The runner stages,
launches and follows node.sh on every node over those connections, exactly as for real nodes.
Two things only a test needs: the nodes share one filesystem, so each keeps its run directory in a
work dir of its own (Node.work_dir, set by a subclass here), and node.sh is hand-written (node 0
runs the stand-in miles, which prints the training metrics; the others serve until node 0 is done),
because Ray across containers on one machine is the multi-node infrastructure's business.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from support.aws import NOTHING, live_with_operator_key, load, multinode_fields, nodes_recipe
from support.helpers import group_alive, wait_for
from support.measure import standin_words
from support.paths import TESTS

from launcher.clusters.aws.cluster import AwsCluster
from launcher.errors import ReproduceError
from launcher.records.rundir import RunDir
from launcher.runner.runner import Runner

pytestmark = [pytest.mark.aws, pytest.mark.ssh, pytest.mark.multinode]
STANDIN = TESTS / "standin_miles" / "train.py"

SCRIPT = """#!/bin/bash
set -euo pipefail
_mark() {{ printf '##reproduce stage=%s event=%s%s t=%s\\n' "$1" "$2" "${{3:+ status=$3}}" "$(date +%s.%N)"; }}
_mark preflight start; echo "node ${{NODE_RANK}} of {nodes}: head ${{HEAD_ADDR}}, me ${{NODE_IP}}"
_mark preflight end ok
if [ "$NODE_RANK" = 0 ]; then
  _mark train start
  {train}
  _mark train end ok
else
  _mark ray start
  while [ ! -e state/finished ]; do sleep 0.1; done
  _mark ray end ok
fi
"""


class OneHostCluster(AwsCluster):
    """AwsCluster whose nodes share this machine's disk: a work dir per node."""

    work_root: Path

    def _node_from(self, inst, index, launched, ami_id, identity_file, via=None):
        node = super()._node_from(inst, index, launched, ami_id, identity_file, via)
        work = self.work_root / f"node{index}"
        work.mkdir(mode=0o700, parents=True, exist_ok=True)
        return dataclasses.replace(node, work_dir=str(work))


def setup(aws, ami, tmp_path, loopback_nodes, train: str):
    from launcher.plan.plan import build_plan

    recipe = nodes_recipe(tmp_path, 4)
    profile = load(tmp_path, **multinode_fields(aws, loopback_nodes))
    rd = RunDir.create(tmp_path / "runs", "test/aws-4-nodes")
    cluster = OneHostCluster(
        recipe,
        profile,
        rd.run_id,
        session=aws,
        ami_resolver=lambda name: ami,
        state_path=rd.path / "aws.json",
        key_dir=tmp_path / "keys",
        poll_s=0.01,
        owner="test",
    )
    cluster.work_root = tmp_path / "hosts"
    plan = build_plan(recipe, profile, run_id=rd.run_id)
    script = SCRIPT.format(
        nodes=recipe.nodes, train=train.replace("{args}", standin_words(recipe.raw))
    )
    return rd, cluster, dataclasses.replace(plan, node_script=script)


def the_run_pids(cluster: OneHostCluster, rd: RunDir) -> list[int]:
    pids = []
    for index in range(4):
        pid = cluster.work_root / f"node{index}" / "runs" / rd.run_id / "pid"
        if pid.is_file():
            pids.append(int(pid.read_text()))
    return pids


def test_four_nodes_on_aws_run_to_a_verdict_and_leave_nothing(aws, ami, tmp_path, loopback_nodes):
    # the recipe's global batch (4 x the seed's: the same work per GPU)
    train = f"python3 {STANDIN} {{args}}"  # the recipe's arguments: 4 nodes, global batch 512
    rd, cluster, plan = setup(aws, ami, tmp_path, loopback_nodes, train)
    outcome = Runner(poll_s=0.05, measure=True).execute(plan, rd, cluster)

    assert outcome.state == "done" and outcome.measurement is not None
    assert outcome.measurement[1].status == "reproduced"
    assert json.loads((rd.path / "verdict.json").read_text())["status"] == "reproduced"
    record = rd.record()
    assert [n["name"] for n in record["nodes"]] == ["node0", "node1", "node2", "node3"]
    assert [n["via"]["name"] for n in record["nodes"][1:]] == ["node0"] * 3
    # every node ran, with its rank and the head's private address, and its log came back
    head = "head 127.0.0.4"
    assert f"node 0 of 4: {head}, me 127.0.0.4" in (rd.logs / "node.log").read_text()
    for k in (1, 2, 3):
        text = (rd.logs / f"node-{k}" / "node.log").read_text()
        assert f"node {k} of 4: {head}, me 127.0.0.{4 + k}" in text
    assert live_with_operator_key(aws._real.client("ec2")) == NOTHING
    assert not [pid for pid in the_run_pids(cluster, rd) if group_alive(pid)]
    assert len(aws.calls.params("allocate_address")) == 1


def test_a_node_terminated_mid_run_stops_the_run_names_it_and_leaves_nothing(
    aws, ami, tmp_path, loopback_nodes, monkeypatch
):
    import launcher.runner.session as session

    monkeypatch.setattr(session, "HEALTH_EVERY_S", 0.3)  # the runner asks EC2 about its nodes
    rd, cluster, plan = setup(aws, ami, tmp_path, loopback_nodes, "sleep 300")
    cluster.health_every_s = 0.0
    real = aws._real.client("ec2")
    killed: list[str] = []

    def terminate_node2_once_training() -> None:
        def training() -> bool:
            log = rd.logs / "node.log"
            return log.is_file() and "stage=train event=start" in log.read_text()

        wait_for(training, 120, "node 0 to start training")
        iid = json.loads((rd.path / "aws.json").read_text())["nodes"][2]["meta"]["instance_id"]
        real.terminate_instances(InstanceIds=[iid])  # a spot interruption, a failed host
        killed.append(iid)
        # ...and with the instance goes everything that ran on it (moto only marks it ended)
        pid = cluster.work_root / "node2" / "runs" / rd.run_id / "pid"
        os.killpg(int(pid.read_text()), signal.SIGKILL)

    killer = threading.Thread(target=terminate_node2_once_training, daemon=True)
    killer.start()
    started = time.monotonic()
    with pytest.raises(ReproduceError) as err:
        Runner(poll_s=0.05, measure=True).execute(plan, rd, cluster)
    killer.join(5)
    assert killed, "node 2 was never terminated"
    text = str(err.value)
    assert f"node2 ({killed[0]}) is " in text, text  # the error names the node and its instance
    assert time.monotonic() - started < 120
    status = rd.status()
    assert status["state"] == "failed" and "node2" in status.get("detail", ""), status
    timeline = json.loads((rd.path / "timeline.json").read_text())
    assert any(
        s["name"].startswith("node-2:") and s["status"] == "failed" for s in timeline["stages"]
    ), timeline["stages"]
    verdict = rd.path / "verdict.json"
    if verdict.is_file():  # judged: the failed stages it lists name the node
        assert "node-2" in verdict.read_text()
    # nothing left: no instance, address, group or key of the run; no process of it on any node
    assert live_with_operator_key(real) == NOTHING
    pids = the_run_pids(cluster, rd)
    assert len(pids) == 4
    wait_for(lambda: not [p for p in pids if group_alive(p)], 30, "the run's processes to end")
