"""A node bills only while a run needs it (docs/operator.md): a launched instance ends itself a
grace after its run ends, whether or not a launcher follows it, unless --keep or a nightly lends
it to several runs; its cost is its own lifetime as AWS states it, frozen once it is gone.

The launcher's side runs on moto (the launch, its user data, `status --refresh`); the node's side
runs for real: the user data the launch sent, read back from moto, executed by bash here with a
`shutdown` stand-in on PATH (this machine must not power off). moto has no instance-side
shutdown, so the test then does what EC2 does for an instance whose InstanceInitiatedShutdown
Behavior is terminate (asserted on the request the launch sent): it terminates it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from support.aws import cluster as aws_cluster
from support.aws import ec2_of
from support.cli import completed_here
from support.helpers import wait_for

from launcher.clusters.aws.program import provisioning_calls
from launcher.records.billing import lifetime_cost
from launcher.records.rundir import RunDir, Timeline

pytestmark = pytest.mark.aws

RUN = "20261207T110000Z-e0d0e0"
PRICE = 63.296


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def launched(aws, ami, tmp_path: Path, banner, **fields):
    """A run directory (indexed) and the AwsCluster that launched its node, as a launch leaves
    them; nobody follows the run afterwards (no release)."""
    rd = RunDir.create(tmp_path / "runs", "m/h200/x", RUN)
    where = str(rd.path.relative_to(tmp_path))
    c = aws_cluster(aws, ami, tmp_path, where=where, run_id=RUN, port=banner.port, **fields)
    [node] = c.acquire()
    work = fields.get("work_dir", "/home/ubuntu/reproduce")
    rd.update_record(
        cluster=c.to_record(),
        node=asdict(node),
        node_run_dir=f"{work}/runs/{RUN}",
        container=f"reproduce-{RUN}",
        cost={"price_per_hour": PRICE, "nodes": 1, "gpus_per_node": 8},
    )
    rd.write_timeline(Timeline(acquired_at=time.time()))
    rd.set_status("detached", "detached by the user; the run goes on on the node")
    return rd, c, node.meta["instance_id"]


def user_data_of(aws, iid: str) -> str:
    got = ec2_of(aws).describe_instance_attribute(InstanceId=iid, Attribute="userData")
    return base64.b64decode(got["UserData"]["Value"]).decode()


def test_a_run_nobody_follows_ends_its_node_a_grace_after_it_ends(aws, ami, tmp_path, banner):
    work = tmp_path / "node-work"
    rd, c, iid = launched(aws, ami, tmp_path, banner, run_end_grace_s=1, work_dir=str(work))
    sent = [
        json.loads(line)
        for line in (rd.path / "aws-calls.jsonl").read_text().splitlines()
        if '"RunInstances"' in line
    ]
    assert sent[-1]["params"]["InstanceInitiatedShutdownBehavior"] == "terminate"
    script = user_data_of(aws, iid)
    node_run_dir = work / "runs" / RUN
    assert f"until [ -f {node_run_dir}/exit_code ]" in script and "-lt 1 ]" in script

    calls = _boot(script, tmp_path)  # the node boots
    try:
        time.sleep(2.5)  # the run goes on: the node does not end itself
        assert calls.read_text().splitlines() == ["-h +360 reproduce: ttl_hours reached"]
        node_run_dir.mkdir(parents=True)
        (node_run_dir / "exit_code").write_text("0\n")  # the wrapper's last word: the run ended
        wait_for(lambda: "-h now" in calls.read_text(), 15, "the node to power itself off")
    finally:
        node_run_dir.mkdir(parents=True, exist_ok=True)
        (node_run_dir / "exit_code").write_text("0\n")  # a failed test leaves no watcher
    assert calls.read_text().splitlines()[-1] == "-h now reproduce: the run ended"
    assert (
        "powering off 1 s after it or after the last read"
        in (tmp_path / "var-log" / "reproduce-run-end.log").read_text()
    )

    # EC2: an instance-initiated shutdown terminates it (InstanceInitiatedShutdownBehavior)
    ec2_of(aws).terminate_instances(InstanceIds=[iid])
    [inst] = ec2_of(aws).describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"]
    assert inst["State"]["Name"] == "terminated"

    # the launcher's side: nothing bills, and the cost is the instance's lifetime, frozen
    status = completed_here("status", RUN, "--refresh", "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["billing"] is None
    lifetime = json.loads(
        (Path(os.environ["REPRODUCE_HOME"]) / "billing" / f"{RUN}.json").read_text()
    )["lifetimes"][iid]
    expected = (lifetime["terminated_at"] - lifetime["launched_at"]) / 3600 * PRICE
    assert lifetime["launched_at"] == inst["LaunchTime"].timestamp()
    assert data["cost_usd"] == pytest.approx(expected, abs=1e-6)
    time.sleep(1.1)
    again = json.loads(completed_here("status", RUN, "--json", cwd=tmp_path).stdout)
    assert again["cost_usd"] == pytest.approx(expected, abs=1e-6)  # frozen: it is gone


def _boot(script: str, tmp_path: Path) -> Path:
    """Run the user data as the node's boot does (its logs moved off /var/log), with a
    `shutdown` that records what it was asked and a `docker` that does nothing; the calls file."""
    bin_dir, logs = tmp_path / "bin", tmp_path / "var-log"
    bin_dir.mkdir()
    logs.mkdir()
    calls = tmp_path / "shutdown.calls"
    _executable(bin_dir / "shutdown", f'#!/bin/bash\necho "$*" >> {calls}\n')
    _executable(bin_dir / "docker", "#!/bin/bash\nexit 0\n")
    boot = tmp_path / "user-data.sh"
    boot.write_text(script.replace("/var/log/", f"{logs}/"))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["bash", str(boot)], env=env, check=True, timeout=30)
    wait_for(lambda: calls.is_file(), 10, "the TTL's shutdown to be scheduled")
    return calls


def test_a_late_attach_still_reading_keeps_the_node_until_it_is_done(
    aws, ami, tmp_path, banner, monkeypatch
):
    """The grace counts from the follower's last read: an attach that came near the end of the
    grace and is still catching up is not cut off; once it stops reading, the node ends."""
    from launcher.clusters.base import Node
    from launcher.clusters.execution import Place, WrapperExecution
    from launcher.clusters.local import LocalTransport
    from launcher.runner import stream
    from launcher.runner.reporter import QuietReporter

    work = tmp_path / "node-work"
    rd, _c, iid = launched(aws, ami, tmp_path, banner, run_end_grace_s=3, work_dir=str(work))
    node_run_dir = work / "runs" / RUN
    (node_run_dir / "state").mkdir(parents=True)
    (node_run_dir / "node.log").write_bytes(b"x" * 64 + b"\n")
    calls = _boot(user_data_of(aws, iid), tmp_path)
    monkeypatch.setattr(stream, "HEARTBEAT_S", 0.5)
    execution = WrapperExecution(
        Node(name="node0", host="127.0.0.1"), LocalTransport(),
        Place(run_id=RUN, node_run_dir=str(node_run_dir), container=f"reproduce-{RUN}"),
    )  # fmt: skip
    follower = stream.Follower(
        execution, rd.path / "logs", timeline=Timeline(), reporter=QuietReporter()
    )
    try:
        (node_run_dir / "exit_code").write_text("0\n")  # the run ended; nobody followed it
        time.sleep(2)  # the attach comes late in the grace, and reads for twice the grace
        until = time.monotonic() + 6
        while time.monotonic() < until:
            follower.check()
            with (node_run_dir / "node.log").open("ab") as log:
                log.write(b"more\n")  # hours of log to catch up on, as it reads
            time.sleep(0.2)
        assert "-h now" not in calls.read_text()  # not cut off while it reads
        wait_for(lambda: "-h now" in calls.read_text(), 15, "the node to end once unread")
    finally:
        (node_run_dir / "exit_code").write_text("0\n")
        (node_run_dir / "state" / "followed").unlink(missing_ok=True)  # a failed test: no watcher
    assert (rd.path / "logs" / "node.log").stat().st_size > 65


@pytest.mark.parametrize("how", ["keep", "shared"])
def test_a_kept_or_shared_node_does_not_end_with_the_run(aws, ami, tmp_path, banner, how):
    from support.aws import load, seed_recipe

    from launcher.clusters.aws.cluster import AwsCluster

    profile = load(tmp_path, port=banner.port)
    c = AwsCluster(
        seed_recipe(), profile, RUN, session=aws, keep=how == "keep", shared=how == "shared"
    )
    assert c.settings is not None and c.settings.run_end_watch is None
    said = c.node_after_run()
    assert ("kept (--keep)" in said) if how == "keep" else ("or its TTL" in said)
    printed = provisioning_calls(
        seed_recipe(), profile, RUN, owner="t", now=c.now(), keep=how == "keep"
    )
    data = next(p.params for p in printed if p.operation == "RunInstances")["UserData"]
    assert ("exit_code" in data) == (how == "shared")  # the dry run of a plain run shows it
    plain = AwsCluster(seed_recipe(), profile, RUN, session=aws)
    assert "ends itself 10 min after the run ends" in plain.node_after_run()


def test_cost_is_the_instances_lifetime_at_the_runs_price(tmp_path):
    rd = RunDir.create(tmp_path / "runs", "m/h200/x", RUN)
    rd.update_record(cluster={"kind": "aws", "region": "us-east-1"})
    t0 = 1_790_000_000.0
    rd.write_json(
        "aws.json",
        {"kind": "aws", "region": "us-east-1", "instances": [], "targeted": [],
         "terminated": ["i-0a"], "addresses": [],
         "lifetimes": {"i-0a": {"launched_at": t0, "terminated_at": t0 + 107}}},
    )  # fmt: skip
    # a 1 min 47 s instance at $63.296/h: $1.88, whenever it is asked
    for now in (t0 + 200, t0 + 86_400):
        assert lifetime_cost(rd, RUN, PRICE, {}, now) == pytest.approx(107 / 3600 * PRICE)
    assert round(107 / 3600 * PRICE, 2) == 1.88
    # one still alive costs until now; one whose launch AWS never stated cannot be priced so
    assert lifetime_cost(rd, RUN, PRICE, {"i-0a": "running"}, t0 + 3600) == pytest.approx(PRICE)
    rd.write_json(
        "aws.json",
        {"kind": "aws", "instances": ["i-0b"], "targeted": [], "terminated": [], "addresses": []},
    )
    assert lifetime_cost(rd, RUN, PRICE, {"i-0b": "running"}, t0) is None
