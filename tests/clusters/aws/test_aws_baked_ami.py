"""`ami: baked` and the bake's CreateImage: exact payloads with botocore's Stubber (each request
checked against the EC2 service model and equal to what the dry run prints), the lookup's choice
(newest wins), the dry run of a baked profile, and node.sh's image stage on a baked AMI run
against the real docker (the image present: no pull, its digest checked, image.json says so).

The lifecycle (the bake's instance launched and ended, the AMI tagged, found at the next launch,
removed after a failure) is tests/prepare/test_image_bake.py, on moto and the loopback sshd.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import UTC, datetime

import pytest
from support.aws import StubbedSession, load, seed_recipe, set_fake_env
from support.docker import docker
from support.paths import REPO

from launcher.clusters.aws import bake as ab
from launcher.clusters.aws import provisioning_calls
from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.cluster import AwsCluster
from launcher.clusters.aws.executor import Executor, Mode
from launcher.clusters.aws.lookups import ami as ami_step
from launcher.errors import BadInput
from launcher.plan.plan import build_plan

pytestmark = pytest.mark.aws
DIGEST = seed_recipe().image.digest
REF = seed_recipe().image.ref


@pytest.fixture
def stubbed(monkeypatch):
    set_fake_env(monkeypatch)
    session = StubbedSession()
    session.stub("ec2")
    yield session
    session.done()


ME = "alice"


def image(iid: str, created: str, state: str = "available", who: str = ME) -> dict:
    return {
        "ImageId": iid,
        "CreationDate": created,
        "State": state,
        "RootDeviceName": "/dev/sda1",
        "Name": f"reproduce-x-{iid}",
        "Tags": [
            {"Key": rq.TAG_IMAGE_DIGEST, "Value": DIGEST},
            {"Key": rq.TAG_BASE_AMI, "Value": "ami-0123456789abcdef0"},
            {"Key": rq.TAG_OWNER, "Value": who},
            {"Key": rq.TAG_RUN_ID, "Value": f"bake-{iid}"},
        ],
    }


def lookup(session, tmp_path, mode: Mode = Mode.CHECK):
    cluster = AwsCluster(
        seed_recipe(), load(tmp_path, ami="baked"), "b1", session=session, owner=ME
    )
    launch = cluster.launch_context()
    api = Executor(mode, cluster.settings, cluster.client)
    ami_step(launch, api)
    return launch, api


def test_describe_images_payload_is_valid_and_the_newest_baked_ami_wins(stubbed, tmp_path):
    expected = {
        "Owners": ["self"],
        "Filters": [
            {"Name": f"tag:{rq.TAG_IMAGE_DIGEST}", "Values": [DIGEST]},
            {"Name": "state", "Values": ["available"]},
        ],
    }
    assert rq.baked_images_request(DIGEST) == expected
    answer = {
        "Images": [
            image("ami-0aaaaaaaaaaaaaaa1", "2026-11-30T10:00:00.000Z"),
            image("ami-0bbbbbbbbbbbbbbb2", "2026-12-01T09:00:00.000Z"),  # the newest
            image("ami-0ccccccccccccccc3", "2026-11-01T08:00:00.000Z"),
        ]
    }
    stubbed.stub("ec2").add_response("describe_images", answer, expected)
    launch, api = lookup(stubbed, tmp_path)
    assert launch.ami_id == "ami-0bbbbbbbbbbbbbbb2" and launch.root_device == "/dev/sda1"
    assert any("baked with" in line for line in api.lines)
    # the dry run prints the very same request
    [printed] = [
        c
        for c in provisioning_calls(
            seed_recipe(), load(tmp_path, ami="baked"), "b1", owner="t", now=datetime.now(UTC)
        )
        if c.operation == "DescribeImages"
    ]
    assert printed.params == expected  # and no second DescribeImages of the id (root device)


def test_no_baked_ami_is_a_refusal_naming_the_bake(stubbed, tmp_path):
    stubbed.stub("ec2").add_response(
        "describe_images", {"Images": []}, rq.baked_images_request(DIGEST)
    )
    with pytest.raises(BadInput) as err:
        lookup(stubbed, tmp_path)
    assert "no available AMI" in str(err.value) and DIGEST in str(err.value)
    assert "reproduce image bake RECIPE" in str(err.value.hint)


def test_create_image_payload_is_valid_for_the_service_model(stubbed):
    tags = rq.run_tags(
        seed_recipe(), "bake-1", "alice", "2026-12-03T00:00:00Z", "0123456789ab", {"team": "x"}
    )
    name = ab.image_name(seed_recipe().slug, DIGEST, "0123456789ab")
    req = ab.create_image_request(
        "i-0123456789abcdef0", name, REF, DIGEST, "ami-0123456789abcdef0", tags
    )
    stubbed.stub("ec2").add_response("create_image", {"ImageId": "ami-0ddddddddddddddd4"}, req)
    assert stubbed.clients["ec2"].create_image(**req)["ImageId"] == "ami-0ddddddddddddddd4"
    assert req["NoReboot"] is True and len(req["Name"]) <= 128
    assert [s["ResourceType"] for s in req["TagSpecifications"]] == ["image", "snapshot"]
    have = rq.tag_values(req["TagSpecifications"][0]["Tags"])
    assert have[rq.TAG_IMAGE_DIGEST] == DIGEST and have[rq.TAG_BASE_AMI].startswith("ami-")
    assert have["team"] == "x" and rq.TAG_EXPIRES not in have and have[rq.TAG_OWNER] == "alice"
    # the deregistration and snapshot deletion of a failed bake are valid requests too
    stub = stubbed.stub("ec2")
    stub.add_response("deregister_image", {}, {"ImageId": "ami-0ddddddddddddddd4"})
    stubbed.clients["ec2"].deregister_image(ImageId="ami-0ddddddddddddddd4")


def test_image_names_are_what_ec2_accepts():
    long_slug = "a/" * 100 + "recipe with spaces & stuff"
    name = ab.image_name(long_slug, DIGEST, "0123456789ab")
    assert len(name) <= 128 and name.endswith(f"-{DIGEST[7:19]}-0123456789ab")
    assert all(c.isalnum() or c in "()[]./-'@_" for c in name)


def test_a_baked_profile_plans_a_node_script_that_takes_the_image_from_the_ami(tmp_path):
    plan = build_plan(seed_recipe(), load(tmp_path, ami="baked"), run_id="b1")
    [stage] = [s for s in plan.stages if s.name == "image"]
    text = "\n".join(stage.commands)
    assert 'if docker image inspect "$IMAGE" >/dev/null 2>&1; then' in text
    assert "IMAGE_SOURCE=ami" in text and '"source": "%s"' in text
    assert text.index("IMAGE_SOURCE=ami") < text.index("grep -qxF")  # the digest still checked
    # a profile that pulls as before renders the golden image stage (no source field)
    plain = build_plan(seed_recipe(), load(tmp_path), run_id="b1")
    [before] = [s for s in plain.stages if s.name == "image"]
    assert "IMAGE_SOURCE" not in "\n".join(before.commands)


@pytest.mark.docker
@pytest.mark.parametrize("present", [True, False])
def test_the_image_stage_on_a_baked_ami_checks_a_present_image_and_pulls_only_a_missing_one(
    test_image, tmp_path, present
):
    """node.sh's image stage as rendered for `ami: baked`, run by bash against the real docker and
    registry: an image the AMI holds is not pulled (its digest is checked, image.json says
    `ami`); one it does not is pulled as always (`pulled`)."""
    from support.plan_env import write_recipe

    from launcher.inputs.recipe import load_recipe

    if present:
        docker("pull", test_image.ref)
    else:
        docker("rmi", "-f", test_image.ref, check=False)
    plan = build_plan(
        load_recipe(write_recipe(tmp_path, test_image)), load(tmp_path, ami="baked"), run_id="b1"
    )
    [stage] = [s for s in plan.stages if s.name == "image"]
    run_dir = tmp_path / "node"
    (run_dir / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "pull_progress.py", run_dir / "scripts")  # staged as always
    script = (
        f"set -euo pipefail\nIMAGE={test_image.ref}\nIMAGE_DIGEST={test_image.digest}\n"
        f"NODE_RUN_DIR={run_dir}\n" + "\n".join(stage.commands) + "\n"
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((run_dir / "image.json").read_text())
    assert record["digest"] == test_image.digest and test_image.ref in record["repo_digests"]
    assert record["source"] == ("ami" if present else "pulled")
    assert ("not pulled" in done.stdout) == present


def test_volume_initialization_rate_goes_on_the_root_volume_and_is_valid(stubbed, tmp_path):
    """The profile's volume_initialization_rate is RunInstances' Ebs.VolumeInitializationRate
    (valid for the service model); without it the root volume's mapping is as before."""
    from launcher.clusters.aws.settings import settings_from

    s = settings_from(seed_recipe(), load(tmp_path, ami="baked", volume_initialization_rate=300))
    req = rq.run_instances_request(
        s,
        ami_id="ami-0bbbbbbbbbbbbbbb2",
        subnet_id="subnet-0123456789abcdef0",
        group_id="sg-0123456789abcdef0",
        key_name="k",
        placement_group=None,
        root_device="/dev/sda1",
        network_cards=16,
        max_efa=16,
        tags=[{"Key": "Name", "Value": "x"}],
        client_token="reproduce-0123456789ab-0",
    )
    assert req["BlockDeviceMappings"][0]["Ebs"]["VolumeInitializationRate"] == 300
    stubbed.stub("ec2").add_response("run_instances", {"Instances": []}, req)
    stubbed.clients["ec2"].run_instances(**req)
    plain = settings_from(seed_recipe(), load(tmp_path, ami="baked"))
    assert plain.volume_initialization_rate is None
