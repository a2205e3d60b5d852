"""The pure request builder behind `--dry-run` for aws: exact payloads, placeholders, no boto3."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from support.aws import REPO, load, seed_recipe, two_node_recipe

from launcher.clusters.aws import provisioning_calls, to_jsonable
from launcher.clusters.aws.requests import (
    TAG_EXPIRES,
    TAG_OWNER,
    TAG_RECIPE,
    TAG_RUN_ID,
    is_placeholder,
)
from launcher.errors import BadInput

pytestmark = pytest.mark.aws
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def calls_for(tmp_path, recipe=None, **fields):
    return provisioning_calls(
        recipe or seed_recipe(), load(tmp_path, **fields), "r1", owner="alice@laptop", now=NOW
    )


def run_instances(calls):
    [call] = [c for c in calls if c.operation == "RunInstances"]
    return call.params


def test_p5en_gets_16_efa_interfaces_one_per_network_card(tmp_path):
    nics = run_instances(calls_for(tmp_path))["NetworkInterfaces"]
    assert [n["NetworkCardIndex"] for n in nics] == list(range(16))
    assert nics[0]["InterfaceType"] == "efa" and nics[0]["DeviceIndex"] == 0
    assert {n["InterfaceType"] for n in nics[1:]} == {"efa-only"}
    assert all(n["DeviceIndex"] == 0 for n in nics)
    assert all(
        n["Groups"] == [nics[0]["Groups"][0]] and n["SubnetId"] == nics[0]["SubnetId"] for n in nics
    )


def test_ena_primary_layout_follows_aws_current_advice(tmp_path):
    nics = run_instances(calls_for(tmp_path, efa_layout="ena-primary"))["NetworkInterfaces"]
    assert (nics[0]["NetworkCardIndex"], nics[0]["DeviceIndex"], nics[0]["InterfaceType"]) == (
        0,
        0,
        "interface",
    )
    assert (nics[1]["NetworkCardIndex"], nics[1]["DeviceIndex"], nics[1]["InterfaceType"]) == (
        0,
        1,
        "efa-only",
    )
    assert [(n["NetworkCardIndex"], n["DeviceIndex"]) for n in nics[2:]] == [
        (c, 0) for c in range(1, 16)
    ]
    assert sum(n["InterfaceType"] in ("efa", "efa-only") for n in nics) == 16


def test_run_instances_is_hardened_and_tagged(tmp_path):
    req = run_instances(calls_for(tmp_path, root_volume_gb=800, ttl_hours=2, tags={"team": "ml"}))
    assert req["InstanceType"] == "p5en.48xlarge" and req["MinCount"] == req["MaxCount"] == 1
    assert req["MetadataOptions"]["HttpTokens"] == "required"
    ebs = req["BlockDeviceMappings"][0]["Ebs"]
    assert ebs == {
        "VolumeSize": 800,
        "VolumeType": "gp3",
        "Throughput": 1000,
        "Iops": 4000,
        "Encrypted": True,
        "DeleteOnTermination": True,
    }
    assert "SubnetId" not in req and "SecurityGroupIds" not in req  # they live on each interface
    assert (
        req["InstanceInitiatedShutdownBehavior"] == "terminate"
        and "shutdown -h +120" in req["UserData"]
    )
    kinds = {spec["ResourceType"] for spec in req["TagSpecifications"]}
    assert kinds == {"instance", "volume", "network-interface"}
    tags = {t["Key"]: t["Value"] for t in req["TagSpecifications"][0]["Tags"]}
    assert tags[TAG_RECIPE] == seed_recipe().slug  # model/gpu/layout-<content hash>
    assert tags[TAG_RUN_ID] == "r1" and tags[TAG_OWNER] == "alice@laptop"
    assert (
        tags[TAG_EXPIRES] == "2026-11-29T14:00:00Z"
        and tags["team"] == "ml"
        and tags["Name"] == "reproduce-r1"
    )
    assert "Placement" not in req and "InstanceMarketOptions" not in req


def test_unresolved_values_are_explicit_placeholders_and_in_order(tmp_path):
    calls = calls_for(tmp_path, ssh_cidr=None)
    ops = [c.operation for c in calls]
    assert (
        ops.index("GetParameter")
        < ops.index("CreateSecurityGroup")
        < ops.index("AuthorizeSecurityGroupIngress")
    )
    assert (
        ops.index("CreateKeyPair")
        < ops.index("RunInstances")
        < ops.index("AllocateAddress")
        < ops.index("AssociateAddress")
    )
    assert "CreatePlacementGroup" not in ops  # one node
    req = run_instances(calls)
    assert is_placeholder(req["ImageId"]) and "ssm:/aws/service/deeplearning" in req["ImageId"]
    assert is_placeholder(req["NetworkInterfaces"][0]["Groups"][0])
    ingress = next(c for c in calls if c.operation == "AuthorizeSecurityGroupIngress").params
    ssh = [p for p in ingress["IpPermissions"] if p["IpProtocol"] == "tcp"][0]
    assert is_placeholder(
        ssh["IpRanges"][0]["CidrIp"]
    )  # looked up at launch, never during the dry run
    assert (
        ingress["IpPermissions"][0]["UserIdGroupPairs"][0]["GroupId"] == ingress["GroupId"]
    )  # open to itself
    json.dumps(to_jsonable(calls))  # printable as is


def test_pinned_ami_operator_cidr_and_key_appear_as_given(tmp_path):
    calls = calls_for(
        tmp_path, ami="ami-0123456789abcdef0", key_name="mine", ssh_cidr="203.0.113.7/32"
    )
    ops = [c.operation for c in calls]
    assert "GetParameter" not in ops and "CreateKeyPair" not in ops
    req = run_instances(calls)
    assert req["ImageId"] == "ami-0123456789abcdef0" and req["KeyName"] == "mine"
    ingress = next(c for c in calls if c.operation == "AuthorizeSecurityGroupIngress").params
    assert ingress["IpPermissions"][1]["IpRanges"][0]["CidrIp"] == "203.0.113.7/32"


def test_two_nodes_get_one_cluster_placement_group(tmp_path):
    calls = calls_for(tmp_path, recipe=two_node_recipe(tmp_path))
    pg = next(c for c in calls if c.operation == "CreatePlacementGroup").params
    assert pg["Strategy"] == "cluster"
    req = run_instances(calls)
    assert (
        req["Placement"] == {"GroupName": pg["GroupName"]}
        and req["MinCount"] == req["MaxCount"] == 2
    )
    # one Elastic IP, the head's: the other node is reached through it (default quota: 5/region)
    assert len([c for c in calls if c.operation == "AllocateAddress"]) == 1


@pytest.mark.parametrize(
    "capacity, market, target",
    [
        (
            {"type": "reservation", "reservation_id": "cr-0123456789abcdef0"},
            None,
            "cr-0123456789abcdef0",
        ),
        (
            {"type": "capacity-block", "reservation_id": "cr-0fedcba9876543210"},
            {"MarketType": "capacity-block"},
            "cr-0fedcba9876543210",
        ),
        (
            {"type": "spot", "max_spot_price": 30},
            {
                "MarketType": "spot",
                "SpotOptions": {
                    "SpotInstanceType": "one-time",
                    "InstanceInterruptionBehavior": "terminate",
                    "MaxPrice": "30.0000",
                },
            },
            None,
        ),
    ],
)
def test_capacity_options_reach_the_request(tmp_path, capacity, market, target):
    calls = calls_for(tmp_path, capacity=capacity)
    req = run_instances(calls)
    assert req.get("InstanceMarketOptions") == market
    if target:
        assert req["CapacityReservationSpecification"] == {
            "CapacityReservationTarget": {"CapacityReservationId": target}
        }
        assert any(c.operation == "DescribeCapacityReservations" for c in calls)
    else:
        assert "CapacityReservationSpecification" not in req


def test_targeting_an_instance_creates_nothing(tmp_path):
    calls = calls_for(tmp_path, instance_id="i-0123456789abcdef0")
    # read-only: the instance, then its type's GPUs (checked against the recipe), as a launch does
    assert [c.operation for c in calls] == ["DescribeInstances", "DescribeInstanceTypes"]
    assert is_placeholder(calls[1].params["InstanceTypes"][0])


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"instance_type": "p5.48xlarge"}, "H100"),
        ({"instance_type": "p4d.24xlarge"}, "A100"),
        ({"capacity": {"type": "reservation"}}, "reservation_id"),
        (
            {"capacity": {"type": "on-demand", "reservation_id": "cr-0123456789abcdef0"}},
            "capacity.type",
        ),
        ({"ami": "ubuntu-latest"}, "ami"),
        ({"ssh_cidr": "not-a-cidr"}, "ssh_cidr"),
    ],
)
def test_bad_input_is_refused_with_the_field_named(tmp_path, fields, words):
    with pytest.raises(BadInput) as err:
        calls_for(tmp_path, **fields)
    assert words in str(err.value) and err.value.exit_code == 2


def test_the_root_volume_gets_the_throughput_a_pull_needs_and_the_iops_gp3_asks_for_it(
    tmp_path, monkeypatch
):
    """docker's image store is on the root volume: at gp3's baseline (125 MiB/s) a pull cannot
    pass about 0.13 GB/s. The default provisions 1000 MiB/s with the 4000 IOPS gp3 needs for it;
    the profile can ask for any pair gp3 allows, and the request is valid for EC2's model."""
    from support.aws import StubbedSession, set_fake_env

    ebs = run_instances(calls_for(tmp_path))["BlockDeviceMappings"][0]["Ebs"]
    assert (ebs["VolumeType"], ebs["Throughput"], ebs["Iops"]) == ("gp3", 1000, 4000)
    baseline = run_instances(calls_for(tmp_path, root_volume_throughput=125, root_volume_iops=3000))
    assert baseline["BlockDeviceMappings"][0]["Ebs"]["Throughput"] == 125
    set_fake_env(monkeypatch)
    session = StubbedSession()
    for params in (run_instances(calls_for(tmp_path)), baseline):
        req = {**params, "ImageId": "ami-0123456789abcdef0", "KeyName": "k"}
        req["NetworkInterfaces"] = [
            {**n, "SubnetId": "subnet-0123456789abcdef0", "Groups": ["sg-0123456789abcdef0"]}
            for n in req["NetworkInterfaces"]
        ]
        session.stub("ec2").add_response("run_instances", {"Instances": []}, req)
        session.clients["ec2"].run_instances(**req)  # botocore validates it against the model
    session.done()


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"root_volume_throughput": 1000, "root_volume_iops": 3000}, "at least 4000"),
        ({"root_volume_throughput": 2000}, "root_volume_throughput"),
        ({"root_volume_iops": 2999}, "root_volume_iops"),
    ],
)
def test_a_root_volume_gp3_cannot_give_is_refused_naming_the_field(tmp_path, fields, words):
    with pytest.raises(BadInput) as err:
        calls_for(tmp_path, **fields)
    assert words in str(err.value) and err.value.exit_code == 2


def test_no_secret_reaches_the_printed_calls(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-never-printed")
    text = json.dumps(to_jsonable(calls_for(tmp_path)))
    assert "s3cr3t" not in text and "KeyMaterial" not in text


def test_the_dry_run_builder_imports_no_boto3():
    code = (
        "import sys, datetime; sys.path.insert(0, 'tests');"
        "from support.aws import seed_recipe; from launcher.inputs.profile import load_profile;"
        "from launcher.clusters.aws import provisioning_calls;"
        "provisioning_calls(seed_recipe(), load_profile('aws'), 'r', owner='o', now=datetime.datetime.now());"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore', 'moto')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_ipv6_operator_address_gets_an_ipv6_rule(tmp_path):
    calls = calls_for(tmp_path, ssh_cidr="2001:db8::7/128")
    ingress = next(c for c in calls if c.operation == "AuthorizeSecurityGroupIngress").params
    assert ingress["IpPermissions"][1]["Ipv6Ranges"][0]["CidrIpv6"] == "2001:db8::7/128"
    assert "IpRanges" not in ingress["IpPermissions"][1]


def _launchers_own_tags(tmp_path) -> set[str]:
    """Every tag key the launcher writes on what it creates, read from the requests themselves
    (a tag added tomorrow is in this set without a word here)."""
    keys: set[str] = set()
    for call in calls_for(tmp_path, two_node_recipe(tmp_path)):
        for spec in call.params.get("TagSpecifications", []):
            keys.update(t["Key"] for t in spec["Tags"])
    return keys


def test_a_profile_may_not_set_a_tag_the_launcher_finds_its_resources_by(tmp_path):
    """Teardown and reap find a run's resources by the launcher's tags (Name, reproduce:*): a
    profile's `tags` naming one was dropped without a word (found 2026-12-04). Now each is
    refused at load, naming the field; AWS's own prefix and its limits too."""
    own = _launchers_own_tags(tmp_path)
    assert {"Name", TAG_RUN_ID, TAG_OWNER} <= own
    for key in sorted(own | {"aws:cloudformation:stack-name", "", "k" * 129}):
        with pytest.raises(BadInput) as err:
            calls_for(tmp_path, tags={key: "mine"})
        assert f"tags.{key}" in str(err.value) and err.value.exit_code == 2, (key, err.value)
    with pytest.raises(BadInput, match="tags"):
        calls_for(tmp_path, tags={"team": "v" * 257})
    with pytest.raises(BadInput, match="tags"):
        calls_for(tmp_path, tags={f"t{i}": "x" for i in range(45)})


def test_every_tag_a_profile_may_set_reaches_every_resource_unchanged(tmp_path):
    extra = {"team": "ml", "cost-center": "4711", "k" * 128: "v" * 256}
    for call in calls_for(tmp_path, two_node_recipe(tmp_path), tags=extra):
        for spec in call.params.get("TagSpecifications", []):
            tags = {t["Key"]: t["Value"] for t in spec["Tags"]}
            assert extra.items() <= tags.items(), (call.operation, spec["ResourceType"])
