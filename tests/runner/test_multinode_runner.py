"""The runner following four nodes (four sshd "hosts" on 127.0.0.1, an ssh host list, each node in
its own work dir) with a small hand-written node.sh that behaves as the multi-node one does: node 0
works, the others serve it until the run is finished. Fast, without Ray or docker: what is tested is
the runner — every node's log, a worker that fails or is lost stopping the run everywhere (the
error, the status and the timeline naming the node), Ctrl-C, detach and attach, `reproduce cancel`,
the budget — and that nothing of the run is left on any node."""

from __future__ import annotations

import json
import os
import shlex
import signal
import threading
import uuid
from pathlib import Path

import pytest
from support.helpers import cli, group_alive, start_driver, wait_for
from support.multinode import SshHosts
from support.nodescript import plan_running

from launcher.clusters.contract import WithNodeHealth
from launcher.clusters.ssh import SSHCluster
from launcher.cost.budget import Budget
from launcher.errors import CheckFailed, InfraError
from launcher.records.rundir import RunDir
from launcher.runner.runner import Runner

pytestmark = [pytest.mark.multinode, pytest.mark.ssh]
NODES = 4

# As the multi-node node.sh: its run dir and rank from the launch; node K serves until the run is
# finished (state/finished); node 0 works for WORK_S seconds. FAIL_NODE fails in stage ray.
SCRIPT = """#!/bin/bash
set -euo pipefail
NODE_RUN_DIR="${{NODE_RUN_DIR:-{default_dir}}}"
NODE_RANK="${{NODE_RANK:-0}}"
cd "$NODE_RUN_DIR"
_mark() {{ printf '##reproduce stage=%s event=%s%s t=%s\\n' "$1" "$2" "${{3:+ status=$3}}" "$(date +%s.%N)"; }}
_mark preflight start; echo "node $NODE_RANK of $NODE_ADDRS, head $HEAD_ADDR, ip ${{NODE_IP:-}}"
echo '{{"node": '"$NODE_RANK"'}}' > preflight.json; _mark preflight end ok
if [ "$NODE_RANK" != 0 ]; then
  _mark ray start
  n=0
  while [ ! -e state/finished ]; do
    n=$((n + 1))
    if [ "$NODE_RANK" = "{fail_node}" ] && [ "$n" -ge {fail_after} ]; then
      echo "ray on node $NODE_RANK died"; _mark ray end failed; exit 7
    fi
    sleep 0.1
  done
  _mark ray end ok
  exit 0
fi
_mark train start
for i in $(seq 1 {steps}); do echo "train line $i"; sleep {step_s}; done
_mark train end ok
"""


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory):
    started = SshHosts(tmp_path_factory.mktemp("hosts"), NODES).start()
    yield started
    started.stop()


def _job(hosts, runs_root: Path, *, steps=10, step_s=0.1, fail_node=-1, fail_after=10):
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    rd = RunDir.create(runs_root, "test/multinode", run_id)
    default_dir = hosts.work_dir(0) / "runs" / rd.run_id
    text = SCRIPT.format(
        default_dir=shlex.quote(str(default_dir)),
        steps=steps,
        step_s=step_s,
        fail_node=fail_node,
        fail_after=fail_after,
    )
    return rd, plan_running(rd.run_id, str(default_dir), text)


def _cluster(hosts) -> SSHCluster:
    return SSHCluster.from_profile(hosts.profile())


def _node_dir(hosts, k: int, rd: RunDir) -> Path:
    return hosts.work_dir(k) / "runs" / rd.run_id


def _pids(hosts, rd: RunDir) -> list[int]:
    return [int((_node_dir(hosts, k, rd) / "pid").read_text()) for k in range(NODES)]


def _nothing_running(hosts, rd: RunDir) -> None:
    for k, pid in enumerate(_pids(hosts, rd)):
        assert not group_alive(pid), f"node {k} still runs"


