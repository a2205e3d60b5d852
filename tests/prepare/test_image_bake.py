"""`reproduce image bake` and `ami: baked`, with real parts except AWS.

AWS is moto (in-process, behind the recording session of tests/support/aws.py); the bake's one
instance is the suite's loopback sshd (its console answers with that sshd's real host key
fingerprint, as cloud-init's would); the image is the stand-in pushed by digest to the loopback
registry and really pulled over SSH, its RepoDigests really checked. Only docker's stop before the
snapshot is replaced (`quiesce="sync"`): stopping this machine's dockerd would stop every other
docker test. Nothing leaves loopback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.aws import (
    NOTHING,
    OPERATOR_KEY,
    cluster,
    console,
    live_with_operator_key,
    write_profile,
)
from support.cli import SEED, reproduce
from support.docker import docker
from support.plan_env import write_recipe

from launcher.clusters.aws.requests import TAG_BASE_AMI, TAG_EXPIRES, TAG_IMAGE_DIGEST, TAG_OWNER
from launcher.errors import BadInput, InfraError
from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.prepare.bake import Bake, BakeRequest, bake

pytestmark = [pytest.mark.aws, pytest.mark.ssh, pytest.mark.docker]


def tags_of(item: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in item.get("Tags", [])}


@pytest.fixture
def node(aws, sshd) -> dict[str, Any]:
    """The profile fields that make the bake's instance the loopback sshd (its real host key on
    the console, the operator's own key pair imported into moto)."""
    pub = Path(f"{sshd.identity_file}.pub").read_bytes()
    aws._real.client("ec2").import_key_pair(KeyName=OPERATOR_KEY, PublicKeyMaterial=pub)
    aws.canned["get_console_output"] = console(sshd.host_fingerprint)
    aws.canned["create_image"] = lambda params: create_image_like_aws(aws, params)
    return {
        "port": sshd.port,
        "user": sshd.user,
        "key_name": OPERATOR_KEY,
        "identity_file": str(sshd.identity_file),
        "ready_timeout_s": 20,
        "host_key_wait_s": 5,
    }


def create_image_like_aws(aws, params: dict) -> dict:
    """moto's CreateImage, with what moto lacks done as EC2 does it: the snapshot tag
    specification (moto raises NotImplementedError) put on the AMI's snapshots. The payload as
    sent is checked against the service model in tests/clusters/aws/test_aws_baked_ami.py."""
    ec2 = aws._real.client("ec2")
    specs = params["TagSpecifications"]
    made = ec2.create_image(
        **{**params, "TagSpecifications": [s for s in specs if s["ResourceType"] != "snapshot"]}
    )
    [image] = ec2.describe_images(ImageIds=[made["ImageId"]])["Images"]
    snapshots = [
        m["Ebs"]["SnapshotId"]
        for m in image.get("BlockDeviceMappings", [])
        if (m.get("Ebs") or {}).get("SnapshotId")
    ]
    for spec in specs:
        if spec["ResourceType"] == "snapshot" and snapshots:
            ec2.create_tags(Resources=snapshots, Tags=spec["Tags"])
    return made


def _bake(aws, tmp_path: Path, recipe: Path, profile: Path) -> tuple[Any, list[str]]:
    logs: list[str] = []
    job = Bake.read(BakeRequest(recipe=recipe, profile=str(profile)))
    result = bake(
        job,
        state_dir=tmp_path / "bake",
        session=aws,
        log=logs.append,
        key_dir=tmp_path / "keys",
        poll_s=0.01,
        quiesce="sync",
    )
    return result, logs


