"""`runs --refresh` under another account's credentials (docs/aws.md, "Whose a resource is").

EC2 lists none of a run's instances to another account, and the refresh read every instance it
did not list as long gone: a kept p5en of account A looked ended to credentials of account B.
A run whose aws.json records another account than the credentials' is refused, naming both,
before EC2 is asked; the last known state stays.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from support.cli import completed_here

from launcher.records.rundir import RunDir, Timeline

pytestmark = pytest.mark.aws


def _run(root, run_id: str, instance: str, account: str) -> RunDir:
    rd = RunDir.create(root, "m/h/a-0123456789", run_id)
    rd.write_json("plan.json", {"profile": {"name": "aws", "kind": "aws"}, "nodes": 1})
    rd.update_record(cluster={"kind": "aws", "region": "us-east-1", "keep": True})
    rd.write_json(
        "aws.json",
        {"kind": "aws", "region": "us-east-1", "account": account, "instances": [instance],
         "targeted": [], "terminated": [], "addresses": []},
    )  # fmt: skip
    rd.write_timeline(Timeline(acquired_at=1_790_000_000.0, released_at=None))
    rd.set_status("detached", None)
    return rd


@pytest.mark.parametrize("account", ["123456789012", "999999999999"], ids=["same", "other"])
def test_refresh_under_another_accounts_credentials_is_refused(moto_server, tmp_path, account):
    import boto3

    urllib.request.urlopen(urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST"))
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_server)
    ami = ec2.register_image(Name="ami-for-billing", RootDeviceName="/dev/sda1")["ImageId"]
    iid = ec2.run_instances(ImageId=ami, InstanceType="p5en.48xlarge", MinCount=1, MaxCount=1)[
        "Instances"
    ][0]["InstanceId"]
    if account == "999999999999":  # the run is another account's: its instance is not this one
        iid = "i-0aaaaaaaaaaaaaaaa"
    _run(tmp_path / "runs", "20261201T090000Z-acct01", iid, account)
    res = completed_here("runs", "--refresh", "--json", cwd=tmp_path)
    if account == "123456789012":  # moto's account: asked, and the instance runs
        assert res.returncode == 0, res.stderr
        (run,) = json.loads(res.stdout)["runs"]
        assert run["billing"]["instances"] == {iid: "running"}
        return
    assert res.returncode == 2, res.stdout + res.stderr
    said = json.loads(res.stdout)["error"]
    assert "999999999999" in said and "123456789012" in said and "nothing was refreshed" in said
    assert "Traceback" not in res.stderr
