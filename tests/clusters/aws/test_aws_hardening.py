"""The real AwsCluster when the launcher's own side fails: a full disk, a closed terminal (SIGHUP,
EIO on every print), a slow boot past the budget; the launched host's SSH key pinned from its
console output; and the profile's limits (SSH CIDR width, prices, TTL)."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest
from support.aws import NOTHING, console, live_resources, load, seed_recipe, write_profile

from launcher.clusters.aws import provisioning_calls
from launcher.clusters.aws.cluster import AwsCluster
from launcher.cost.budget import Budget
from launcher.errors import BadInput, CheckFailed, InfraError
from launcher.runner.signals import release_hard

pytestmark = pytest.mark.aws


def cluster(aws, ami, tmp_path, state_dir: Path | None = None, log=None, **fields):
    logs: list[str] = []
    c = AwsCluster(
        seed_recipe(),
        load(tmp_path, **fields),
        "h1",
        session=aws,
        ami_resolver=lambda name: ami,
        state_path=(state_dir or tmp_path / "run") / "aws.json",
        key_dir=tmp_path / "keys",
        poll_s=0.01,
        log=log or logs.append,
        owner="test",
    )
    c.logs = logs
    return c


def ec2_of(aws):
    return aws._real.client("ec2")


# --- a full disk on the launcher ------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A real 256 KiB tmpfs (root only; skipped where mounting is not allowed)."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> None:
    """Write until the file system says ENOSPC (a real full disk, not a mocked error)."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as err:
        assert err.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_a_full_disk_after_run_instances_never_skips_the_termination(
    aws, ami, tmp_path, banner, small_disk
):
    real = ec2_of(aws)

    def launched_then_disk_full(params):
        answer = real.run_instances(**params)
        fill(small_disk)  # the launcher's disk fills up the moment the instance exists
        return answer

    aws.faults["run_instances"] = launched_then_disk_full
    c = cluster(aws, ami, tmp_path, state_dir=small_disk / "run", port=banner.port)
    with pytest.raises(InfraError) as err:
        c.acquire()
    assert "No space left" in str(err.value) and "aws.json" in str(err.value)
    release_hard(c)  # may say that aws.json is stale; must not skip TerminateInstances
    assert "terminate_instances" in aws.calls.names()
    assert live_resources(real) == NOTHING
    said = " ".join(c.logs)
    assert "could not be updated" in said and "No space left" in said


def test_a_disk_full_during_teardown_still_terminates(aws, ami, tmp_path, banner, small_disk):
    c = cluster(aws, ami, tmp_path, state_dir=small_disk / "run", port=banner.port)
    c.acquire()
    fill(small_disk)
    c.release()
    assert live_resources(ec2_of(aws)) == NOTHING


# --- the terminal closes: SIGHUP, then every print raises EIO ---------------------------------------


def test_sighup_during_teardown_with_every_print_failing_still_ends_everything(
    aws, ami, tmp_path, banner
):
    from support.nodescript import plan_running

    from launcher.errors import Interrupted
    from launcher.records.rundir import RunDir
    from launcher.runner.runner import Runner

    gone: list[int] = []

    def terminal(line: str) -> None:  # print() on a closed terminal
        if gone:
            raise OSError(errno.EIO, "Input/output error")

    def hang_up(_params):
        gone.append(1)
        os.kill(os.getpid(), signal.SIGHUP)

    c = cluster(aws, ami, tmp_path, port=banner.port, log=terminal)
    aws.faults["describe_instance_status"] = hang_up  # launched, booting: the terminal closes
    aws.faults["terminate_instances"] = lambda p: os.kill(os.getpid(), signal.SIGHUP)  # again
    plan = plan_running("h1", str(tmp_path / "node"), "echo never reached\n")
    with pytest.raises(Interrupted, match="SIGHUP"):
        Runner(measure=False, poll_s=0.05).execute(plan, RunDir(tmp_path / "run"), c)
    assert live_resources(ec2_of(aws)) == NOTHING


