"""The account's vCPU quota, read before anything is created: a launch that cannot fit is refused
with both numbers and where to ask for more (exit 3), and a quota that cannot be read is a
warning, never a refusal.

moto's Service Quotas know only vpc, so the quota step's exact requests and answers go through
botocore's Stubber (requests checked against the service model and the payload the dry run
prints); the lifecycle test launches against moto with a P instance already running and a quota
answered like AWS, and checks that nothing was created.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
from support.aws import StubbedSession, load, nodes_recipe, seed_recipe, service_quota, set_fake_env

from launcher.clusters.aws import provisioning_calls
from launcher.clusters.aws.cluster import AwsCluster
from launcher.clusters.aws.executor import Executor, Mode
from launcher.clusters.aws.quota import ON_DEMAND_P, SPOT_P, quota_of, vcpu_quota
from launcher.errors import InfraError

pytestmark = pytest.mark.aws
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ACTIVE_P = {
    "Filters": [
        {"Name": "instance-type", "Values": ["p*"]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
    ]
}


def instance(iid: str, itype: str = "p5en.48xlarge", lifecycle: str | None = None,
             cpu: tuple[int, int] | None = (96, 2)) -> dict:  # fmt: skip
    inst: dict = {"InstanceId": iid, "InstanceType": itype, "State": {"Name": "running"}}
    if lifecycle:
        inst["InstanceLifecycle"] = lifecycle
    if cpu:
        inst["CpuOptions"] = {"CoreCount": cpu[0], "ThreadsPerCore": cpu[1]}
    return inst


def reservations(*instances: dict) -> dict:
    return {"Reservations": [{"ReservationId": "r-0123", "Instances": list(instances)}]}


@pytest.fixture
def stubbed(monkeypatch):
    set_fake_env(monkeypatch)
    session = StubbedSession()
    session.stub("service-quotas")
    session.stub("ec2")
    yield session
    session.done()


def check_quota(session, tmp_path, recipe=None, **fields) -> list[str]:
    """The quota step alone, in --check's mode, on the stubbed clients."""
    cluster = AwsCluster(recipe or seed_recipe(), load(tmp_path, **fields), "q1", session=session)
    api = Executor(Mode.CHECK, cluster.settings, cluster.client)
    vcpu_quota(cluster.launch_context(), api)
    return api.lines


def expect(session, code: str, value: float | None, *pages: dict, quota_error: str = "") -> None:
    q = session.stubs["service-quotas"]
    params = {"ServiceCode": "ec2", "QuotaCode": code}
    if quota_error:
        q.add_client_error("get_service_quota", quota_error, "denied", 400, expected_params=params)
    else:
        q.add_response("get_service_quota", service_quota(params, value), params)
    for i, page in enumerate(pages):
        sent = dict(ACTIVE_P, NextToken=f"t{i}") if i else ACTIVE_P
        session.stubs["ec2"].add_response("describe_instances", page, sent)


def test_the_dry_run_prints_the_quota_lookups_before_anything_is_created(tmp_path):
    calls = provisioning_calls(seed_recipe(), load(tmp_path), "d1", owner="a", now=NOW)
    names = [c.operation for c in calls]
    assert names.index("GetServiceQuota") < names.index("CreateSecurityGroup")
    quota_call = calls[names.index("GetServiceQuota")]
    assert quota_call.params == {"ServiceCode": "ec2", "QuotaCode": "L-417A185B"}
    assert "192 vCPUs" in quota_call.note  # 1 x p5en, from the catalog
    assert calls[names.index("GetServiceQuota") + 1].params == ACTIVE_P


def test_a_quota_that_holds_the_nodes_passes(stubbed, tmp_path):
    expect(stubbed, "L-417A185B", 384.0, reservations(instance("i-0a")))
    lines = check_quota(stubbed, tmp_path)
    assert lines == [
        "ok   vCPU quota 'Running On-Demand P instances' (L-417A185B): 384; in use 192, "
        "the recipe needs 192"
    ]


def test_a_quota_that_cannot_hold_the_nodes_is_refused_with_both_numbers(stubbed, tmp_path):
    expect(stubbed, "L-417A185B", 192.0, reservations(instance("i-0a")))
    with pytest.raises(InfraError) as err:
        check_quota(stubbed, tmp_path)
    text = str(err.value)
    assert err.value.exit_code == 3
    assert "'Running On-Demand P instances' (L-417A185B)" in text and "is 192 vCPUs" in text
    assert "192 are in use by 1" in text and "384 > 192" in text and "Nothing was created" in text
    assert "request-service-quota-increase" in text and "--desired-value 384" in text


def test_a_fresh_account_with_no_p_quota_is_refused_for_four_nodes(stubbed, tmp_path):
    expect(stubbed, "L-417A185B", 0.0, {"Reservations": []})
    with pytest.raises(InfraError, match=r"is 0 vCPUs.*4 x p5en.48xlarge = 768 vCPUs"):
        check_quota(stubbed, tmp_path, nodes_recipe(tmp_path, 4))


def test_spot_counts_the_spot_quota_and_only_spot_instances(stubbed, tmp_path):
    on_demand, spot = instance("i-0od"), instance("i-0sp", lifecycle="spot")
    expect(stubbed, "L-7212CCBC", 384.0, reservations(on_demand, spot))
    lines = check_quota(stubbed, tmp_path, capacity={"type": "spot"})
    assert "'All P Spot Instance Requests' (L-7212CCBC): 384; in use 192" in lines[0]


