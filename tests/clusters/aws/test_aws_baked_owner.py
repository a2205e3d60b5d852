"""`ami: baked` takes only the caller's own bakes (docs/aws.md, "An AMI that holds the image").

On a baked AMI the node checks the image already in that AMI's docker store, so whoever baked
the AMI decides what runs where the run's secrets go. The account (moto) holds, for the run's
image digest: alice's bake, then newer AMIs of the same digest that are not hers (bob's bake, one
without an owner, one of hers that no bake made). alice's launch must take her own bake and name
each newer one as not taken; bob's must take his; a launch by someone with no bake of the image
is refused, naming what it did not take, before anything is created.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from support.aws import load, seed_recipe

from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.cluster import AwsCluster
from launcher.clusters.aws.executor import Executor, Mode
from launcher.clusters.aws.lookups import ami as ami_step
from launcher.errors import BadInput

pytestmark = pytest.mark.aws
DIGEST = str(seed_recipe().image.digest)


def _ami(ec2: Any, name: str, created: str, tags: dict[str, str]) -> str:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends

    image_id = ec2.register_image(Name=name, RootDeviceName="/dev/sda1", Architecture="x86_64")[
        "ImageId"
    ]
    ec2.create_tags(Resources=[image_id], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    backend = ec2_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].amis[image_id]
    backend.creation_date = datetime.fromisoformat(created.replace("Z", "+00:00"))
    return image_id


@pytest.fixture
def account(aws) -> dict[str, str]:
    ec2 = aws._real.client("ec2")
    bake = {rq.TAG_IMAGE_DIGEST: DIGEST, rq.TAG_RUN_ID: "bake-20261201T000000Z-aaaaaa"}
    return {
        "alice": _ami(ec2, "ami-a", "2026-12-01T10:00:00Z", bake | {rq.TAG_OWNER: "alice"}),
        "bob": _ami(ec2, "ami-b", "2026-12-02T10:00:00Z", bake | {rq.TAG_OWNER: "bob"}),
        "nobody": _ami(ec2, "ami-n", "2026-12-03T10:00:00Z", bake),
        "by hand": _ami(
            ec2,
            "ami-h",
            "2026-12-04T10:00:00Z",
            {rq.TAG_IMAGE_DIGEST: DIGEST, rq.TAG_OWNER: "alice", rq.TAG_RUN_ID: "r1"},
        ),
    }


def _lookup(aws: Any, tmp_path: Any, who: str) -> tuple[Any, Executor, list[str]]:
    lines: list[str] = []
    cluster = AwsCluster(
        seed_recipe(), load(tmp_path, ami="baked"), "r", session=aws, owner=who, log=lines.append
    )
    launch = cluster.launch_context()
    api = Executor(Mode.SEND, cluster.settings, cluster.client)
    ami_step(launch, api)
    return launch, api, lines


def test_alice_takes_her_own_bake_and_names_every_newer_one_not_hers(aws, account, tmp_path):
    launch, _, lines = _lookup(aws, tmp_path, "alice")
    assert launch.ami_id == account["alice"]
    said = "\n".join(lines)
    for other in ("bob", "nobody", "by hand"):
        assert f"not taken: {account[other]}" in said, said
    assert f"{rq.TAG_OWNER}=bob" in said and "not made by `reproduce image bake`" in said


def test_bob_takes_his_and_alices_older_one_is_not_named(aws, account, tmp_path):
    launch, _, lines = _lookup(aws, tmp_path, "bob")
    assert launch.ami_id == account["bob"]
    assert account["alice"] not in "\n".join(lines)  # older: never a candidate


def test_without_a_bake_of_ones_own_the_launch_is_refused_naming_the_others(aws, account, tmp_path):
    with pytest.raises(BadInput) as err:
        _lookup(aws, tmp_path, "carol")
    text = str(err.value)
    assert "carol has no available AMI" in text and "nothing was created" in text
    assert all(account[w] in text for w in ("alice", "bob", "nobody", "by hand"))
