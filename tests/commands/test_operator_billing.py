"""What is billing: a run whose node still exists (kept, failed without teardown, detached) shows
its node and its cost so far in `runs` and `status`, from the last known state (marked) or from
AWS (`--refresh`, a moto server here); `status` of a run nobody follows reads its node's log;
`runs --cost` sums what was paid per run, by recipe, by cluster and in total."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from support.cli import completed_here
from support.helpers import start_driver, wait_for
from support.nodescript import job
from support.paths import REPO

from launcher.records.rundir import RunDir, Timeline
from launcher.records.runs import summarize

PRICE = 63.296
NOW = 1_790_000_000.0


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return completed_here(*args, cwd=cwd)


def _aws_run(root: Path, run_id: str, *, state: str, instances: list[str],
             terminated: list[str] = (), acquired: float, released: float | None,
             slug: str = "m/h/a-0123456789", profile: str = "aws", keep: bool = True,
             price: float | None = PRICE) -> RunDir:  # fmt: skip
    rd = RunDir.create(root, slug, run_id)
    rd.write_json("plan.json", {"profile": {"name": profile, "kind": "aws"}, "nodes": 1})
    rd.update_record(
        cluster={"kind": "aws", "region": "us-east-1", "keep": keep},
        cost={"price_per_hour": price, "nodes": 1, "gpus_per_node": 8} if price else None,
    )
    rd.write_json(
        "aws.json",
        {"kind": "aws", "region": "us-east-1", "instances": instances, "targeted": [],
         "terminated": list(terminated), "addresses": []},
    )  # fmt: skip
    rd.write_timeline(Timeline(acquired_at=acquired, released_at=released))
    rd.set_status(state, "training failed" if state == "failed" else None)
    return rd


def test_a_kept_failed_run_shows_its_node_billing_until_now(tmp_path):
    root = tmp_path / "runs"
    kept = _aws_run(root, "20261201T090000Z-kept01", state="failed", instances=["i-0kept"],
                    acquired=NOW - 3600, released=NOW - 3588)  # fmt: skip
    gone = _aws_run(root, "20261201T091000Z-gone01", state="done", instances=["i-0gone"],
                    terminated=["i-0gone"], acquired=NOW - 3600, released=NOW - 1800,
                    keep=False)  # fmt: skip
    s = summarize(kept.path, now=NOW)
    assert s.billing is not None and s.holds_node and s.billing.source == "last known"
    assert s.billing.instances == {"i-0kept": "not terminated"}
    assert s.cost_usd == pytest.approx(PRICE)  # an hour so far, not the 12 s until the release
    g = summarize(gone.path, now=NOW)
    assert g.billing is None and g.cost_usd == pytest.approx(PRICE / 2)
    table = _cli("runs", cwd=tmp_path).stdout
    assert "failed, node billing?" in table and "so far" in table
    assert "still billing: 1 run(s) hold a node, $63.30/h together" in table
    assert "reproduce down 20261201T090000Z-kept01" in table and "--refresh" in table
    status = _cli("status", kept.run_id, cwd=tmp_path).stdout
    assert "node      i-0kept not terminated (last known, from aws.json" in status
    assert re.search(r", up \d+h\d\dm, \$63\.30/h: still billing", status)
    assert "$63.30/h: still billing, end it with `reproduce down" in status
    data = json.loads(_cli("status", kept.run_id, "--json", cwd=tmp_path).stdout)
    assert data["billing"]["instances"] == {"i-0kept": "not terminated"}
    assert data["billing"]["per_hour"] == PRICE


def _reset(endpoint: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"))


@pytest.mark.aws
def test_refresh_asks_aws_and_the_answer_is_the_next_last_known(moto_server, tmp_path):
    import boto3

    _reset(moto_server)
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_server)
    ami = ec2.register_image(Name="ami-for-billing", RootDeviceName="/dev/sda1")["ImageId"]
    live = ec2.run_instances(ImageId=ami, InstanceType="p5en.48xlarge", MinCount=1, MaxCount=1)
    live_id = live["Instances"][0]["InstanceId"]
    rd = _aws_run(tmp_path / "runs", "20261201T090000Z-kept02", state="detached",
                  instances=[live_id, "i-0000000000000dead"], acquired=NOW - 60,
                  released=None)  # fmt: skip
    asked = json.loads(_cli("runs", "--refresh", "--json", cwd=tmp_path).stdout)
    (run,) = asked["runs"]
    assert run["billing"]["source"] == "cloud"
    assert run["billing"]["instances"] == {live_id: "running"}  # the unknown id: long gone
    later = _cli("status", rd.run_id, cwd=tmp_path).stdout
    assert f"{live_id} running (last known: AWS said so at" in later
    ec2.terminate_instances(InstanceIds=[live_id])
    again = json.loads(_cli("status", rd.run_id, "-r", "--json", cwd=tmp_path).stdout)
    assert again["billing"] is None
    assert "still billing" not in _cli("runs", cwd=tmp_path).stdout


def test_refresh_without_credentials_says_what_did_not_happen(tmp_path):
    _aws_run(tmp_path / "runs", "20261201T090000Z-kept03", state="failed", instances=["i-1"],
             acquired=NOW - 60, released=NOW - 30)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                "AWS_EC2_METADATA_DISABLED": "true", "PYTHONPATH": str(REPO)})  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "launcher", "runs", "--refresh"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "AWS was not asked" in result.stderr
    assert "nothing was launched" not in result.stderr


def test_cost_report_per_run_by_recipe_by_cluster_and_in_total(tmp_path):
    root = tmp_path / "runs"
    _aws_run(root, "20261201T010000Z-c1", state="done", instances=["i-1"], terminated=["i-1"],
             acquired=NOW - 7200, released=NOW - 3600, slug="m/h/a-1")  # fmt: skip
    _aws_run(root, "20261201T020000Z-c2", state="done", instances=["i-2"], terminated=["i-2"],
             acquired=NOW - 3600, released=NOW - 1800, slug="m/h/b-2", profile="aws-east")  # fmt: skip
    _aws_run(root, "20261201T030000Z-c3", state="failed", instances=["i-3"], terminated=["i-3"],
             acquired=NOW - 600, released=NOW - 300, slug="m/h/a-1", price=None)  # fmt: skip
    data = json.loads(_cli("runs", "--cost", "--json", cwd=tmp_path).stdout)
    assert [r["run_id"] for r in data["runs"]] == [
        "20261201T010000Z-c1", "20261201T020000Z-c2", "20261201T030000Z-c3"]  # fmt: skip
    total = data["total"]
    assert total["runs"] == 3 and total["unpriced"] == 1
    assert total["usd"] == pytest.approx(PRICE * 1.5)
    by_recipe = {g["key"]: g for g in data["by_recipe"]}
    assert by_recipe["m/h/a-1"]["usd"] == pytest.approx(PRICE) and by_recipe["m/h/a-1"]["runs"] == 2
    assert by_recipe["m/h/b-2"]["usd"] == pytest.approx(PRICE / 2)
    by_cluster = {g["key"]: g for g in data["by_cluster"]}
    assert set(by_cluster) == {"aws", "aws-east"}
    assert sum(g["usd"] for g in data["by_cluster"]) == pytest.approx(total["usd"])
    text = _cli("runs", "--cost", cwd=tmp_path).stdout
    assert "by recipe:" in text and "by cluster:" in text and "$94.94" in text
    assert "1 run(s) without a price: not counted" in text


def test_status_of_a_run_nobody_follows_reads_its_node(tmp_path, runs_root):
    body = """_mark train start
for i in $(seq 0 400); do echo "(actor) - step $i: {'train/loss': 1.0}"; sleep 0.02; done
_mark train end ok
"""
    rd, plan = job(runs_root, tmp_path / "node", body)
    proc = start_driver(
        {"cluster": {"kind": "local"}, "node_script": plan.node_script, "run_id": rd.run_id,
         "node_run_dir": plan.node_run_dir, "container": plan.container,
         "run_dir": str(rd.path), "poll_s": 0.05},
        tmp_path,
    )  # fmt: skip
    wait_for(lambda: b"step 3:" in (rd.logs / "train.log").read_bytes(), what="a few steps")
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher died: the local copy stops growing
    proc.wait()
    node_log = Path(plan.node_run_dir, "node.log")
    local_steps = (rd.logs / "train.log").read_bytes().count(b"step ")
    wait_for(lambda: node_log.read_bytes().count(b"step ") > local_steps + 20, what="the node")
    data = json.loads(_cli("status", rd.run_id, "--json", cwd=tmp_path).stdout)
    assert data["progress_from"] == "node" and data["stage"] == "train"
    assert data["step"] > local_steps + 20  # the node's step, not the copy's
    text = _cli("status", rd.run_id, cwd=tmp_path).stdout
    assert "(read from the node now)" in text
    assert (rd.logs / "train.log").read_bytes().count(b"step ") == local_steps  # nothing taken
    os.killpg(int(rd.record()["pid"]), signal.SIGKILL)
