"""Messages about money that say what happened: "nothing was created" when a launch stopped at its
first AWS call; `down` without credentials in its own words; the Ctrl-C question shows its
default ([C/d]), takes one key, and a detach is what the person asked for (exit 0, with how to
follow, take back or stop the run), seen in a real terminal (tmux)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from support.helpers import group_alive, start_driver, wait_for
from support.nodescript import job
from support.operator_cli import SEED, RecordingEndpoint, aws_env, run_piped
from support.paths import REPO
from support.screen import Screen

from launcher.clusters.contract import WithDownCommand, WithNodeAfterRun
from launcher.commands.console import interrupt_choice
from launcher.records.rundir import RunDir, Timeline

PRICE_READ = "AWSPriceListService.GetProducts"  # read-only, before the cost is shown


@pytest.fixture
def endpoint():
    server = RecordingEndpoint().start()
    yield server
    server.stop()


def test_a_launch_stopped_at_its_first_aws_call_says_nothing_was_created(endpoint, tmp_path):
    runs = tmp_path / "runs"
    result = run_piped(
        [str(SEED), "--cluster", "aws", "--runs-dir", str(runs), "--yes"],
        aws_env(endpoint, tmp_path),
    )
    said = result.stdout + result.stderr
    assert result.returncode == 3, said
    assert "aws: nothing was created" in said
    assert "teardown did not finish" not in said and "reproduce down" not in said
    calls = [r.split()[1].split("&")[0] for r in endpoint.requests]
    price_reads = [c for c in calls if c == PRICE_READ]  # the cost gate's, before the launch
    assert calls[len(price_reads) :] == ["Action=GetCallerIdentity"], calls
    # the launch's one call: no search by tag for what was never made


def test_down_without_credentials_says_down_ended_nothing(tmp_path):
    rd = RunDir.create(tmp_path / "runs", "m/h/x", "20261201T000000Z-down02")
    rd.update_record(cluster={"kind": "aws", "region": "us-east-1", "keep": True})
    rd.write_json(
        "aws.json",
        {"kind": "aws", "region": "us-east-1", "run_id": rd.run_id, "instances": ["i-1"],
         "targeted": [], "terminated": [], "addresses": []},
    )  # fmt: skip
    result = run_piped(["down", rd.run_id], aws_env(None, tmp_path, credentials=False))
    assert result.returncode == 2, result.stderr
    assert "no AWS credentials found, so `reproduce down` ended nothing" in result.stderr
    assert "nothing was launched" not in result.stderr and "Traceback" not in result.stderr


def test_the_question_takes_one_key_and_enter_is_its_default():
    assert interrupt_choice(iter(["d"])) == "detach"
    assert interrupt_choice(iter(["D"])) == "detach"
    assert interrupt_choice(iter(["\r"])) == "cancel"  # Enter: the [C] default
    assert interrupt_choice(iter(["\n"])) == "cancel"
    assert interrupt_choice(iter(["x", "?", "d"])) == "detach"  # not an answer: asked on
    assert interrupt_choice(iter([""])) == "cancel"  # end of input


def _detached_run(tmp_path: Path, runs_root: Path):
    """A local run going on with nobody following it (its launcher was killed)."""
    body = "_mark train start\nfor i in $(seq 3000); do echo tick $i; sleep 0.1; done\n"
    rd, plan = job(runs_root, tmp_path / "node", body)
    proc = start_driver(
        {"cluster": {"kind": "local"}, "node_script": plan.node_script, "run_id": rd.run_id,
         "node_run_dir": plan.node_run_dir, "container": plan.container,
         "run_dir": str(rd.path), "poll_s": 0.05},
        tmp_path,
    )  # fmt: skip
    wait_for(lambda: b"tick 3" in (rd.logs / "train.log").read_bytes(), what="training output")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return rd


def test_ctrl_c_then_d_detaches_with_exit_0_and_enter_cancels(tmp_path, runs_root):
    rd = _detached_run(tmp_path, runs_root)
    pid = int(rd.record()["pid"])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    attach = [sys.executable, "-m", "launcher", "attach", rd.run_id]
    screen = Screen(tmp_path / "t1").start(attach, env, tmp_path)
    try:
        screen.wait_for("reattaching to")
        wait_for(lambda: Path(rd.path, ".follow.lock").exists(), what="attach following")
        screen.keys("C-c")
        shown = screen.wait_for("[C/d]")
        assert "[C]ancel the run on the node (Enter), or [d]etach" in shown
        screen.keys("d")  # one key: no Enter
        assert screen.exit_code(60) == 0
        shown = screen.screen()
    finally:
        screen.stop()
    assert f"detached: run {rd.run_id} goes on on the node" in shown
    assert f"reproduce logs {rd.run_id} --follow" in shown
    assert f"reproduce attach {rd.run_id}" in shown and f"reproduce cancel {rd.run_id}" in shown
    assert "error:" not in shown
    assert group_alive(pid) and rd.status()["state"] == "detached"

    screen = Screen(tmp_path / "t2").start(attach, env, tmp_path)
    try:
        screen.wait_for("reattaching to")
        screen.keys("C-c")
        screen.wait_for("[C/d]")
        screen.keys("Enter")  # the default
        assert screen.exit_code(60) == 130
        shown = screen.screen()
    finally:
        screen.stop()
    assert "cancelled" in shown
    wait_for(lambda: not group_alive(pid), 30, "the run to end")
    assert rd.status()["state"] == "cancelled"


def test_a_kept_runs_detach_message_says_it_bills(tmp_path):
    from launcher.runner.outcome import detached_message

    rd = RunDir.create(tmp_path / "runs", "m/h/x", "20261201T000000Z-det001")
    rd.update_record(cost={"price_per_hour": 63.296, "nodes": 2})
    rd.write_timeline(Timeline())

    class Paid(WithDownCommand):
        def down_command(self) -> str:
            return "reproduce down X"

    text = detached_message(rd, Paid())
    assert "its node keeps billing (about $126.59/h) while it runs" in text

    class Ends(Paid, WithNodeAfterRun):
        def node_after_run(self) -> str:
            return "it ends itself 10 min after the run ends"

    said = detached_message(rd, Ends())
    assert "while it runs: it ends itself 10 min after the run ends" in said
    assert "keeps billing" not in detached_message(rd, object())
