"""The shared runner over real SSH: the run survives a dropped connection and the launcher's
death; `attach` continues exactly (local log == node log, byte for byte); `cancel` ends it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from support.helpers import (
    assert_log_collected,
    cli,
    group_alive,
    slow_script_body,
    start_driver,
    wait_for,
)
from support.nodescript import job, plan_running
from support.sshd import SshServer

from launcher.clusters.ssh import SSHCluster
from launcher.errors import InfraError
from launcher.records.rundir import RunDir
from launcher.runner.runner import Runner

pytestmark = pytest.mark.ssh


def _job(tmp_path: Path, runs_root: Path, body: str):
    # the "node" is this host, reached over SSH
    rd, plan = job(runs_root, tmp_path / "node", body, slug="test/ssh")
    return rd, plan.node_run_dir, plan.container, plan.node_script


def _execute(cluster, rd: RunDir, node_dir: str, text: str, **settings):
    """The runner on `cluster`, following the node script `text` in `node_dir`."""
    plan = plan_running(rd.run_id, node_dir, text)
    outcome = Runner(measure=False, **settings).execute(plan, rd, cluster)
    assert_log_collected(rd.path)
    return outcome


def _train_bytes(rd: RunDir) -> int:
    path = rd.logs / "train.log"
    return path.stat().st_size if path.exists() else 0


def test_dropped_connection_mid_run_loses_and_doubles_nothing(sshd, tmp_path, runs_root):
    rd, node_dir, container, text = _job(
        tmp_path, runs_root, slow_script_body(lines=60, delay_s=0.04)
    )
    cluster = SSHCluster.from_profile(sshd.profile())
    import threading

    dropped = []

    def dropper() -> None:
        wait_for(lambda: _train_bytes(rd) > 4000, what="some streamed output")
        dropped.append(sshd.drop_connections())
        time.sleep(0.5)
        dropped.append(sshd.drop_connections())

    thread = threading.Thread(target=dropper)
    thread.start()
    outcome = _execute(cluster, rd, node_dir, text, poll_s=0.05, reconnect_s=20)
    thread.join()
    assert dropped and dropped[0] >= 1
    assert outcome.state == "done"
    assert (rd.logs / "node.log").read_bytes() == Path(node_dir, "node.log").read_bytes()
    train = (rd.logs / "train.log").read_text().splitlines()
    assert [int(line.split()[2]) for line in train if line.startswith("train line")] == list(
        range(1, 61)
    )


def test_launcher_killed_and_connection_dropped_then_attach(sshd, tmp_path, runs_root):
    rd, node_dir, container, text = _job(
        tmp_path, runs_root, slow_script_body(lines=100, delay_s=0.03)
    )
    proc = start_driver(
        {
            "cluster": SSHCluster.from_profile(sshd.profile()).to_record(),
            "node_script": text,
            "run_id": rd.run_id,
            "node_run_dir": node_dir,
            "container": container,
            "run_dir": str(rd.path),
            "poll_s": 0.05,
        },
        tmp_path,
    )
    wait_for(lambda: _train_bytes(rd) > 5000, what="some streamed output")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    sshd.drop_connections()
    pid = rd.record()["pid"]
    assert group_alive(pid), "the node script must survive the launcher and the connection"
    stopped_at = (rd.logs / "node.log").stat().st_size
    result = cli("attach", rd.run_id, "--runs-dir", str(runs_root), "--on-interrupt", "cancel")
    assert result.returncode == 0, result.stderr
    assert f"at byte {stopped_at}" in result.stderr
    assert (rd.logs / "node.log").read_bytes() == Path(node_dir, "node.log").read_bytes()
    train = (rd.logs / "train.log").read_text().splitlines()
    assert [int(line.split()[2]) for line in train if line.startswith("train line")] == list(
        range(1, 101)
    )
    assert rd.status()["state"] == "done" and rd.timeline().released_at is not None


def test_node_unreachable_mid_run_detaches_with_a_hint_then_attach_finishes(tmp_path, runs_root):
    server = SshServer(tmp_path / "own_sshd").start()
    try:
        rd, node_dir, container, text = _job(
            tmp_path, runs_root, slow_script_body(lines=120, delay_s=0.03)
        )
        cluster = SSHCluster.from_profile(server.profile(connect_timeout_s=1))
        import threading

        def outage() -> None:
            wait_for(lambda: _train_bytes(rd) > 3000, what="some streamed output")
            server.stop()  # listener and connections gone: the node is unreachable

        thread = threading.Thread(target=outage)
        thread.start()
        t0 = time.monotonic()
        with pytest.raises(InfraError) as err:
            _execute(cluster, rd, node_dir, text, poll_s=0.05, reconnect_s=2)
        thread.join()
        assert time.monotonic() - t0 < 30
        assert err.value.exit_code == 3
        assert "reproduce attach" in str(err.value) and "reproduce cancel" in str(err.value)
        assert rd.status()["state"] == "detached"
        assert group_alive(rd.record()["pid"])
        server.start()  # the network is back
        result = cli("attach", str(rd.path))
        assert result.returncode == 0, result.stderr
        assert (rd.logs / "node.log").read_bytes() == Path(node_dir, "node.log").read_bytes()
        assert rd.status()["state"] == "done"
    finally:
        server.stop()


def test_cancel_over_ssh_leaves_nothing_of_the_run(sshd, tmp_path, runs_root):
    body = "_mark train start\n( sleep 300; echo never ) &\nsleep 300\n"
    rd, node_dir, container, text = _job(tmp_path, runs_root, body)
    proc = start_driver(
        {
            "cluster": SSHCluster.from_profile(sshd.profile()).to_record(),
            "node_script": text,
            "run_id": rd.run_id,
            "node_run_dir": node_dir,
            "container": container,
            "run_dir": str(rd.path),
        },
        tmp_path,
    )
    wait_for(lambda: rd.status().get("state") == "running", what="the run to start")
    pid = rd.record()["pid"]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    result = cli("cancel", str(rd.path))
    assert result.returncode == 0, result.stderr
    assert not group_alive(pid)
    assert rd.status()["state"] == "cancelled"
    assert rd.timeline().stages[-1].status == "cancelled"