def test_every_page_of_running_instances_is_counted(stubbed, tmp_path):
    first = {**reservations(instance("i-01")), "NextToken": "t1"}
    expect(stubbed, "L-417A185B", 400.0, first, reservations(instance("i-02")))
    with pytest.raises(InfraError, match="384 are in use by 2"):
        check_quota(stubbed, tmp_path)


@pytest.mark.parametrize("where", ["quota", "instances"])
def test_a_missing_permission_is_a_warning_not_a_refusal(stubbed, tmp_path, where):
    if where == "quota":
        expect(stubbed, "L-417A185B", None, reservations(), quota_error="AccessDeniedException")
    else:
        expect(stubbed, "L-417A185B", 0.0)
        stubbed.stubs["ec2"].add_client_error(
            "describe_instances", "UnauthorizedOperation", "no", 403, expected_params=ACTIVE_P
        )
    lines = check_quota(stubbed, tmp_path)  # no raise, although the quota (if read) is 0
    assert len(lines) == 1 and lines[0].startswith("warn vCPU quota")
    assert ("AccessDeniedException" if where == "quota" else "UnauthorizedOperation") in lines[0]
    assert "the launch goes on" in lines[0]


def test_a_capacity_block_is_not_counted_against_a_quota(stubbed, tmp_path):
    fields = {"capacity": {"type": "capacity-block", "reservation_id": "cr-0123456789abcdef0"}}
    lines = check_quota(stubbed, tmp_path, **fields)
    assert lines[0].startswith("skip vCPU quota")  # and nothing was asked (no stub consumed)
    assert quota_of("p5en.48xlarge", "capacity-block") is None
    assert quota_of("p5en.48xlarge", "reservation") == ON_DEMAND_P
    assert quota_of("P4D.24XLARGE", "spot") == SPOT_P
    assert quota_of("g6.xlarge", "on-demand") is None


VCPUS = {"p5en.48xlarge": 192, "p4d.24xlarge": 96, "p5.48xlarge": 192}


@pytest.mark.parametrize("seed", range(40))
def test_generated_accounts_are_refused_exactly_when_the_quota_is_short(
    monkeypatch, tmp_path, seed
):
    """An adversary: random running fleets (types, lifecycles, CpuOptions or not, pages), node
    counts, capacity types and quotas; refused iff what counts + what is needed > the quota."""
    rng = random.Random(seed)
    set_fake_env(monkeypatch)
    session = StubbedSession()
    session.stub("service-quotas")
    session.stub("ec2")
    ctype = rng.choice(["on-demand", "spot", "reservation"])
    nodes = rng.choice([1, 2, 4])
    fleet, used = [], 0
    for i in range(rng.randint(0, 6)):
        itype = rng.choice(list(VCPUS))
        lifecycle = rng.choice([None, "spot", "capacity-block"])
        cpu = rng.choice([None, (VCPUS[itype] // 2, 2)])
        fleet.append(instance(f"i-{i:02d}", itype, lifecycle, cpu))
        counts = lifecycle == "spot" if ctype == "spot" else lifecycle is None
        used += VCPUS[itype] if counts else 0
    needed = 192 * nodes
    quota = float(rng.choice([0, used + needed - 1, used + needed, used + needed + 96, 4096]))
    pages = [reservations(*fleet[:3]), reservations(*fleet[3:])] if len(fleet) > 3 else []
    if pages:
        pages[0]["NextToken"] = "t1"
    code = SPOT_P[0] if ctype == "spot" else ON_DEMAND_P[0]
    expect(session, code, quota, *(pages or [reservations(*fleet)]))
    fields: dict = {"capacity": {"type": ctype}}
    if ctype == "reservation":
        fields["capacity"]["reservation_id"] = "cr-0123456789abcdef0"
    recipe = nodes_recipe(tmp_path, nodes) if nodes > 1 else seed_recipe()
    if used + needed > quota:
        with pytest.raises(InfraError, match=f"{used + needed:g} > {quota:g}"):
            check_quota(session, tmp_path, recipe, **fields)
    else:
        (line,) = check_quota(session, tmp_path, recipe, **fields)
        assert line.startswith("ok   vCPU quota") and f"in use {used:g}" in line
    session.done()


def test_a_launch_over_quota_creates_nothing(aws, ami, tmp_path):
    """moto: an account with no P quota (most accounts; answered like AWS, since moto knows only
    vpc quotas): the launch is refused before its first resource, so nothing of it exists. (moto
    ignores the wildcard in the instance-type filter, so what runs is counted in the Stubber
    tests above.)"""
    ec2 = aws._real.client("ec2")
    aws.canned["get_service_quota"] = lambda params: service_quota(params, 0.0)
    profile = load(tmp_path, ami=ami)
    cluster = AwsCluster(
        seed_recipe(), profile, "q2", session=aws, state_path=tmp_path / "run" / "aws.json",
        key_dir=tmp_path / "keys", poll_s=0.01,
    )  # fmt: skip
    with pytest.raises(InfraError, match="is 0 vCPUs") as err:
        cluster.acquire()
    assert err.value.exit_code == 3
    names = aws.calls.names()
    assert names[:4] == [
        "get_caller_identity",
        "describe_instance_types",
        "get_service_quota",
        "describe_instances",
    ]
    assert not [n for n in names if n.startswith(("create_", "run_", "allocate_"))], names
    groups = [g["GroupName"] for g in ec2.describe_security_groups()["SecurityGroups"]]
    assert groups == ["default"] and ec2.describe_key_pairs()["KeyPairs"] == []
    cluster.release()  # nothing to end, and it says so without an error
