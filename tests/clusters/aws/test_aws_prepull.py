"""The image's pull started by the instance's user data as it boots (launcher/clusters/aws/
requests.py, `user_data`): in the request for the run's image by digest, absent where the AMI holds
the image or the profile pulls nothing, and, against a real dockerd and registry, joined by
node.sh's own pull of the same digest, or replaced by it where the boot's pull failed."""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime

import pytest
from support.aws import load, seed_recipe
from support.docker import docker, push_test_image

from launcher.clusters.aws import provisioning_calls
from launcher.clusters.aws.requests import prepull_lines

pytestmark = pytest.mark.aws
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def user_data(tmp_path, **fields) -> str | None:
    calls = provisioning_calls(seed_recipe(), load(tmp_path, **fields), "r1", owner="a@b", now=NOW)
    [run] = [c for c in calls if c.operation == "RunInstances"]
    return run.params.get("UserData")


def test_the_boot_pulls_the_runs_image_by_digest_and_still_ends_itself_at_its_ttl(tmp_path):
    data = user_data(tmp_path)
    assert data is not None and data.startswith("#!/bin/bash\n")
    ref = seed_recipe().image.ref
    assert f"docker pull {ref}" in data and "@sha256:" in ref
    assert "shutdown -h +360" in data
    assert bash_parses(data)


@pytest.mark.parametrize(
    "fields, pulls, ends",
    [
        ({"ami": "baked"}, False, True),  # the AMI holds the image: nothing to pull
        ({"docker": {"pull": False}}, False, True),  # the profile says the node has it
        ({"self_terminate": False}, True, False),
        ({"ami": "baked", "self_terminate": False}, False, False),
    ],
)
def test_the_boot_pulls_only_what_the_node_will_pull(tmp_path, fields, pulls, ends):
    data = user_data(tmp_path, **fields)
    assert (data is not None and "docker pull" in data) == pulls
    assert (data is not None and "shutdown -h" in data) == ends
    assert data is None or bash_parses(data)


def bash_parses(script: str) -> bool:
    return subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def wait_until_the_log_says(log, *words: str, timeout_s: float = 120) -> None:
    """The boot's pull writes its log from the background (the file appears when it starts)."""
    deadline = time.monotonic() + timeout_s
    while not (log.exists() and any(w in log.read_text(errors="replace") for w in words)):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.2)


def image_json_digest(ref: str) -> list[str]:
    got = docker("image", "inspect", "--format", "{{range .RepoDigests}}{{println .}}{{end}}", ref)
    return got.stdout.split()


@pytest.mark.docker
def test_node_sh_pull_and_the_boots_pull_of_the_same_digest_both_succeed(registry, tmp_path):
    """Both pulls of a fresh image (not on this dockerd) are started at once, as on a node whose
    boot pull may still be going when node.sh's image stage starts. Which one dockerd serves first
    is its own (this small image may be whole before the second starts): in any order both succeed,
    the image is there by its digest, and the boot's log says what it did."""
    image = push_test_image(registry, tmp_path, tag=f"prepull-{time.time_ns()}", marker="prepull")
    log = tmp_path / "prepull.log"
    # backgrounded: the script returns at once (cloud-init does not wait for the pull)
    subprocess.run(
        ["bash", "-c", "\n".join(prepull_lines(image.ref, str(log)))], timeout=30, check=True
    )
    node = docker("pull", image.ref, timeout=300)  # node.sh's pull, while the boot's runs
    wait_until_the_log_says(log, f"Digest: {image.digest}")
    assert node.returncode == 0
    assert f"{image.repo}@{image.digest}" in image_json_digest(image.ref)
    docker("rmi", "-f", image.ref, check=False)


@pytest.mark.docker
def test_a_boot_pull_that_fails_leaves_the_pull_to_node_sh(registry, tmp_path):
    """A registry the boot cannot pull from (here: a digest it does not hold; on a node, one that
    needs the login node.sh has): the boot's pull fails in its log, and nothing else changes."""
    image = push_test_image(registry, tmp_path, tag=f"prepull-miss-{time.time_ns()}", marker="m")
    missing = f"{image.repo}@sha256:{'0' * 64}"
    log = tmp_path / "prepull.log"
    subprocess.run(["bash", "-c", "\n".join(prepull_lines(missing, str(log)))], check=True)
    wait_until_the_log_says(log, "Error", "not found")
    assert docker("pull", image.ref).returncode == 0  # node.sh's pull does it all
    docker("rmi", "-f", image.ref, check=False)