def _spec(hosts, rd, plan, **extra):
    return {
        "cluster": _cluster(hosts).to_record(),
        "node_script": plan.node_script,
        "run_id": rd.run_id,
        "node_run_dir": plan.node_run_dir,
        "run_dir": str(rd.path),
        **extra,
    }


def test_every_node_runs_in_its_own_dir_and_every_log_is_kept(hosts, runs_root):
    rd, plan = _job(hosts, runs_root)
    outcome = Runner(poll_s=0.2, measure=False).execute(plan, rd, _cluster(hosts))
    assert outcome.state == "done"
    record = rd.record()
    assert [n["host"] for n in record["nodes"]] == [hosts.address(k) for k in range(NODES)]
    assert record["nodes"][2]["work_dir"] == str(hosts.work_dir(2))
    head_log = (rd.logs / "node.log").read_text()
    assert "node 0 of 127.0.0.1 127.0.0.2 127.0.0.3 127.0.0.4, head 127.0.0.1, ip 127.0.0.1" in (
        head_log
    )
    assert "train line 10" in (rd.logs / "train.log").read_text()
    for k in range(1, NODES):
        logs = rd.logs / f"node-{k}"
        node_log = (logs / "node.log").read_text()
        assert f"node {k} of" in node_log and f"ip {hosts.address(k)}" in node_log
        assert node_log == (_node_dir(hosts, k, rd) / "node.log").read_text()
        assert "stage=ray event=end status=ok" in node_log  # told to stop once node 0 finished
        assert json.loads((logs / "preflight.json").read_text()) == {"node": k}
    assert json.loads((rd.path / "preflight.json").read_text()) == {"node": 0}
    assert [s.name for s in rd.timeline().stages] == ["preflight", "train"]
    _nothing_running(hosts, rd)


def test_a_worker_that_fails_stops_the_run_on_every_node_and_is_named(hosts, runs_root):
    rd, plan = _job(hosts, runs_root, steps=600, step_s=0.1, fail_node=2, fail_after=15)
    with pytest.raises(InfraError) as caught:
        Runner(poll_s=0.2, measure=False).execute(plan, rd, _cluster(hosts))
    message = str(caught.value)
    assert "node 2 (127.0.0.3) ended in stage ray with exit code 7" in message
    assert "ray on node 2 died" in message and "stopped on every node" in message
    status = rd.status()
    assert status["state"] == "failed" and "node 2 (127.0.0.3)" in status["detail"]
    stages = {s.name: s.status for s in rd.timeline().stages}
    assert stages["node-2:ray"] == "failed" and stages["train"] == "cancelled"
    assert "train line 600" not in (rd.logs / "train.log").read_text()
    assert rd.timeline().released_at is not None
    _nothing_running(hosts, rd)


@pytest.mark.parametrize("choice", ["cancel", "detach"])
def test_ctrl_c_cancels_every_node_or_detaches_and_attach_follows_them_all(
    hosts, runs_root, tmp_path, choice
):
    rd, plan = _job(hosts, runs_root, steps=40, step_s=0.1)
    proc = start_driver(_spec(hosts, rd, plan, on_interrupt=choice), tmp_path)
    wait_for(lambda: "train line 3" in (rd.logs / "train.log").read_text(), 60, "node 0 working")
    pids = _pids(hosts, rd)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == (130 if choice == "cancel" else 0), err  # a chosen detach: exit 0
    if choice == "cancel":
        assert rd.status()["state"] == "cancelled"
        _nothing_running(hosts, rd)
        return
    assert rd.status()["state"] == "detached"
    assert all(group_alive(pid) for pid in pids)  # every node goes on
    result = cli("attach", str(rd.path))
    assert result.returncode == 0, result.stderr
    assert "train line 40" in (rd.logs / "train.log").read_text()
    for k in range(1, NODES):
        assert "stage=ray event=end status=ok" in (rd.logs / f"node-{k}" / "node.log").read_text()
    assert rd.status()["state"] == "done"
    _nothing_running(hosts, rd)


