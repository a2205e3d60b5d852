"""One launch program, three modes: what the dry run prints is what a launch sends, in order.

A real AwsCluster launches against moto (the AMI resolved from an SSM parameter, as with the
default profile); the calls it sent are read back from the run directory's aws-calls.jsonl and
compared with the dry run's list for the same recipe, profile, run id, owner and clock: the same
operations in the same order, and every printed value that is not a `<placeholder>` sent as
printed. A poll (waiting until running, until status ok) is one printed call sent several times.

The 4-node case launches into a moto subnet of 127.0.0.0/24 and reaches its nodes over real sshd
(the head on 127.0.0.1, the others at 127.0.0.5-7 through it: tests/support/aws.py). moto keeps
no placement group (the recording session's stand-in does) and only the first network card of
each instance, so what is compared for those is what the launcher sent.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from support.aws import (
    NOTHING,
    live_resources,
    live_with_operator_key,
    load,
    multinode_fields,
    nodes_recipe,
    seed_recipe,
)

from launcher.clusters.aws import provisioning_calls
from launcher.clusters.aws.cluster import AwsCluster, check
from launcher.clusters.aws.requests import is_placeholder
from launcher.clusters.aws.session import CallLog

pytestmark = pytest.mark.aws
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PARAMETER = "/reproduce-test/dlami"
RESERVATION = {
    "CapacityReservationId": "cr-0123456789abcdef0",
    "InstanceType": "p5en.48xlarge",
    "AvailabilityZone": "us-east-1b",
    "State": "active",
    "AvailableInstanceCount": 2,
}


def matches(printed, sent) -> bool:
    """Every printed value equals the sent one, except placeholders (which stand for anything,
    also inside a string: a name made of the run id and the launch id)."""
    if is_placeholder(printed):
        return True
    if isinstance(printed, str) and re.search(r"<[^<>]+>", printed):
        pattern = ".+".join(re.escape(part) for part in re.split(r"<[^<>]+>", printed))
        return isinstance(sent, str) and re.fullmatch(pattern, sent) is not None
    if isinstance(printed, dict):
        return (
            isinstance(sent, dict)
            and printed.keys() == sent.keys()
            and all(matches(v, sent[k]) for k, v in printed.items())
        )
    if isinstance(printed, list):
        if len(printed) == 1 and is_placeholder(printed[0]):
            return isinstance(sent, list) and len(sent) >= 1  # e.g. "<launched instances>"
        return (
            isinstance(sent, list)
            and len(printed) == len(sent)
            and all(matches(p, s) for p, s in zip(printed, sent, strict=True))
        )
    return printed == sent


def polls_once(sent: list[dict]) -> list[dict]:
    """Consecutive identical calls (a wait polling) as one."""
    out: list[dict] = []
    for call in sent:
        key = (call["service"], call["operation"], json.dumps(call["params"], sort_keys=True))
        if out and out[-1]["key"] == key:
            continue
        out.append({**call, "key": key})
    return out


CASES = {
    "one node": lambda tmp: (seed_recipe(), {}),
    "four nodes": lambda tmp: (nodes_recipe(tmp, 4), {}),
    "capacity block": lambda tmp: (
        seed_recipe(),
        {
            "capacity": {"type": "capacity-block", "reservation_id": "cr-0123456789abcdef0"},
            "efa_layout": "ena-primary",
        },
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_launch_sends_what_the_dry_run_printed_in_order(
    aws, ami, tmp_path, banner, case, request
):
    aws._real.client("ssm").put_parameter(Name=PARAMETER, Value=ami, Type="String")
    aws.canned["describe_capacity_reservations"] = {"CapacityReservations": [RESERVATION]}
    recipe, fields = CASES[case](tmp_path)
    fields = {"port": banner.port, **fields}
    if recipe.nodes > 1:  # real sshd: the workers are reached through the head
        fields.update(multinode_fields(aws, request.getfixturevalue("loopback_nodes")))
    profile = load(tmp_path, ami=f"ssm:{PARAMETER}", **fields)
    printed = provisioning_calls(recipe, profile, "p1", owner="alice", now=NOW)

    cluster = AwsCluster(
        recipe,
        profile,
        "p1",
        session=aws,
        state_path=tmp_path / "run" / "aws.json",
        key_dir=tmp_path / "keys",
        poll_s=0.01,
        owner="alice",
        now=lambda: NOW,
    )
    nodes = cluster.acquire()
    assert len(nodes) == recipe.nodes
    record = tmp_path / "run" / "aws-calls.jsonl"
    sent = polls_once([json.loads(line) for line in record.read_text().splitlines()])

    assert [(c["service"], c["operation"]) for c in sent] == [
        (c.service, c.operation) for c in printed
    ]
    for p, s in zip(printed, sent, strict=True):
        assert matches(p.params, s["params"]), (p.operation, p.params, s["params"])
        assert s["error"] is None
    assert "GetParameter" in [c.operation for c in printed]  # the SSM lookup is sent and recorded
    assert "PRIVATE KEY" not in record.read_text() and "KeyMaterial" not in record.read_text()

    cluster.release()
    assert live_with_operator_key(aws._real.client("ec2")) == NOTHING
    after = [json.loads(line)["operation"] for line in record.read_text().splitlines()]
    assert "TerminateInstances" in after[len(sent) :]  # the teardown's calls are recorded too


def test_check_sends_the_same_program_with_dry_run(aws, ami, tmp_path):
    """--check: the lookups for real, the creating calls with DryRun=True, in the printed order."""
    aws._real.client("ssm").put_parameter(Name=PARAMETER, Value=ami, Type="String")
    profile = load(tmp_path, ami=f"ssm:{PARAMETER}")
    printed = [
        c.operation for c in provisioning_calls(seed_recipe(), profile, "c1", owner="a", now=NOW)
    ]
    lines = check(seed_recipe(), profile, "c1", session=aws)
    names = aws.calls.names()
    assert names[0] == "get_products"  # the run's price first (moto has none: a warning)
    checked = [
        "".join(part.title() for part in name.split("_"))
        for name in names[1:]
        if name != "describe_security_groups"  # --check only: the VPC's default group stands in
    ]
    # they need what only a real launch creates; DescribeInstances is sent for the quota step
    # (before anything is created), never as the wait after RunInstances
    skipped = {
        "AuthorizeSecurityGroupIngress",
        "AssociateAddress",
        "DescribeInstanceStatus",
        "GetConsoleOutput",
    }
    launched = printed.index("RunInstances")
    expected = [
        op
        for i, op in enumerate(printed)
        if op not in skipped and not (op == "DescribeInstances" and i > launched)
    ]
    assert checked == expected
    assert checked.index("GetServiceQuota") < checked.index("CreateSecurityGroup")
    assert any(line.startswith("ok   vCPU quota 'Running On-Demand P instances'") for line in lines)
    assert any(line.startswith("warn price: live price lookup failed") for line in lines)
    assert any(line.startswith("ok   RunInstances (DryRun") for line in lines)
    assert live_resources(aws._real.client("ec2")) == NOTHING


def test_the_call_record_never_holds_key_material_or_secrets(tmp_path):
    log = CallLog(tmp_path / "aws-calls.jsonl")
    log.write(
        "ec2",
        "ImportKeyPair",
        {"KeyName": "k", "PublicKeyMaterial": b"ssh-ed25519 AAAA", "Nested": [{"Password": "pw"}]},
        "",
    )
    [line] = log.read()
    assert line["params"] == {
        "KeyName": "k",
        "PublicKeyMaterial": "<not recorded>",
        "Nested": [{"Password": "<not recorded>"}],
    }
    (tmp_path / "a-file").write_text("")
    CallLog(tmp_path / "a-file" / "aws-calls.jsonl").write("ec2", "X", {}, "")  # never raises
