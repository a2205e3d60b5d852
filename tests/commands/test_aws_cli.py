"""`reproduce down`, `reproduce reap` and `reproduce capacity` as a user runs them (a moto server on loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from support.aws import (
    NOTHING,
    REPO,
    SEED,
    live_resources,
    seed_recipe,
    serve_placement_groups,
    write_profile,
)

from launcher.clusters.aws.cluster import AwsCluster
from launcher.records.rundir import owner

pytestmark = pytest.mark.aws


def reproduce(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
        timeout=120,
        cwd=REPO,
    )


def kept_run(
    tmp_path,
    banner,
    run_id: str,
    ttl_hours: float = 6,
    started_hours_ago: float = 0,
    who: str | None = None,
):
    import boto3

    from launcher.inputs.profile import load_profile

    ec2 = boto3.client("ec2", region_name="us-east-1")
    image = ec2.register_image(Name="dlami-standin", RootDeviceName="/dev/sda1")["ImageId"]
    profile = load_profile(
        str(write_profile(tmp_path, port=banner.port, ami=image, ttl_hours=ttl_hours))
    )
    run_dir = tmp_path / "runs" / "x" / f"20261129T000000Z-{run_id}"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_id}))
    c = AwsCluster(
        seed_recipe(),
        profile,
        run_id,
        keep=True,
        state_path=run_dir / "aws.json",
        key_dir=tmp_path / "keys",
        poll_s=0.05,
        log=lambda m: None,
        owner=who or owner(),  # the CLI's own, in the subprocesses below
    )
    c.now = lambda: datetime.now(UTC) - timedelta(hours=started_hours_ago)
    c.acquire()
    c.release()  # --keep: nothing ended
    return ec2, run_dir


def test_down_by_run_id_ends_a_kept_node(moto_server, tmp_path, banner):
    ec2, run_dir = kept_run(tmp_path, banner, "keep1")
    assert live_resources(ec2)["instances"]
    result = reproduce("down", "keep1", "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode == 0, result.stderr
    assert "ended instance i-" in result.stdout
    assert live_resources(ec2) == NOTHING
    assert not list((tmp_path / "keys").glob("reproduce-keep1-*.pem"))


def test_reap_ends_expired_runs_only(moto_server, tmp_path, banner, monkeypatch):
    serve_placement_groups(monkeypatch)  # reap's listing needs them answered, not failed
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    ec2, _ = kept_run(tmp_path / "a", banner, "expired", ttl_hours=1, started_hours_ago=2)
    _, _ = kept_run(tmp_path / "b", banner, "current", ttl_hours=6)
    _, _ = kept_run(tmp_path / "c", banner, "bobs", ttl_hours=1, started_hours_ago=2, who="bob")
    dry = reproduce("reap", "--region", "us-east-1", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would end run expired" in dry.stdout and "current" not in dry.stdout
    assert "run bobs" in dry.stdout and "--all-owners" in dry.stdout  # listed as left alone
    assert "would end run bobs" not in dry.stdout
    assert len(live_resources(ec2)["instances"]) == 3
    unasked = reproduce("reap", "--region", "us-east-1")  # no terminal to ask, no --yes
    assert unasked.returncode == 2 and "nothing was ended" in unasked.stderr, unasked.stderr
    assert "Traceback" not in unasked.stderr and "run expired" in unasked.stdout
    assert len(live_resources(ec2)["instances"]) == 3
    result = reproduce("reap", "--region", "us-east-1", "--yes")
    assert result.returncode == 0, result.stderr
    left = live_resources(ec2)
    assert len(left["instances"]) == 2  # the current run's and bob's
    assert sorted(k.rsplit("-", 1)[0] for k in left["key_pairs"]) == [
        "reproduce-bobs",
        "reproduce-current",
    ]
    every = reproduce("reap", "--region", "us-east-1", "--all-owners", "--yes")
    assert every.returncode == 0, every.stderr
    assert [k.rsplit("-", 1)[0] for k in live_resources(ec2)["key_pairs"]] == ["reproduce-current"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["down", "no-such-run", "--runs-dir", "/nonexistent"], "no run 'no-such-run'"),
        (["reap", "--region", "us-nowhere-9"], "unknown AWS region"),
        (["capacity", str(SEED), "--hours", "5"], "whole days"),
        (["capacity", str(SEED), "--cluster", "local"], "kind local"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(moto_server, args, words):
    result = reproduce(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr
