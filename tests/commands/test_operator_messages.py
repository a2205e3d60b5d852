"""Messages that pointed at the wrong thing, each fixed and checked where a user meets it:
a preflight failure names the report that exists, a host without SFTP says so, cancelling a
run that ended says so, nightly keeps an invalid recipe's whole reason, and every `--json`
command prints one JSON object on stdout, bad input included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from support.helpers import cli
from support.operator_cli import REPO, SEED
from support.sshd import SshServer

from launcher.clusters.base import Node
from launcher.clusters.ssh import NoSftp, SSHCluster
from launcher.records.rundir import RunDir, Stage, Timeline
from launcher.runner.nightly import nightly
from launcher.runner.outcome import failure


def _json_cli(*args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"nothing on stdout; stderr: {proc.stderr}"
    return proc.returncode, json.loads(proc.stdout)


def test_a_failed_preflight_points_at_preflight_json_not_a_missing_log(tmp_path):
    rd = RunDir.create(tmp_path / "runs", "m/h200/x", "r1")
    (rd.path / "preflight.json").write_text(
        json.dumps({"ok": False, "checks": [{"name": "gpus", "ok": False, "detail": "7 of 8"}]})
    )
    (rd.logs / "node.log").write_text("##reproduce stage=preflight event=start t=1\n")
    timeline = Timeline(stages=[Stage("preflight", start=1, end=2, status="failed")])
    stage, err = failure(rd, timeline, 1)
    text = str(err)
    assert stage == "preflight" and err.exit_code == 3
    assert str(rd.path / "preflight.json") in text
    assert "logs/preflight.log" not in text  # it does not exist: never pointed at
    assert str(rd.logs / "node.log") in text


@pytest.fixture
def sshd_without_sftp(tmp_path):
    server = SshServer(tmp_path / "nosftp")
    config = server.root / "sshd_config"
    config.write_text(
        "".join(line for line in config.read_text().splitlines(True) if "Subsystem" not in line)
    )
    server.start()
    yield server
    server.stop()


@pytest.mark.ssh
def test_a_host_without_sftp_says_so(sshd_without_sftp):
    cluster = SSHCluster.from_profile(sshd_without_sftp.profile())
    (node,) = cluster.acquire()
    transport = cluster.transport(node)
    assert transport.run("echo commands work").stdout.strip() == "commands work"
    started = time.monotonic()
    with pytest.raises(NoSftp) as caught:
        transport.put_text("x", "/tmp/reproduce-nosftp-test")
    text = str(caught.value)
    assert "no SFTP subsystem" in text and "sshd_config" in text
    assert "lost the SSH connection" not in text and "Channel closed" not in text
    assert caught.value.exit_code == 3 and time.monotonic() - started < 10
    assert isinstance(node, Node)
    cluster.release()


def test_cancel_of_a_run_that_ended_says_so_and_changes_nothing(tmp_path):
    runs = tmp_path / "runs"
    rd = RunDir.create(runs, "m/h200/x", "20261201T000000Z-ended1")
    rd.update_record(cluster={"kind": "local"}, node={"name": "localhost"}, node_run_dir="/x")
    rd.set_status("done")
    before = (rd.path / "status.json").read_text()
    result = cli("cancel", str(rd.path))
    assert result.returncode == 0, result.stderr
    assert "had already ended" in result.stderr and "done" in result.stderr
    assert "nothing was stopped" in result.stderr
    assert "stopped the run's processes" not in result.stderr
    assert (rd.path / "status.json").read_text() == before  # still done, not "cancelled"


def test_nightly_keeps_an_invalid_recipes_whole_reason(tmp_path):
    raw = yaml.safe_load(SEED.read_text())
    raw["gpu"]["count"] = "eight"
    raw["result"]["steps_per_run"] = -3
    bad = tmp_path / "recipes" / "bad.yaml"
    bad.parent.mkdir(parents=True)
    bad.write_text(yaml.safe_dump(raw, sort_keys=False))
    lines: list[str] = []
    result = nightly(
        [bad], "local", runs_dir=tmp_path / "runs", history=tmp_path / "h.sqlite", echo=lines.append
    )
    error = result.entries[0].run.error or ""
    problems = [line.strip() for line in error.splitlines()[1:] if line.strip()]
    assert len(problems) >= 2, error  # a header line and each problem
    console = "\n".join(lines)
    summary = result.summary_path.read_text() if result.summary_path else ""
    for problem in problems:
        assert problem in console, console
        assert problem in summary, summary
    assert "gpu.count" in console and "result.steps_per_run" in console


def test_measure_json_prints_an_object_for_bad_input_too(tmp_path):
    code, out = _json_cli("measure", str(tmp_path / "missing.log"), "--json")
    assert code == 2 and "does not exist" in out["error"] and out["exit_code"] == 2
    code, out = _json_cli("measure", "--json")  # a usage error, before any command body
    assert code == 2 and "log" in out["error"].lower()
    garbage = tmp_path / "train.log"
    garbage.write_text("nothing miles would print\n")
    code, out = _json_cli("measure", str(garbage), "--recipe", str(SEED), "--json")
    assert code == 2 and out["verdict"]["status"] == "unreadable" and out["error"]


@pytest.mark.parametrize(
    "args",
    [
        ["compare", "/nonexistent/a", "/nonexistent/b", "--json"],
        ["history", "--json", "--history", "/nonexistent/dir/h.sqlite"],
        ["history", "--json", "--limit", "0", "x"],
        ["status", "no-such-run", "--json", "--runs-dir", "/nonexistent"],
        ["runs", "--json", "--bogus-option"],
        ["runs", "--live", "--json", "--cluster", "local"],
    ],
)
def test_every_json_command_prints_an_object_with_an_error(args):
    code, out = _json_cli(*args)
    assert code == 2 and isinstance(out, dict) and out["error"] and out["exit_code"] == 2


def test_version():
    result = cli("--version")
    assert result.returncode == 0
    from launcher import __version__

    assert result.stdout.strip() == f"reproduce {__version__}"


def test_refusals_leave_no_run_directory_and_no_history_row(tmp_path):
    """A used --run-id, a budget the claim exceeds: exit 2, nothing under the runs root."""
    runs = tmp_path / "runs"
    over = cli(str(SEED), "--cluster", "local", "--runs-dir", str(runs), "--max-hours", "0.0001")
    assert over.returncode == 2, over.stderr
    assert not runs.exists() or not any(runs.iterdir())
    assert not Path(runs / "history.sqlite").exists()
