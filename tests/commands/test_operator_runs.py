"""`reproduce runs`, `reproduce runs --live` (moto), `reproduce status RUN`: what was run, what is
running, and what each has cost, read back from the run directories (and, for --live, from AWS
by tag)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from support.cli import completed_here
from support.operator_cli import REPO, SEED

from launcher.records.rundir import RunDir, Stage, Timeline
from launcher.records.runs import list_runs, summarize

NOW = 1_790_000_000.0
PRICE = 63.296


def _cli(*args: str) -> subprocess.CompletedProcess:
    return completed_here(*args, cwd=REPO)


def _run(root: Path, run_id: str, *, state: str, acquired: float, released: float | None,
         stages: list[tuple[str, str]], steps: int = 0, verdict: str | None = None,
         gpu_hours: float | None = None, price: float | None = PRICE) -> RunDir:  # fmt: skip
    rd = RunDir.create(root, "qwen3-30b-a3b/h200/x-0123456789", run_id)
    rd.write_text("recipe.yaml", SEED.read_text())
    rd.write_json(
        "plan.json",
        {"profile": {"name": "aws", "kind": "aws"}, "nodes": 1, "gpus_per_node": 8},
    )
    if price is not None:
        rd.update_record(cost={"price_per_hour": price, "nodes": 1, "gpus_per_node": 8})
    t = acquired + 10
    timeline = Timeline(acquired_at=acquired, released_at=released)
    for name, status in stages:
        timeline.stages.append(Stage(name, start=t, status=status))
        t += 10
    rd.write_timeline(timeline)
    rd.logs.joinpath("train.log").write_text(
        "".join(f"(actor) - step {i}: {{'train/loss': 1.0}}\n" for i in range(steps))
    )
    if verdict is not None:
        rd.write_json("verdict.json", {"status": verdict})
    if gpu_hours is not None:
        rd.write_text("result.yaml", yaml.safe_dump({"gpu_hours": gpu_hours}))
    rd.set_status(state)
    return rd


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    _run(
        root, "20261201T090000Z-done01", state="done", acquired=NOW - 7200,
        released=NOW - 3600, stages=[("image", "ok"), ("train", "ok")], steps=20,
        verdict="reproduced", gpu_hours=1.31,
    )  # fmt: skip
    _run(
        root, "20261201T100000Z-live01", state="running", acquired=NOW - 1800,
        released=None, stages=[("image", "ok"), ("train", "running")], steps=12,
    )  # fmt: skip
    _run(
        root, "20261201T103000Z-fail01", state="failed", acquired=NOW - 900,
        released=NOW - 600, stages=[("preflight", "failed")], price=None,
    )  # fmt: skip
    return root


def test_runs_lists_every_run_with_its_cost_so_far(runs):
    found, skipped = list_runs(runs, now=NOW)
    assert skipped == []
    by_id = {s.run_id: s for s in found}
    assert [s.run_id for s in found] == sorted(by_id)  # oldest first
    done, live, failed = (by_id[k] for k in sorted(by_id))
    assert (done.state, done.verdict, done.gpu_hours) == ("done", "reproduced", 1.31)
    assert done.cost_usd == pytest.approx(PRICE)  # one hour acquired..released, at the gate's price
    assert live.state == "running" and live.stage == "train" and live.step == 12
    assert live.steps_total == 20 and live.elapsed_s == pytest.approx(1800)
    assert live.cost_usd == pytest.approx(PRICE / 2) and live.gpu_hours == pytest.approx(4.0)
    assert failed.cost_usd is None and failed.stage == "preflight"  # no price recorded: unknown
    assert done.target == "aws" and done.recipe == "qwen3-30b-a3b/h200/x-0123456789"


def test_runs_command_table_and_json(runs):
    table = _cli("runs", "--runs-dir", str(runs))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["run", "id", "recipe", "target"]
    for run_id in ("done01", "live01", "fail01"):
        assert any(run_id in line for line in lines)
    assert "running *" in table.stdout and "reproduce status RUN" in table.stdout
    as_json = _cli("runs", "--runs-dir", str(runs), "--json")
    data = json.loads(as_json.stdout)
    assert {r["state"] for r in data["runs"]} == {"done", "running", "failed"}
    assert all("cost_usd" in r and "gpu_hours" in r and "started_at" in r for r in data["runs"])


def test_status_says_stage_step_elapsed_cost_and_where_the_logs_are(runs):
    live = next(runs.glob("**/*live01"))
    result = _cli("status", "20261201T100000Z-live01", "--runs-dir", str(runs))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "stage     train" in out and "step      12 of 20" in out
    assert "elapsed" in out and "(so far)" in out and "cost      $" in out and "so far" in out
    assert f"{live}/logs/node.log" in out and f"{live}/logs/train.log" in out
    assert "no reproduce process follows it" in out and "reproduce attach" in out
    data = json.loads(_cli("status", str(live), "--json").stdout)
    assert data["stage"] == "train" and data["step"] == 12 and data["steps_total"] == 20
    assert data["logs"] == str(live / "logs") and data["followed"] is False


def test_status_of_a_run_followed_now(runs):
    import fcntl

    live = next(runs.glob("**/*live01"))
    with open(live / ".follow.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the follower holds it
        assert summarize(live).followed is True
    assert summarize(live).followed is False


def _launch(ec2, run_id: str | None, itype: str = "p5en.48xlarge") -> str:
    tags = [{"Key": "Name", "Value": "x"}]
    if run_id is not None:
        tags += [
            {"Key": "reproduce:run-id", "Value": run_id},
            {"Key": "reproduce:recipe", "Value": "qwen3-30b-a3b/h200/x-0123456789"},
            {"Key": "reproduce:owner", "Value": "tester"},
            {"Key": "reproduce:expires-at", "Value": "2026-12-01T18:00:00Z"},
        ]
    ami = ec2.register_image(Name=f"ami-for-{run_id}", RootDeviceName="/dev/sda1")["ImageId"]
    return ec2.run_instances(
        ImageId=ami,
        InstanceType=itype,
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )["Instances"][0]["InstanceId"]


def _reset(endpoint: str) -> None:
    """The moto server's accounts outlive a test: each test starts from an empty one."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"))


@pytest.mark.aws
def test_runs_live_lists_the_tools_instances_by_tag(moto_server, runs):
    import boto3

    _reset(moto_server)
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_server)
    mine = _launch(ec2, "20261201T100000Z-live01")
    ended = _launch(ec2, "20261130T000000Z-old001")
    _launch(ec2, None)  # made by hand: never listed
    ec2.terminate_instances(InstanceIds=[ended])
    result = _cli("runs", "--live", "--region", "us-east-1", "--runs-dir", str(runs), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [i["instance_id"] for i in data["instances"]] == [mine]
    (inst,) = data["instances"]
    assert inst["run_id"] == "20261201T100000Z-live01" and inst["owner"] == "tester"
    assert inst["state"] == "running" and inst["price_per_hour"] == PRICE
    assert inst["cost_usd"] is not None and inst["run_dir"].endswith("20261201T100000Z-live01")
    table = _cli("runs", "--live", "--cluster", "aws", "--runs-dir", str(runs))
    assert table.returncode == 0, table.stderr
    assert mine in table.stdout and "/h together while running" in table.stdout
    assert "reproduce down RUN" in table.stdout


@pytest.mark.aws
def test_runs_live_with_nothing_running(moto_server):
    _reset(moto_server)
    result = _cli("runs", "--live", "--region", "us-east-1")
    assert result.returncode == 0, result.stderr
    assert "no instance launched by reproduce is running in us-east-1" in result.stdout


def test_runs_of_an_empty_root_and_a_damaged_run(tmp_path):
    root = tmp_path / "runs"
    assert "no runs under" in _cli("runs", "--runs-dir", str(root)).stdout
    rd = RunDir.create(root, "m/h/x", "20261201T000000Z-bad001")
    (rd.path / "status.json").write_text("{not json")
    result = _cli("runs", "--runs-dir", str(root))
    assert (
        result.returncode == 0 and "skipped" in result.stdout and "not valid JSON" in result.stdout
    )
    assert time.time() > 0
