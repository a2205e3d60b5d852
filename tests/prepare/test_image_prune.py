"""`reproduce image prune`: only this owner's finished bakes that a run would not take are removed,
the AMI before its snapshots, and what could not be removed is said with the command for it.

The account is moto (the CLI in this process, with moto's mock active), made to hold every kind
of AMI the rule must tell apart: this owner's bakes of the seed's image of three ages, a failed
one, one still pending and one disabled; another owner's; one tagged with the digest but not made
by a bake; this owner's bake of another image; and an AMI nobody baked. moto lets a snapshot go
while an AMI still uses it, which EC2 refuses (InvalidSnapshot.InUse): the account here refuses
it too, so an order that would fail on AWS fails here. The exact requests are checked with
botocore's Stubber against the EC2 service model.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest
from support.aws import StubbedSession, client_error, set_fake_env, write_profile
from support.cli import SEED, reproduce_here

from launcher.clusters.aws import requests as rq
from launcher.commands.image import prune_command
from launcher.errors import InfraError
from launcher.inputs.recipe import load_recipe
from launcher.prepare.prune import PruneRequest
from launcher.records.rundir import owner

pytestmark = pytest.mark.aws
DIGEST = str(load_recipe(SEED).image.digest)
OTHER = "sha256:" + "e" * 64
ME = owner()


def _ami(ec2: Any, name: str, created: str, tags: dict[str, str], state: str = "available") -> str:
    """An AMI with its own snapshot (moto makes one per registered image), its tags, age and
    state set as EC2 would have them."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends

    image_id = ec2.register_image(Name=name, RootDeviceName="/dev/sda1", Architecture="x86_64")[
        "ImageId"
    ]
    ec2.create_tags(Resources=[image_id], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    backend = ec2_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].amis[image_id]
    backend.creation_date = datetime.fromisoformat(created.replace("Z", "+00:00"))
    backend.state = state
    return image_id


def _bake_tags(digest: str = DIGEST, who: str = ME, run_id: str = "bake-20261201T000000Z-aaaaaa"):
    return {rq.TAG_IMAGE_DIGEST: digest, rq.TAG_OWNER: who, rq.TAG_RUN_ID: run_id}


def _snapshots(ec2: Any, image_id: str) -> list[str]:
    [image] = ec2.describe_images(ImageIds=[image_id])["Images"]
    return [m["Ebs"]["SnapshotId"] for m in image["BlockDeviceMappings"] if "Ebs" in m]


@pytest.fixture
def account(aws) -> dict[str, Any]:
    """Every kind of AMI the rule tells apart (module docstring), and EC2's InUse refusal."""
    ec2 = aws._real.client("ec2")
    made = {
        "newest": _ami(ec2, "bake-3", "2026-12-03T10:00:00.000Z", _bake_tags()),
        "middle": _ami(ec2, "bake-2", "2026-12-02T10:00:00.000Z", _bake_tags()),
        "oldest": _ami(ec2, "bake-1", "2026-12-01T10:00:00.000Z", _bake_tags()),
        "failed": _ami(ec2, "bake-f", "2026-12-03T11:00:00.000Z", _bake_tags(), "failed"),
        "pending": _ami(ec2, "bake-p", "2026-12-03T12:00:00.000Z", _bake_tags(), "pending"),
        "disabled": _ami(ec2, "bake-d", "2026-11-01T10:00:00.000Z", _bake_tags(), "disabled"),
        "alice": _ami(ec2, "bake-a", "2026-11-30T10:00:00.000Z", _bake_tags(who="alice")),
        "by-hand": _ami(ec2, "hand", "2026-11-29T10:00:00.000Z", _bake_tags(run_id="2026-x")),
        "other-image": _ami(ec2, "bake-o", "2026-11-28T10:00:00.000Z", _bake_tags(OTHER)),
        "untagged": _ami(ec2, "dlami-standin", "2026-11-27T10:00:00.000Z", {}),
    }
    snaps = {key: _snapshots(ec2, image_id) for key, image_id in made.items()}

    def in_use(params: dict) -> Exception | None:
        used = {
            m["Ebs"].get("SnapshotId")
            for image in ec2.describe_images(Owners=["self"])["Images"]
            for m in image.get("BlockDeviceMappings", [])
            if "Ebs" in m
        }
        if params["SnapshotId"] in used:
            return client_error("InvalidSnapshot.InUse", "in use by an AMI", "DeleteSnapshot")
        return None

    aws.faults["delete_snapshot"] = in_use
    return {"ec2": ec2, "ids": made, "snaps": snaps, "aws": aws}


