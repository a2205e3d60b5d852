"""The shared runner on this host (`--cluster local`): detach, stream by offset, stages, timeline,
exit codes, attach after the launcher died, cancel and Ctrl-C. Real processes, no mocks."""

from __future__ import annotations

import json
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
from support.nodescript import job

from launcher.clusters.local import LocalCluster
from launcher.errors import InfraError
from launcher.records.rundir import RunDir
from launcher.runner.runner import Runner


def _job(tmp_path: Path, runs_root: Path, body: str):
    rd, plan = job(runs_root, tmp_path / "node", body)
    return rd, plan.node_run_dir, plan.container, plan.node_script


def _run(tmp_path, runs_root, body, **kw):
    rd, plan = job(runs_root, tmp_path / "node", body)
    scripts = tmp_path / "scripts"
    scripts.mkdir(exist_ok=True)
    (scripts / "preflight.py").write_text("print('preflight')\n")
    runner = Runner(scripts_dir=scripts, poll_s=0.1, measure=False)
    outcome = runner.execute(plan, rd, LocalCluster(), **kw)
    assert_log_collected(rd.path)
    return rd, plan.node_run_dir, outcome


def test_run_streams_log_byte_for_byte_and_splits_stages(tmp_path, runs_root):
    rd, node_dir, outcome = _run(tmp_path, runs_root, slow_script_body(lines=20, delay_s=0.01))
    assert outcome.state == "done" and outcome.exit_code == 0
    assert (rd.logs / "node.log").read_bytes() == Path(node_dir, "node.log").read_bytes()
    train = (rd.logs / "train.log").read_text().splitlines()
    assert (
        len(train) == 40 and train[0].startswith("train line 1 ") and train[-1] == "partial-20 done"
    )
    assert sum(line.startswith("train line ") for line in train) == 20
    assert (rd.logs / "preflight.log").read_text() == "preflight says hello\n"
    assert not any("##reproduce" in line for line in train)
    timeline = json.loads((rd.path / "timeline.json").read_text())
    assert [s["name"] for s in timeline["stages"]] == ["preflight", "train"]
    assert all(s["status"] == "ok" and s["end"] >= s["start"] for s in timeline["stages"])
    assert timeline["acquired_at"] <= timeline["stages"][0]["start"] <= timeline["released_at"]
    status = rd.status()
    assert status["state"] == "done" and status["complete"] is True
    assert json.loads((rd.path / "preflight.json").read_text()) == {
        "ok": True
    }  # collected from the node
    assert Path(node_dir, "scripts", "preflight.py").is_file()  # scripts/ staged next to node.sh
    assert Path(node_dir, "exit_code").read_text().strip() == "0"
    record = rd.record()
    assert record["node_run_dir"] == node_dir and record["container"].startswith("reproduce-")
    wait_for(lambda: not group_alive(record["pid"]), 10, "the wrapper to exit")


def test_failing_stage_is_exit_3_naming_the_stage_and_not_complete(tmp_path, runs_root):
    body = '_mark image start; echo "pulling"; echo "manifest unknown" >&2; exit 7\n'
    with pytest.raises(InfraError) as err:
        _run(tmp_path, runs_root, body)
    assert err.value.exit_code == 3
    assert (
        "stage image" in str(err.value)
        and "exit code 7" in str(err.value)
        and "manifest unknown" in str(err.value)
    )
    rd = RunDir(next(runs_root.glob("test/local/*")))
    assert rd.status()["state"] == "failed" and rd.status()["complete"] is False
    stages = rd.timeline().stages
    assert stages[-1].name == "image" and stages[-1].status == "failed"
    assert (rd.logs / "train.log").exists() and (rd.logs / "train.log").read_text() == ""


def test_run_survives_launcher_death_and_attach_continues_exactly(tmp_path, runs_root):
    rd, node_dir, container, text = _job(
        tmp_path, runs_root, slow_script_body(lines=80, delay_s=0.03)
    )
    proc = start_driver(
        {
            "cluster": {"kind": "local"},
            "node_script": text,
            "run_id": rd.run_id,
            "node_run_dir": node_dir,
            "container": container,
            "run_dir": str(rd.path),
            "poll_s": 0.05,
        },
        tmp_path,
    )
    wait_for(
        lambda: (rd.logs / "train.log").exists() and (rd.logs / "train.log").stat().st_size > 3000,
        what="the launcher to stream some training output",
    )
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher dies without a word
    proc.wait()
    pid = rd.record()["pid"]
    assert group_alive(pid), "the node script must outlive the launcher"
    assert rd.status()["state"] == "running"
    result = cli("attach", str(rd.path), "--on-interrupt", "cancel")
    assert result.returncode == 0, result.stderr
    node_log = Path(node_dir, "node.log").read_bytes()
    assert (rd.logs / "node.log").read_bytes() == node_log
    assert (rd.logs / "train.log").read_text().count("train line ") == 80
    assert rd.status()["state"] == "done"
    from launcher.records.history import runs as history_runs

    # the run ended while attached, so attach added it to the user's history (state directory)
    home = Path(os.environ["REPRODUCE_HOME"])
    assert [r.run_id for r in history_runs("test/local", db=home / "history.sqlite")] == [rd.run_id]
    assert not (runs_root / "history.sqlite").exists()


def test_cancel_stops_the_process_group_and_nothing_else(tmp_path, runs_root):
    body = "_mark train start\nsleep 300 & wait\n"
    rd, node_dir, container, text = _job(tmp_path, runs_root, body)
    bystander = os.spawnlp(
        os.P_NOWAIT, "sleep", "sleep", "300"
    )  # not ours: must survive the cancel
    try:
        proc = start_driver(
            {
                "cluster": {"kind": "local"},
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
        result = cli("cancel", rd.run_id, "--runs-dir", str(runs_root))
        assert result.returncode == 0, result.stderr
        assert not group_alive(pid)
        assert rd.status()["state"] == "cancelled"
        assert Path(node_dir, "exit_code").exists()
        os.kill(bystander, 0)  # still alive
    finally:
        os.kill(bystander, signal.SIGKILL)
        os.waitpid(bystander, 0)


@pytest.mark.parametrize("choice", ["cancel", "detach"])
def test_ctrl_c_cancels_or_detaches_and_says_so(tmp_path, runs_root, choice):
    body = "_mark train start\nfor i in $(seq 600); do echo tick $i; sleep 0.1; done\n"
    rd, node_dir, container, text = _job(tmp_path, runs_root, body)
    proc = start_driver(
        {
            "cluster": {"kind": "local"},
            "node_script": text,
            "run_id": rd.run_id,
            "node_run_dir": node_dir,
            "container": container,
            "run_dir": str(rd.path),
            "on_interrupt": choice,
            "poll_s": 0.05,
        },
        tmp_path,
    )
    wait_for(
        lambda: (
            (rd.logs / "train.log").exists() and b"tick 3" in (rd.logs / "train.log").read_bytes()
        ),
        what="training output",
    )
    pid = rd.record()["pid"]
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == (130 if choice == "cancel" else 0)  # a chosen detach: no error
    if choice == "cancel":
        assert "cancelled" in stderr
        assert not group_alive(pid)
        assert rd.status()["state"] == "cancelled"
    else:
        assert "reproduce attach" in stderr and "reproduce cancel" in stderr
        assert group_alive(pid)
        assert rd.status()["state"] == "detached" and rd.status()["complete"] is False
        assert cli("cancel", str(rd.path)).returncode == 0
        assert not group_alive(pid)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_cancels_even_when_detach_was_chosen(tmp_path, runs_root, signame):
    """Nobody is there to ask (the terminal closed, a scheduler stopped the job): cancel."""
    body = "_mark train start\nsleep 300\n"
    rd, node_dir, container, text = _job(tmp_path, runs_root, body)
    proc = start_driver(
        {
            "cluster": {"kind": "local"},
            "node_script": text,
            "run_id": rd.run_id,
            "node_run_dir": node_dir,
            "container": container,
            "run_dir": str(rd.path),
            "on_interrupt": "detach",
        },
        tmp_path,
    )
    wait_for(lambda: rd.status().get("state") == "running", what="the run to start")
    pid = rd.record()["pid"]
    time.sleep(0.3)
    proc.send_signal(getattr(signal, signame))
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert not group_alive(pid) and rd.status()["state"] == "cancelled"


def test_attach_to_a_finished_run_is_refused(tmp_path, runs_root):
    rd, _, _ = _run(tmp_path, runs_root, "echo done\n")
    result = cli("attach", str(rd.path))
    assert result.returncode == 2 and "already ended" in result.stderr
    assert cli("attach", "nosuchrun", "--runs-dir", str(runs_root)).returncode == 2


def test_secrets_reach_the_node_once_and_never_the_run_dir(tmp_path, runs_root):
    import hashlib

    digest = hashlib.sha256(b"hf_s3cr3t 'x").hexdigest()  # the script must not hold the secret
    body = (
        "if [ -f .secrets.env ]; then set -a; . ./.secrets.env; set +a; rm -f .secrets.env; fi\n"
        f'_mark train start\n[ "$(printf %s "$HF_TOKEN" | sha256sum | cut -d" " -f1)" = {digest} ] && echo token-arrived\n'
    )
    rd, plan = job(runs_root, tmp_path / "node", body)
    node_dir = plan.node_run_dir
    Runner(poll_s=0.1, measure=False).execute(
        plan, rd, LocalCluster(), secrets={"HF_TOKEN": "hf_s3cr3t 'x"}
    )
    assert (rd.logs / "train.log").read_text() == "token-arrived\n"
    assert not Path(node_dir, ".secrets.env").exists()
    for path in rd.path.rglob("*"):
        if path.is_file():
            assert b"hf_s3cr3t" not in path.read_bytes(), path
