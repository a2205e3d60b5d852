"""Cost of the AWS request builder (the dry run's provisioning part) and of a launch/teardown cycle on moto.

Usage: .venv/bin/python benchmarks/aws_request.py [--runs 200] [--cycles 5]
- builder: median microseconds of provisioning_calls(seed, env/aws.yaml) in-process, and whether
  importing it pulled in boto3/botocore (it must not: the dry run needs no AWS libraries);
- cycle: median seconds of AwsCluster.acquire() + release() against in-process moto, i.e. the
  launcher's own overhead per launch (AWS itself adds minutes: boot, status checks, termination).
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def builder(runs: int) -> tuple[float, list[str]]:
    from launcher.clusters.aws import provisioning_calls
    from launcher.inputs.profile import load_profile
    from launcher.inputs.recipe import load_recipe

    leaked = sorted(
        {m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("boto3", "botocore")}
    )
    recipe = load_recipe(REPO / "recipes/qwen3-30b-a3b/h200/attune-tp1-pp1-ep8-mt16k.yaml")
    profile = load_profile("aws")
    now = datetime.now(UTC)
    times = []
    for i in range(runs):
        t0 = time.perf_counter()
        provisioning_calls(recipe, profile, f"r{i}", owner="bench", now=now)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6, leaked


def cycles(n: int) -> float:
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        MOTO_EC2_LOAD_DEFAULT_AMIS="false",
    )
    import tempfile

    import boto3
    import yaml
    from moto import mock_aws

    from launcher.clusters.aws.cluster import AwsCluster
    from launcher.inputs.profile import load_profile
    from launcher.inputs.recipe import load_recipe

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)

    def greet() -> None:
        while True:
            conn, _ = srv.accept()
            conn.sendall(b"SSH-2.0-bench\r\n")
            conn.close()

    threading.Thread(target=greet, daemon=True).start()
    recipe = load_recipe(REPO / "recipes/qwen3-30b-a3b/h200/attune-tp1-pp1-ep8-mt16k.yaml")
    times = []
    with tempfile.TemporaryDirectory() as tmp, mock_aws():
        session = boto3.Session(region_name="us-east-1")
        ami = session.client("ec2").register_image(Name="bench-ami", RootDeviceName="/dev/sda1")[
            "ImageId"
        ]
        path = Path(tmp) / "aws.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "kind": "aws",
                    "region": "us-east-1",
                    "ami": ami,
                    "ssh_cidr": "127.0.0.1/32",
                    "connect_host": "127.0.0.1",
                    "port": srv.getsockname()[1],
                }
            )
        )
        profile = load_profile(str(path))
        for i in range(n):
            c = AwsCluster(
                recipe,
                profile,
                f"b{i}",
                session=session,
                state_path=Path(tmp) / f"{i}.json",
                key_dir=Path(tmp) / "keys",
                poll_s=0.01,
                log=lambda m: None,
            )
            t0 = time.perf_counter()
            c.acquire()
            c.release()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--cycles", type=int, default=5)
    args = ap.parse_args()
    us, leaked = builder(args.runs)
    print(
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    print(
        f"provisioning_calls: median {us:.0f} us over {args.runs} calls; AWS libraries imported: {leaked or 'none'}"
    )
    print(f"acquire+release on moto: median {cycles(args.cycles):.3f} s over {args.cycles} cycles")


if __name__ == "__main__":
    main()