def test_bake_pulls_over_ssh_makes_the_tagged_ami_ends_the_instance_and_a_run_finds_it(
    aws, ami, node, test_image, tmp_path, banner
):
    docker("rmi", "-f", test_image.ref, check=False)  # the bake's pull is real
    recipe = write_recipe(tmp_path, test_image)
    profile = write_profile(tmp_path, ami=ami, **node)
    result, logs = _bake(aws, tmp_path, recipe, profile)
    ec2 = aws._real.client("ec2")

    # ONE instance, of the bake's non-GPU type, from the profile's AMI; terminated afterwards
    [run] = aws.calls.params("run_instances")
    assert run["InstanceType"] == "m7i.2xlarge" and run["ImageId"] == ami
    assert run["MinCount"] == run["MaxCount"] == 1
    [reservation] = ec2.describe_instances()["Reservations"]
    [inst] = reservation["Instances"]
    assert inst["State"]["Name"] == "terminated"
    assert live_with_operator_key(ec2) == NOTHING  # group, key pair, address: all gone
    assert "get_service_quota" not in aws.calls.names()  # no P-family quota for the bake
    # the image was really pulled over SSH by digest, and docker has that digest
    assert any(f"{test_image.ref} pulled" in line for line in logs)
    digests = docker("image", "inspect", "--format", "{{json .RepoDigests}}", test_image.ref)
    assert test_image.ref in json.loads(digests.stdout)

    # CreateImage of that instance, tagged with the digest, the base AMI and the owner
    [create] = aws.calls.params("create_image")
    assert create["InstanceId"] == inst["InstanceId"] and create["NoReboot"] is True
    [image] = ec2.describe_images(ImageIds=[result.image_id])["Images"]
    tags = tags_of(image)
    assert image["State"] == "available" and result.digest == test_image.digest
    assert tags[TAG_IMAGE_DIGEST] == test_image.digest and tags[TAG_BASE_AMI] == ami
    assert tags[TAG_OWNER] and TAG_EXPIRES not in tags  # kept: reap must not read it as due
    state = json.loads((tmp_path / "bake" / "aws.json").read_text())
    assert state["baked_image"] == result.image_id and state["terminated"] == [inst["InstanceId"]]

    # the next launch with `ami: baked` by the same owner finds it by the recipe's digest
    # (DescribeImages) and launches from it; the id is recorded like an SSM-resolved one
    run_profile = load_profile(str(write_profile(tmp_path, ami="baked", port=banner.port)))
    c = cluster(
        aws,
        None,
        tmp_path,
        run_id="r-baked",
        recipe=load_recipe(recipe),
        profile=run_profile,
        owner=tags[TAG_OWNER],
    )
    [gpu_node] = c.acquire()
    try:
        lookup = aws.calls.params("describe_images")[-1]
        assert lookup["Owners"] == ["self"]
        assert {"Name": f"tag:{TAG_IMAGE_DIGEST}", "Values": [test_image.digest]} in lookup[
            "Filters"
        ]
        assert aws.calls.params("run_instances")[-1]["ImageId"] == result.image_id
        assert gpu_node.meta["ami_id"] == result.image_id
        record = json.loads((tmp_path / "run" / "aws.json").read_text())
        assert record["ami_id"] == result.image_id
        assert record["baked_ami"]["image_digest"] == test_image.digest
        assert record["baked_ami"]["base_ami"] == ami
        assert record["baked_ami"]["owner"] == tags[TAG_OWNER]
    finally:
        c.release()
    assert live_with_operator_key(ec2) == NOTHING


@pytest.mark.parametrize("fault", ["failed", "ctrl-c"])
def test_a_failure_after_create_image_deregisters_it_and_leaves_nothing_running(
    aws, ami, node, test_image, tmp_path, fault
):
    """The AMI goes `failed` (AWS's reason is the error), or Ctrl-C arrives while it is waited
    for: either way it is deregistered, its snapshots deleted, the instance ended."""
    recipe = write_recipe(tmp_path, test_image)
    profile = write_profile(tmp_path, ami=ami, **node)
    made: list[str] = []

    def failed_ami(params: dict) -> Any:
        if params.get("ImageIds") and params["ImageIds"] != [ami]:  # the new AMI, not the base
            made.extend(params["ImageIds"])
            if fault == "ctrl-c" and len(made) == 1:
                return KeyboardInterrupt()
            return {
                "Images": [
                    {
                        "ImageId": params["ImageIds"][0],
                        "State": "failed",
                        "StateReason": {"Message": "injected: snapshot failed"},
                    }
                ]
            }
        return None

    aws.faults["describe_images"] = failed_ami
    expected = KeyboardInterrupt if fault == "ctrl-c" else InfraError
    with pytest.raises(expected, match=None if fault == "ctrl-c" else "injected: snapshot failed"):
        _bake(aws, tmp_path, recipe, profile)
    aws.faults.clear()
    ec2 = aws._real.client("ec2")
    assert made and "deregister_image" in aws.calls.names()
    assert "delete_snapshot" in aws.calls.names()  # found by the launch's tags
    images = [i["ImageId"] for i in ec2.describe_images(Owners=["self"])["Images"]]
    assert images == [ami]  # the half-made AMI is gone, the base untouched
    mine = ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]
    assert [s for s in mine if tags_of(s).get(TAG_IMAGE_DIGEST)] == []  # and its snapshots
    assert live_with_operator_key(ec2) == NOTHING  # the instance ended, as on success