def test_a_release_interrupted_by_eio_from_a_signal_handler_is_retried(aws, ami, tmp_path, banner):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    c.acquire()

    def eio(_line: str) -> None:
        raise OSError(errno.EIO, "Input/output error")

    sent = []

    def hang_up(_params):
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGHUP)  # release_hard's handler warns: EIO

    aws.faults["terminate_instances"] = hang_up
    assert release_hard(c, warn=eio) is None
    assert live_resources(ec2_of(aws)) == NOTHING


# --- the budget while acquiring ---------------------------------------------------------------------


def test_the_budget_is_checked_while_the_instance_boots(aws, ami, tmp_path, banner):
    from support.nodescript import plan_running

    from launcher.records.rundir import RunDir
    from launcher.runner.runner import Runner

    aws.faults["describe_instance_status"] = lambda p: {"InstanceStatuses": []}  # a slow boot
    c = cluster(aws, ami, tmp_path, port=banner.port, ready_timeout_s=600)
    plan = plan_running("h1", str(tmp_path / "node"), "echo never reached\n")
    budget = Budget(max_usd=None, max_hours=0.5 / 3600, price_per_hour=63.296)  # 0.5 s
    with pytest.raises(CheckFailed, match="--max-hours") as err:
        Runner(measure=False, poll_s=0.05).execute(plan, RunDir(tmp_path / "run"), c, budget=budget)
    assert err.value.exit_code == 1 and "while acquiring" in str(err.value)
    assert live_resources(ec2_of(aws)) == NOTHING


# --- the host key: pinned from the instance's console output ----------------------------------------


def ssh_cluster(aws, ami, tmp_path, sshd, **fields):
    ec2 = ec2_of(aws)
    if "operator" not in [k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]]:
        pub = Path(f"{sshd.identity_file}.pub").read_bytes()
        ec2.import_key_pair(KeyName="operator", PublicKeyMaterial=pub)
    return cluster(
        aws,
        ami,
        tmp_path,
        port=sshd.port,
        user=sshd.user,
        key_name="operator",
        identity_file=str(sshd.identity_file),
        ready_timeout_s=20,
        **fields,
    )


@pytest.mark.ssh
def test_the_host_key_is_pinned_from_the_console_fingerprints(aws, ami, tmp_path, sshd):
    aws.faults["get_console_output"] = console("SHA256:" + "A" * 43, sshd.host_fingerprint)
    c = ssh_cluster(aws, ami, tmp_path, sshd)
    [node] = c.acquire()
    assert sshd.host_fingerprint in node.meta["host_key_fingerprints"]
    assert c.transport(node).run("echo pinned").stdout.strip() == "pinned"
    assert not (tmp_path / "run" / "aws_known_hosts").exists()  # nothing trusted on first use
    c.release()
    assert live_resources(ec2_of(aws))["instances"] == []


@pytest.mark.ssh
def test_a_host_key_other_than_the_console_printed_is_refused(aws, ami, tmp_path, sshd):
    aws.faults["get_console_output"] = console("SHA256:" + "B" * 43)  # someone else answers
    c = ssh_cluster(aws, ami, tmp_path, sshd)
    [node] = c.acquire()
    with pytest.raises(InfraError, match="host key"):
        c.transport(node).run("echo never")
    c.release()
    assert live_resources(ec2_of(aws))["instances"] == []


@pytest.mark.ssh
def test_no_fingerprints_on_the_console_in_time_says_so_and_trusts_on_first_use(
    aws, ami, tmp_path, sshd
):
    del aws.canned["get_console_output"]  # moto's own console output: no fingerprints
    c = ssh_cluster(aws, ami, tmp_path, sshd, host_key_wait_s=0.2)
    [node] = c.acquire()
    said = " ".join(c.logs)
    assert "no SSH host key fingerprints" in said and "trusted on first use" in said
    assert c.transport(node).run("echo tofu").stdout.strip() == "tofu"
    assert "aws_known_hosts" in os.listdir(tmp_path / "run")
    c.release()


# --- the key file ------------------------------------------------------------------------------------


def test_the_run_key_is_0600_outside_the_run_dir_and_gone_after(aws, ami, tmp_path, banner):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    [node] = c.acquire()
    key = Path(node.identity_file)
    assert key.parent == tmp_path / "keys" and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert not any(p.suffix == ".pem" for p in (tmp_path / "run").iterdir())
    c.release()
    assert not key.exists()


