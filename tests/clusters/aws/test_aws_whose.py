"""Whose a resource is, checked before any command ends it (docs/aws.md, "Whose a resource is").

A walk over every kind of resource the launcher lists or ends (instances, Elastic IPs, security
groups, key pairs, placement groups, AMIs and their snapshots): the account (moto) holds alice's
expired launch, alice's kept launch, bob's expired kept launch, and, of every kind, foreign
resources that claim to be theirs: hand-made ones carrying alice's run id and a past
expires-at, imposters carrying a real launch's every tag (run id, launch id, owner, expiry) but
not made by it (another ClientToken, another name), ones of a launch id no launch has, and AMIs
and snapshots of other owners or of no bake. Then every command that ends something runs as
alice (`reap`, `down`, `image prune`), and `reap --all-owners` after them: each ends exactly
what its launch or owner made, and no planted resource is touched.

An Elastic IP carrying a real launch's every tag is taken as that launch's: it has no name or
token to tell it apart (docs/aws.md says so); one of a launch nothing else shows is left.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from support.aws import cluster, ec2_of

from launcher.clusters.aws import prune as pr
from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.down import down
from launcher.clusters.aws.reap import reap

pytestmark = pytest.mark.aws
PAST = (datetime.now(UTC) - timedelta(hours=2)).strftime(rq.EXPIRES_FORMAT)
DIGEST = "sha256:" + "d" * 64


def _spec(kind: str, tags: dict[str, str]) -> list[dict[str, Any]]:
    return [{"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]


def _launch_tags(ec2: Any, iid: str) -> dict[str, str]:
    [inst] = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"]
    return {k: v for k, v in rq.tag_values(inst["Tags"]).items() if k.startswith("reproduce:")}


class Planted:
    """Foreign resources of every kind, each with what says it still exists."""

    def __init__(self, aws: Any, ami: str) -> None:
        self.aws, self.ec2, self.ami = aws, ec2_of(aws), ami
        self.things: list[tuple[str, str]] = []  # (kind, id)

    def instance(self, tags: dict[str, str]) -> None:
        iid = self.ec2.run_instances(
            ImageId=self.ami,
            InstanceType="t3.micro",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=_spec("instance", tags),
        )["Instances"][0]["InstanceId"]
        self.things.append(("instance", iid))

    def address(self, tags: dict[str, str]) -> None:
        aid = self.ec2.allocate_address(Domain="vpc")["AllocationId"]
        self.ec2.create_tags(Resources=[aid], Tags=_spec("x", tags)[0]["Tags"])
        self.things.append(("address", aid))

    def security_group(self, name: str, tags: dict[str, str]) -> None:
        gid = self.ec2.create_security_group(
            GroupName=name, Description="planted", TagSpecifications=_spec("security-group", tags)
        )["GroupId"]
        self.things.append(("security_group", gid))

    def key_pair(self, name: str, tags: dict[str, str]) -> None:
        self.ec2.create_key_pair(KeyName=name, TagSpecifications=_spec("key-pair", tags))
        self.things.append(("key_pair", name))

    def placement_group(self, name: str, tags: dict[str, str]) -> None:
        self.aws.placement_groups.create(
            {"GroupName": name, "TagSpecifications": _spec("placement-group", tags)}
        )
        self.things.append(("placement_group", name))

    def image(self, name: str, tags: dict[str, str]) -> None:
        image_id = self.ec2.register_image(
            Name=name, RootDeviceName="/dev/sda1", Architecture="x86_64"
        )["ImageId"]
        self.ec2.create_tags(Resources=[image_id], Tags=_spec("x", tags)[0]["Tags"])
        self.things.append(("image", image_id))
        [img] = self.ec2.describe_images(ImageIds=[image_id])["Images"]
        for m in img.get("BlockDeviceMappings") or []:
            if m.get("Ebs", {}).get("SnapshotId"):
                self.things.append(("snapshot", m["Ebs"]["SnapshotId"]))

    def snapshot(self, tags: dict[str, str]) -> None:
        vol = self.ec2.create_volume(AvailabilityZone="us-east-1a", Size=1)["VolumeId"]
        sid = self.ec2.create_snapshot(VolumeId=vol, TagSpecifications=_spec("snapshot", tags))[
            "SnapshotId"
        ]
        self.things.append(("snapshot", sid))

    def every_kind(self, prefix: str, tags: dict[str, str], *, with_address: bool) -> None:
        self.instance(tags)
        if with_address:
            self.address(tags)
        self.security_group(f"{prefix}-sg", tags)
        self.key_pair(f"{prefix}-key", tags)
        self.placement_group(f"{prefix}-pg", tags)
        self.snapshot(tags)

    def missing(self) -> list[tuple[str, str]]:
        ec2, gone = self.ec2, []
        for kind, ident in self.things:
            if kind == "instance":
                [i] = ec2.describe_instances(InstanceIds=[ident])["Reservations"][0]["Instances"]
                alive = i["State"]["Name"] not in ("shutting-down", "terminated")
            elif kind == "address":
                alive = bool(ec2.describe_addresses(AllocationIds=[ident])["Addresses"])
            elif kind == "security_group":
                f = [{"Name": "group-id", "Values": [ident]}]
                alive = bool(ec2.describe_security_groups(Filters=f)["SecurityGroups"])
            elif kind == "key_pair":
                f = [{"Name": "key-name", "Values": [ident]}]
                alive = bool(ec2.describe_key_pairs(Filters=f)["KeyPairs"])
            elif kind == "placement_group":
                alive = ident in self.aws.placement_groups.groups
            elif kind == "image":
                alive = bool(ec2.describe_images(ImageIds=[ident])["Images"])
            else:
                f = [{"Name": "snapshot-id", "Values": [ident]}]
                alive = bool(ec2.describe_snapshots(Filters=f)["Snapshots"])
            if not alive:
                gone.append((kind, ident))
        return gone


def _kept(aws, ami, tmp_path, port: int, where: str, run_id: str, who: str, hours_ago: float):
    c = cluster(
        aws, ami, tmp_path, where, run_id=run_id, keep=True, owner=who, ttl_hours=1, port=port
    )
    c.now = lambda: datetime.now(UTC) - timedelta(hours=hours_ago)
    [node] = c.acquire()
    c.release()  # --keep: everything stays
    return node.meta["instance_id"]


def _alive(ec2: Any, iid: str) -> bool:
    [i] = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"]
    return i["State"]["Name"] not in ("shutting-down", "terminated")


def test_no_command_ends_a_resource_that_is_not_its_own(aws, ami, tmp_path, banner):
    ec2, port = ec2_of(aws), banner.port
    old = _kept(aws, ami, tmp_path, port, "old", "alice-old", "alice", 3)
    kept = _kept(aws, ami, tmp_path, port, "kept", "alice-kept", "alice", 0)
    bobs = _kept(aws, ami, tmp_path, port, "bob", "bob-old", "bob", 3)

    plant = Planted(aws, ami)
    hand = {rq.TAG_RUN_ID: "alice-old", rq.TAG_EXPIRES: PAST, rq.TAG_OWNER: "alice"}
    plant.every_kind("handmade", hand, with_address=True)
    for name, iid in (("imposter-old", old), ("imposter-kept", kept), ("imposter-bob", bobs)):
        plant.every_kind(name, _launch_tags(ec2, iid), with_address=False)
    ghost = hand | {rq.TAG_RUN_ID: "ghost", rq.TAG_LAUNCH: "0123456789ab"}
    plant.every_kind("ghost", ghost, with_address=True)
    bake = {rq.TAG_IMAGE_DIGEST: DIGEST, rq.TAG_RUN_ID: "bake-20261201T000000Z-aaaaaa"}
    plant.image("bobs-bake", bake | {rq.TAG_OWNER: "bob"})
    plant.image("nobodys-bake", bake)
    plant.image("alices-not-a-bake", {rq.TAG_IMAGE_DIGEST: DIGEST, rq.TAG_OWNER: "alice"})
    assert plant.missing() == []

    # alice's reap: her expired launch only
    lines: list[str] = []
    ended = reap("us-east-1", owner="alice", session=aws, poll_s=0.01, log=lines.append)
    assert f"instance {old}" in ended and not _alive(ec2, old)
    assert _alive(ec2, bobs) and _alive(ec2, kept)
    said = "\n".join(lines)
    assert "left alone" in said and "bob-old" in said and "--all-owners" in said
    # alice's down of her kept launch
    down(tmp_path / "kept" / "aws.json", session=aws, poll_s=0.01, log=lambda _: None)
    assert not _alive(ec2, kept) and _alive(ec2, bobs)
    # alice's image prune of every image, keeping none
    found = pr.prune_plan(pr.list_baked(ec2, None), owner="alice", keep=0)
    assert not found.remove
    # and the operator's reap of every owner: bob's launch, nothing planted
    ended = reap("us-east-1", owner=None, session=aws, poll_s=0.01, log=lambda _: None)
    assert f"instance {bobs}" in ended and not _alive(ec2, bobs)
    assert plant.missing() == []


# ---- AWS's answers to reap's listing: an error is never an empty account -------------------------

AWS_ANSWERS = {
    "UnauthorizedOperation": 403,
    "AuthFailure": 401,
    "RequestLimitExceeded": 503,
    "InternalError": 500,
    "connection": 0,
}
LISTING = [
    "DescribeInstances",
    "DescribeAddresses",
    "DescribeSecurityGroups",
    "DescribeKeyPairs",
    "DescribePlacementGroups",
]


def test_reap_ends_nothing_and_says_so_on_every_error_of_its_listing(aws, ami, tmp_path, banner):
    """Each call of reap's listing answered, in turn, with each kind of error: reap fails (a
    ReproduceError, one line), ends nothing and never says there was nothing to end."""
    from botocore.awsrequest import AWSResponse
    from botocore.exceptions import EndpointConnectionError

    from launcher.errors import ReproduceError

    ec2 = ec2_of(aws)
    events = aws._real.events  # the session's: every client reap makes from it inherits them
    old = _kept(aws, ami, tmp_path, banner.port, "old", "alice-old", "alice", 3)
    for op in LISTING:
        for code, status in AWS_ANSWERS.items():

            def answer(code: str = code, status: int = status, **_: Any) -> Any:
                if code == "connection":
                    raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
                body = {"Error": {"Code": code, "Message": "injected"}, "ResponseMetadata": {}}
                return AWSResponse("http://127.0.0.1", status, {}, None), body

            if op == "DescribePlacementGroups":  # answered by the session's stand-in
                err = None
                try:
                    answer()
                except EndpointConnectionError as e:
                    err = e
                if err is None:
                    from botocore.exceptions import ClientError

                    err = ClientError(answer()[1], op)
                aws.faults["describe_placement_groups"] = err
            else:
                events.register_first(f"before-call.ec2.{op}", answer)
            lines: list[str] = []
            with pytest.raises(ReproduceError):
                reap("us-east-1", owner="alice", session=aws, poll_s=0.01, log=lines.append)
            assert _alive(ec2, old), (op, code)
            assert not any("nothing" in line and "past its expires-at" in line for line in lines)
            aws.faults.pop("describe_placement_groups", None)
            events.unregister(f"before-call.ec2.{op}", answer)
    assert f"instance {old}" in reap(
        "us-east-1", owner="alice", session=aws, poll_s=0.01, log=lambda _: None
    )


def test_a_failed_bakes_cleanup_deletes_its_own_snapshots_not_a_tag_copy(aws):
    """bake.discard_image finds a half-made AMI's snapshots by its mapping and by the bake's
    launch tags; one that copies those tags but was not made for the AMI is left alone."""
    from launcher.clusters.aws.bake import discard_image

    plant = Planted(aws, "")
    ec2 = plant.ec2
    tags = {rq.TAG_RUN_ID: "bake-1", rq.TAG_LAUNCH: "0123456789ab", rq.TAG_OWNER: "alice"}
    image_id = ec2.register_image(Name="half-made", RootDeviceName="/dev/sda1")["ImageId"]
    [img] = ec2.describe_images(ImageIds=[image_id])["Images"]
    own = [m["Ebs"]["SnapshotId"] for m in img["BlockDeviceMappings"] if "Ebs" in m]
    ec2.create_tags(Resources=own, Tags=_spec("x", tags)[0]["Tags"])
    plant.snapshot(tags)  # the same tags, another description
    lines: list[str] = []
    assert discard_image(ec2, image_id, "bake-1", "0123456789ab", lines.append) == []
    left = {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    assert not set(own) & left and plant.missing() == []
    assert any("left alone" in line for line in lines)
