"""The predicate says what ran on what, from the directory's own files, and null with the reason
where the directory does not hold a fact (never a guess): an AWS run's instance ids and region
from its launch record, every node's GPUs, serials a driver did not give, a run before
RepoDigests were recorded. And `verify` stays fast and light: no boto3 or matplotlib."""

from __future__ import annotations

import json
import subprocess
import sys

from support.pages import make_run

from launcher.results.attest_predicate import build_predicate


def _gpu_report(host: str, serials: bool) -> dict:
    return {
        "host": host,
        "gpus": [
            {
                "index": str(i),
                "name": "NVIDIA H200",
                "uuid": f"GPU-{host}-{i}",
                "serial": f"SN{host}{i}" if serials else None,
                "pci.bus_id": f"0000:{i:02x}:00.0",
            }
            for i in range(8)
        ],
        "checks": [{"name": "driver_version", "value": "580.159.04"}],
    }


def test_an_aws_run_names_its_instances_region_and_every_nodes_gpus(tmp_path):
    rd = make_run(tmp_path)
    run = json.loads((rd / "run.json").read_text())
    run["cluster"] = {"kind": "aws", "region": "us-east-2"}
    run["nodes"] = [
        {
            "name": f"node{k}",
            "host": f"10.0.0.{k + 4}",
            "meta": {
                "instance_id": f"i-0abc{k}",
                "instance_type": "p5en.48xlarge",
                "region": "us-east-2",
                "az": "us-east-2b",
            },
        }
        for k in range(2)
    ]
    (rd / "run.json").write_text(json.dumps(run))
    (rd / "preflight-gpu.json").write_text(json.dumps(_gpu_report("a", True)))
    (rd / "logs" / "node-1").mkdir()
    (rd / "logs" / "node-1" / "preflight-gpu.json").write_text(json.dumps(_gpu_report("b", False)))
    p = build_predicate(rd)
    assert [n["instance_id"] for n in p["instance"]["nodes"]] == ["i-0abc0", "i-0abc1"]
    assert p["instance"]["type"] == "p5en.48xlarge" and p["instance"]["region"] == "us-east-2"
    assert p["instance"]["nodes"][1]["availability_zone"] == "us-east-2b"
    assert p["gpus"]["count"] == 16 and p["gpus"]["model"] == "NVIDIA H200"
    assert {d["node"] for d in p["gpus"]["devices"]} == {0, 1}
    assert p["gpus"]["devices"][0]["serial"] == "SNa0" and p["gpus"]["devices"][8]["serial"] is None
    assert "serial" in p["unavailable"]["gpus.devices.serial"]
    assert "IMDS" in p["unavailable"]["instance.node_metadata"]
    # pages_support's image.json predates RepoDigests: null, and why
    assert p["image"]["repo_digests"] is None and "image.repo_digests" in p["unavailable"]
    assert p["price"]["usd_per_hour"] > 0 and p["price"]["source"]
    assert [s["name"] for s in p["timeline"]["stages"]][:2] == ["preflight", "image"]


def test_a_directory_without_a_measurement_record_is_refused_with_the_way_out(tmp_path):
    from support.attest import cli, keypair

    rd = make_run(tmp_path)
    (rd / "measure.json").unlink()
    proc = cli("attest", rd, "--key", keypair(tmp_path)[0])
    assert proc.returncode == 2
    assert "measure.json" in proc.stderr and f"reproduce measure {rd}" in proc.stderr


def test_verify_imports_neither_boto3_nor_matplotlib_nor_securesystemslib(tmp_path):
    from support.attest import cli, keypair

    rd = make_run(tmp_path)
    key, pub = keypair(tmp_path)
    assert cli("attest", rd, "--key", key).returncode == 0
    code = (
        "import sys\n"
        "from launcher.commands import cli\n"
        f"sys.argv = ['reproduce', 'verify', {str(rd)!r}, '--key', {str(pub)!r}]\n"
        "try:\n    cli.main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "heavy = sorted(m for m in ('boto3', 'paramiko', 'ray', 'matplotlib', 'securesystemslib')"
        " if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY="