# --- the profile's limits ------------------------------------------------------------------------------


def calls(tmp_path, **fields):
    from datetime import UTC, datetime

    profile = load(tmp_path, **fields)
    return provisioning_calls(seed_recipe(), profile, "r", owner="o", now=datetime.now(UTC))


@pytest.mark.parametrize(
    "cidr, ok",
    [
        ("203.0.113.7/32", True),
        ("10.1.0.0/16", True),
        ("10.0.0.0/15", False),
        ("0.0.0.0/1", False),
        ("2001:db8:1::/48", True),
        ("2001:db8::/47", False),
        ("::/1", False),
    ],
)
def test_ssh_cidr_no_wider_than_16_or_48(tmp_path, cidr, ok):
    if ok:
        calls(tmp_path, ssh_cidr=cidr)
        return
    with pytest.raises(BadInput) as err:
        calls(tmp_path, ssh_cidr=cidr)
    assert "ssh_cidr" in str(err.value) and err.value.exit_code == 2


def test_the_default_ssh_rule_is_the_operators_address_as_a_32(tmp_path):
    from launcher.clusters.aws.requests import is_placeholder

    ingress = next(
        c for c in calls(tmp_path, ssh_cidr=None) if c.operation == "AuthorizeSecurityGroupIngress"
    )
    cidr = ingress.params["IpPermissions"][1]["IpRanges"][0]["CidrIp"]
    assert is_placeholder(cidr) and "/32" in cidr


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"price_per_hour": float("nan")}, "price_per_hour"),
        ({"price_per_hour": float("inf")}, "price_per_hour"),
        ({"ttl_hours": float("nan")}, "ttl_hours"),
        ({"ttl_hours": 169}, "ttl_hours"),
        ({"ttl_hours": 1e6}, "ttl_hours"),
        ({"capacity": {"type": "spot", "max_spot_price": float("nan")}}, "max_spot_price"),
    ],
)
def test_non_finite_prices_and_unbounded_ttls_are_refused(tmp_path, fields, words):
    with pytest.raises(BadInput) as err:
        calls(tmp_path, **fields)
    assert words in str(err.value) and err.value.exit_code == 2


def test_a_week_is_the_longest_ttl(tmp_path):
    [run] = [c for c in calls(tmp_path, ttl_hours=168) if c.operation == "RunInstances"]
    assert "shutdown -h +10080" in run.params["UserData"]


@pytest.mark.parametrize("flag", ["nan", "inf"])
def test_a_non_finite_price_override_is_refused_before_anything(tmp_path, flag):
    from launcher.runner.prelaunch import RunOptions, prepare

    profile = write_profile(tmp_path)
    with pytest.raises(BadInput, match="price"):
        prepare(
            str(seed_recipe().path),
            RunOptions(cluster=str(profile), price_per_hour=float(flag)),
        )


def test_a_non_finite_budget_is_refused():
    for bad in (float("nan"), float("inf")):
        with pytest.raises(BadInput):
            Budget(max_usd=bad, max_hours=None, price_per_hour=63.296)
        with pytest.raises(BadInput):
            Budget(max_usd=None, max_hours=bad, price_per_hour=63.296)
        with pytest.raises(BadInput):
            Budget(max_usd=10.0, max_hours=None, price_per_hour=bad)


def test_the_state_of_a_launch_records_its_account_and_launch_id(aws, ami, tmp_path, banner):
    c = cluster(aws, ami, tmp_path, port=banner.port)
    [node] = c.acquire()
    state = json.loads((tmp_path / "run" / "aws.json").read_text())
    assert state["account"] == "123456789012" and len(state["launch_id"]) >= 8
    inst = ec2_of(aws).describe_instances(InstanceIds=[node.meta["instance_id"]])
    tags = {t["Key"]: t["Value"] for t in inst["Reservations"][0]["Instances"][0]["Tags"]}
    assert tags["reproduce:launch-id"] == state["launch_id"]
    c.release()