def test_a_pull_that_fails_makes_no_ami_and_ends_the_instance(aws, ami, node, tmp_path):
    raw_missing = type("Img", (), {"repo": "127.0.0.1:9/none", "digest": "sha256:" + "0" * 64})()
    recipe = write_recipe(tmp_path, raw_missing)
    profile = write_profile(tmp_path, ami=ami, **node)
    with pytest.raises(InfraError, match="docker pull 127.0.0.1:9/none@sha256:0+ failed"):
        _bake(aws, tmp_path, recipe, profile)
    assert "create_image" not in aws.calls.names()
    assert live_with_operator_key(aws._real.client("ec2")) == NOTHING


def test_the_refusal_when_no_baked_ami_exists_creates_nothing(aws, tmp_path):
    profile = load_profile(str(write_profile(tmp_path, ami="baked")))
    c = cluster(aws, None, tmp_path, run_id="r-none", profile=profile)
    with pytest.raises(BadInput) as err:
        c.acquire()
    assert err.value.exit_code == 2
    text = str(err.value) + str(err.value.hint or "")
    assert "no available AMI" in text and "reproduce image bake" in text
    assert "sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca" in text
    created = [n for n in aws.calls.names() if n.startswith(("create_", "run_", "allocate_"))]
    assert created == []
    c.release()


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"ami": "bogus"}, ["ami 'bogus'", "expected ami-<hex>"]),
        ({"bake_base_ami": "baked"}, ["bake_base_ami 'baked'", "expected ami-<hex>"]),
        ({"bake_instance_type": "Not A Type"}, ["bake_instance_type"]),
        ({"runtime": "host"}, ["runtime host", "expected runtime: docker"]),
    ],
)
def test_bad_input_is_one_paragraph_exit_2_and_nothing_is_asked(tmp_path, fields, words):
    profile = write_profile(tmp_path, **fields)
    res = reproduce("image", "bake", str(SEED), "--cluster", str(profile), "--dry-run")
    assert res.code == 2, res.out + res.err
    assert "Traceback" not in res.err and res.out == ""
    for word in words:
        assert word in res.err


def test_the_dry_run_prints_the_real_requests_and_needs_no_credentials(monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    res = reproduce("image", "bake", str(SEED), "--cluster", "aws", "--dry-run")
    assert res.code == 0, res.err
    body = res.out[res.out.index("[") : res.out.index("\n]\n") + 2]
    calls = json.loads(body)
    ops = [c["operation"] for c in calls]
    assert ops[:2] == ["GetCallerIdentity", "DescribeInstanceTypes"]
    assert "GetServiceQuota" not in ops and ops.count("RunInstances") == 1
    assert ops[-2:] == ["CreateImage", "DescribeImages"]
    run = calls[ops.index("RunInstances")]["params"]
    assert run["InstanceType"] == "m7i.2xlarge" and run["MaxCount"] == 1
    create = calls[-2]["params"]
    image_tags = {t["Key"]: t["Value"] for t in create["TagSpecifications"][0]["Tags"]}
    digest = load_recipe(SEED).image.digest
    assert image_tags[TAG_IMAGE_DIGEST] == digest and TAG_BASE_AMI in image_tags
    assert [s["ResourceType"] for s in create["TagSpecifications"]] == ["image", "snapshot"]
    ref = load_recipe(SEED).image.ref
    assert f"\ndocker pull {ref}\n" in res.out  # the pull by digest, as node.sh pulls
    assert "sudo -n systemctl stop docker.socket docker.service && sync" in res.out


def test_without_credentials_the_bake_is_refused_and_nothing_is_made(tmp_path, monkeypatch):
    from support.aws import set_fake_env

    set_fake_env(monkeypatch)
    for key in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    res = reproduce("image", "bake", str(SEED), "--cluster", "aws")
    assert res.code == 2, res.out + res.err
    assert "credentials" in res.err.lower() and "Traceback" not in res.err
    assert not (tmp_path / "images").exists()  # not even the bake's record directory