def _left(ec2: Any) -> set[str]:
    return {image["ImageId"] for image in ec2.describe_images(Owners=["self"])["Images"]}


def _snaps_left(ec2: Any) -> set[str]:
    return {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}


def _line(out: str, image_id: str) -> str:
    [line] = [line for line in out.splitlines() if image_id in line]
    return line.split()[0]


def _prune(account: dict, req: PruneRequest, capsys) -> str:
    """The command's body against the account that refuses what EC2 refuses; its stdout."""
    assert prune_command(req, session=account["aws"], say=lambda _line: None) == 0
    return capsys.readouterr().out


def test_prune_removes_only_this_owners_finished_bakes_a_run_would_not_take(
    account, tmp_path, capsys
):
    ec2, ids, snaps = account["ec2"], account["ids"], account["snaps"]
    req = PruneRequest(SEED, profile=str(write_profile(tmp_path)))
    out = _prune(account, req, capsys)
    gone = {"middle", "oldest", "failed"}
    assert _left(ec2) == {ids[k] for k in ids if k not in gone}
    # each removed AMI's snapshot went after it (the account refuses the other order)
    removed_snaps = {s for k in gone for s in snaps[k]}
    assert removed_snaps and not removed_snaps & _snaps_left(ec2)
    assert {s for k in ids if k not in gone for s in snaps[k]} <= _snaps_left(ec2)
    # the plan, one line per AMI of the seed's image, in the user's words
    words = {k: _line(out, ids[k]) for k in ids if k not in ("other-image", "untagged")}
    assert words == {
        "newest": "keep",
        "middle": "remove",
        "oldest": "remove",
        "failed": "remove",
        "pending": "left",
        "disabled": "left",
        "alice": "left",
        "by-hand": "left",
    }
    assert ids["other-image"] not in out and ids["untagged"] not in out
    assert re.search(r"removed 3 AMI\(s\) and their snapshots: up to \d+ GB", out)
    assert "not this owner's" in out and "bake still under way" in out
    assert "nothing to remove" in _prune(account, req, capsys)  # again: nothing more


def test_the_dry_run_reads_the_same_plan_and_removes_nothing(account, tmp_path):
    ec2, ids = account["ec2"], account["ids"]
    before = (_left(ec2), _snaps_left(ec2))
    profile = write_profile(tmp_path)
    result = reproduce_here("image", "prune", "--all-images", "--keep-newest", "0", "--cluster", profile,
                            "--dry-run")  # fmt: skip
    assert result.code == 0, result.err
    assert (_left(ec2), _snaps_left(ec2)) == before
    for key in (
        "newest",
        "middle",
        "oldest",
        "failed",
        "other-image",
    ):  # --keep-newest 0: every one
        assert _line(result.out, ids[key]) == "would", key
    assert "dry run: nothing removed" in result.out
    assert ids["untagged"] not in result.out  # not a bake of any image


def test_keep_two_of_each_image(account, tmp_path, capsys):
    ec2, ids = account["ec2"], account["ids"]
    req = PruneRequest(None, profile=str(write_profile(tmp_path)), keep=2, all_images=True)
    _prune(account, req, capsys)
    assert ids["newest"] in _left(ec2) and ids["middle"] in _left(ec2)
    assert ids["oldest"] not in _left(ec2) and ids["failed"] not in _left(ec2)
    assert ids["other-image"] in _left(ec2)  # the only one of its image