def test_reproduce_cancel_stops_every_node(hosts, runs_root, tmp_path):
    rd, plan = _job(hosts, runs_root, steps=600, step_s=0.1)
    proc = start_driver(_spec(hosts, rd, plan), tmp_path)
    wait_for(lambda: "train line 3" in (rd.logs / "train.log").read_text(), 60, "node 0 working")
    result = cli("cancel", str(rd.path))
    assert result.returncode == 0, result.stderr
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert rd.status()["state"] == "cancelled"
    _nothing_running(hosts, rd)


def test_the_budget_stops_every_node(hosts, runs_root):
    rd, plan = _job(hosts, runs_root, steps=600, step_s=0.1)
    budget = Budget(max_usd=None, max_hours=3 / 3600, price_per_hour=None, nodes=NODES)
    with pytest.raises(CheckFailed, match="budget|max-hours"):
        Runner(poll_s=0.2, measure=False).execute(plan, rd, _cluster(hosts), budget=budget)
    assert rd.status()["state"] == "cancelled"
    _nothing_running(hosts, rd)


def test_a_lost_worker_stops_the_run_on_the_others_and_is_named(hosts, runs_root):
    rd, plan = _job(hosts, runs_root, steps=600, step_s=0.1)
    runner = Runner(poll_s=0.2, reconnect_s=3, measure=False)
    lost = hosts.servers[3]

    def lose_node_3() -> None:  # the machine goes away: its sshd and its run
        wait_for(lambda: (_node_dir(hosts, 3, rd) / "pid").exists(), 60, "node 3 launched")
        wait_for(lambda: "train line 3" in (rd.logs / "train.log").read_text(), 60, "training")
        lost.stop()
        os.killpg(int((_node_dir(hosts, 3, rd) / "pid").read_text()), signal.SIGKILL)

    killer = threading.Thread(target=lose_node_3)
    killer.start()
    try:
        with pytest.raises(InfraError) as caught:
            runner.execute(plan, rd, _cluster(hosts))
    finally:
        killer.join()
        lost.start()
    message = str(caught.value)
    assert "lost node 3 (127.0.0.4)" in message and "stopped on every node" in message
    assert "node-3:ray" in {s.name for s in rd.timeline().stages}
    _nothing_running(hosts, rd)


class _TellingCluster(SSHCluster, WithNodeHealth):
    """An SSH host list whose backend can say what happened to a machine (as aws can: an
    instance EC2 terminated), asked at once when a node's script vanishes."""

    asked: list[bool]

    def lost_nodes(self, *, now: bool = False) -> list[str]:
        self.asked.append(now)
        killed = getattr(self, "killed", None)
        return [f"{killed} (i-0abc) is terminated: User initiated"] if killed and now else []


def test_a_worker_killed_with_its_machine_is_named_with_the_clusters_reason(hosts, runs_root):
    rd, plan = _job(hosts, runs_root, steps=600, step_s=0.1)
    cluster = _TellingCluster.from_profile(hosts.profile())
    cluster.asked = []
    node2 = hosts.address(2)  # an ssh node's name is its address

    def kill_node_2() -> None:  # the script is killed, no exit code written (the machine ended)
        wait_for(lambda: "train line 3" in (rd.logs / "train.log").read_text(), 60, "training")
        cluster.killed = node2  # type: ignore[attr-defined]
        os.killpg(int((_node_dir(hosts, 2, rd) / "pid").read_text()), signal.SIGKILL)

    killer = threading.Thread(target=kill_node_2)
    killer.start()
    try:
        with pytest.raises(InfraError) as caught:
            Runner(poll_s=0.2, measure=False).execute(plan, rd, cluster)
    finally:
        killer.join()
    message = str(caught.value)
    assert f"{node2} (i-0abc) is terminated: User initiated" in message, message
    assert "no exit code" in message and True in cluster.asked
    _nothing_running(hosts, rd)