def _image(image_id: str, created: str, snaps: list[str], digest: str = DIGEST) -> dict:
    return {
        "ImageId": image_id,
        "Name": f"reproduce-seed-{image_id}",
        "CreationDate": created,
        "State": "available",
        "BlockDeviceMappings": [
            {"DeviceName": f"/dev/sd{chr(97 + i)}", "Ebs": {"SnapshotId": s, "VolumeSize": 300}}
            for i, s in enumerate(snaps)
        ],
        "Tags": [{"Key": k, "Value": v} for k, v in _bake_tags(digest).items()],
    }


def test_the_requests_in_order_and_a_snapshot_that_cannot_go_is_exit_3_with_its_command(
    monkeypatch, tmp_path, capsys
):
    set_fake_env(monkeypatch)
    session = StubbedSession()
    stub = session.stub("ec2")
    old = "ami-0000000000000000a"
    stub.add_response(
        "describe_images",
        {
            "Images": [
                _image("ami-0000000000000000b", "2026-12-02T00:00:00.000Z", ["snap-b"]),
                _image(old, "2026-12-01T00:00:00.000Z", ["snap-a1", "snap-a2"]),
            ]
        },
        {
            "Owners": ["self"],
            "Filters": [{"Name": f"tag:{rq.TAG_IMAGE_DIGEST}", "Values": [DIGEST]}],
        },
    )
    stub.add_response("deregister_image", {"Return": True}, {"ImageId": old})
    stub.add_response("delete_snapshot", {}, {"SnapshotId": "snap-a1"})
    stub.add_client_error(
        "delete_snapshot",
        "UnauthorizedOperation",
        "not allowed",
        expected_params={"SnapshotId": "snap-a2"},
    )
    req = PruneRequest(SEED, profile=str(write_profile(tmp_path)))
    with pytest.raises(InfraError) as err:
        prune_command(req, session=session, say=lambda _line: None)
    session.done()  # every request sent, in this order, each valid for the EC2 model
    said = str(err.value)
    assert "snapshot snap-a2 of " + old in said
    assert "`aws ec2 delete-snapshot --snapshot-id snap-a2`" in said
    assert "snap-a1" not in said  # that one went
    out = capsys.readouterr().out
    assert "removed 1 AMI(s)" in out  # the AMI itself is gone: no run can take it


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--keep-newest", "-1"], "--keep-newest -1: expected 0 or more"),
        ([], "give a RECIPE"),
        (["--all-images", str(SEED)], "one of the two"),
    ],
)
def test_bad_input_is_one_paragraph_exit_2_and_nothing_is_asked(
    aws, tmp_path, monkeypatch, args, words
) -> None:
    def asked(*_a: Any, **_k: Any) -> None:
        raise AssertionError("AWS was asked before the input was checked")

    monkeypatch.setattr("launcher.clusters.aws.session.make_session", asked)
    profile = write_profile(tmp_path)
    recipe = [] if "--all-images" in args or args == [] else [str(SEED)]
    result = reproduce_here("image", "prune", *recipe, *args, "--cluster", profile)
    assert result.code == 2, result.out + result.err
    assert words in result.err and "Traceback" not in result.err


def test_a_profile_of_another_kind_is_refused(aws, tmp_path):
    local = tmp_path / "local.yaml"
    local.write_text("kind: local\n")
    result = reproduce_here("image", "prune", SEED, "--cluster", local)
    assert result.code == 2 and "expected an aws profile" in result.err


def test_without_credentials_nothing_is_asked(monkeypatch, tmp_path):
    set_fake_env(monkeypatch)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    result = reproduce_here("image", "prune", SEED, "--cluster", write_profile(tmp_path))
    assert result.code == 2
    assert "no AWS credentials found, so nothing was removed" in result.err
