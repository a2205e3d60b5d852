"""`reproduce logs RUN` (the run directory's copy, then the node's bytes by offset, never taking
the run over) and `reproduce ssh RUN` (the system ssh, trusting only the key the run pinned),
over the real test sshd; unknown commands get "did you mean"."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import slow_script_body, start_driver, wait_for
from support.nodescript import job
from support.paths import REPO

from launcher.clusters.ssh import SSHCluster
from launcher.records.rundir import RunDir, Timeline
from launcher.records.runs import is_followed
from launcher.runner.runlogs import StageFilter
from launcher.runner.runshell import Hop, ssh_argv
from launcher.runner.stream import LogSplitter


def _cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=timeout,
    )


def _snapshot(path: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


@pytest.mark.ssh
def test_logs_of_a_detached_run_read_the_node_without_taking_it_over(sshd, tmp_path, runs_root):
    rd, plan = job(runs_root, tmp_path / "node", slow_script_body(lines=100, delay_s=0.03))
    proc = start_driver(
        {
            "cluster": SSHCluster.from_profile(sshd.profile()).to_record(),
            "node_script": plan.node_script,
            "run_id": rd.run_id,
            "node_run_dir": plan.node_run_dir,
            "container": plan.container,
            "run_dir": str(rd.path),
            "poll_s": 0.05,
        },
        tmp_path,
    )
    wait_for(lambda: (rd.logs / "train.log").stat().st_size > 3000, what="streamed output")
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher is gone: nobody follows the run
    proc.wait()
    assert rd.status()["state"] == "running"
    before = _snapshot(rd.path)
    local = (rd.logs / "node.log").read_bytes()
    node_log = Path(plan.node_run_dir, "node.log")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    now = _cli("logs", rd.run_id, cwd=elsewhere)
    assert now.returncode == 0, now.stderr
    assert now.stdout.startswith(local) and len(now.stdout) > len(local)  # the node's part too
    followed = _cli("logs", rd.run_id, "--follow", cwd=elsewhere)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == node_log.read_bytes()  # byte for byte, to the run's end
    assert b"##reproduce stage=train event=end" in followed.stdout
    train = _cli("logs", rd.run_id, "--stage", "train", "--follow", cwd=elsewhere)
    lines = train.stdout.decode().splitlines()
    assert [int(x.split()[2]) for x in lines if x.startswith("train line")] == list(range(1, 101))
    assert not any(x.startswith("##reproduce stage=") or "preflight says" in x for x in lines)
    # nothing of the run directory changed, nobody took the run
    assert _snapshot(rd.path) == before and rd.status()["state"] == "running"
    assert not is_followed(rd.path)


def test_logs_of_an_ended_run_and_bad_input(tmp_path, runs_root):
    rd = RunDir.create(runs_root, "m/h/x", "20261201T000000Z-ended1")
    rd.write_bytes("logs/node.log", b"##reproduce stage=train event=start t=1\nstep 1\n")
    rd.write_bytes("logs/train.log", b"step 1\n")
    rd.write_bytes("logs/image.log", b"pulled\n")
    rd.set_status("done")
    assert _cli("logs", rd.run_id, cwd=tmp_path).stdout.endswith(b"step 1\n")
    assert _cli("logs", rd.run_id, "--stage", "train", cwd=tmp_path).stdout == b"step 1\n"
    for args, words in (
        (["--stage", "nope"], b"it has image, train"),
        (["--stage", "../../etc/passwd"], b"expected a stage name"),
        (["--node", "3"], b"has 1 node(s)"),
    ):
        bad = _cli("logs", rd.run_id, *args, cwd=tmp_path)
        assert bad.returncode == 2 and words in bad.stderr and b"Traceback" not in bad.stderr


def _generated_log(rng: random.Random) -> bytes:
    """A node.log of nested stages, lines looking like markers, long and empty lines."""
    out, open_ = [], []
    for _ in range(400):
        roll = rng.random()
        if roll < 0.12:
            name = rng.choice(["image", "train", "assets", "ray", "node", "../x", "train"])
            open_.append(name)
            out.append(f"##reproduce stage={name} event=start t=1\n")
        elif roll < 0.22 and open_:
            name = open_.pop(rng.randrange(len(open_)))
            out.append(f"##reproduce stage={name} event=end status=ok t=2\n")
        elif roll < 0.25:
            out.append("##reproduce progress stage=train done=3\n")
        elif roll < 0.27:
            out.append("x" * rng.choice([10, 4095, 5000]) + "\n")
        else:
            out.append(f"line {rng.random()} {'é' * rng.randrange(3)}\n")
    return "".join(out).encode()


@pytest.mark.parametrize("seed", range(6))
def test_a_stage_filter_keeps_exactly_the_splitters_lines(tmp_path, seed):
    rng = random.Random(seed)
    data = _generated_log(rng)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "node.log").write_bytes(data)
    LogSplitter(logs, Timeline()).rebuild()
    for stage in ("train", "image", "assets"):
        filt = StageFilter(stage)
        got, at = b"", 0
        while at < len(data):  # arbitrary pieces: a read by offset splits lines anywhere
            step = rng.randrange(1, 700)
            got += filt.feed(data[at : at + step])
            at += step
        got += filt.finish()
        expected = (logs / f"{stage}.log").read_bytes() if (logs / f"{stage}.log").exists() else b""
        assert got == expected, stage


def test_the_ssh_command_trusts_only_the_runs_key(tmp_path):
    head = Hop("203.0.113.5", 22, "ubuntu", "/k/id", "reproduce-r-node1-hop0", "ssh-ed25519", "AAA")
    worker = Hop("10.0.0.7", 2222, "ubuntu", "/k/id", "reproduce-r-node1-hop1", "ssh-rsa", "BBB")
    known = tmp_path / "kh"
    argv = ssh_argv([worker], known, ["nvidia-smi", "-L"], tty=False)
    assert argv[0] == "ssh" and argv[-3:] == ["ubuntu@10.0.0.7", "nvidia-smi", "-L"]
    text = " ".join(argv)
    for option in (
        "StrictHostKeyChecking=yes",
        f"UserKnownHostsFile={known}",
        "GlobalKnownHostsFile=/dev/null",
        "HostKeyAlias=reproduce-r-node1-hop1",
        "HostKeyAlgorithms=rsa-sha2-512,rsa-sha2-256,ssh-rsa",
        "-p 2222",
        "-i /k/id -o IdentitiesOnly=yes",
    ):
        assert option in text
    assert "-t" not in argv
    jumped = ssh_argv([head, worker], known, [])
    proxy = next(a for a in jumped if a.startswith("ProxyCommand="))
    assert "-W 10.0.0.7:2222 -- ubuntu@203.0.113.5" in proxy
    assert "HostKeyAlias=reproduce-r-node1-hop0" in proxy and "StrictHostKeyChecking=yes" in proxy
    assert "-t" in jumped and jumped[-1] == "ubuntu@10.0.0.7"


@pytest.mark.parametrize("field", ["user", "dial", "jump user", "jump dial"])
def test_a_host_or_user_that_looks_like_an_option_never_runs_a_command_here(tmp_path, field):
    """The real ssh client, given the command line `reproduce ssh` builds for a node whose user
    or address is `-oProxyCommand=touch MARK`: without `--` before the destination, ssh read it
    as an option and ran the command on the operator's machine; with it, it is a name that
    resolves to nothing. (The profile schema refuses such names before any run: the class is
    held at both ends.)"""
    mark = tmp_path / "ran"
    evil = f"-oProxyCommand=touch {mark}"

    def hop(dial: str, user: str | None) -> Hop:
        return Hop(dial, 22, user, None, "alias", "ssh-ed25519", "AAA")

    user, dial = (evil, "127.0.0.1") if "user" in field else (None, evil)
    hops = [hop(dial, user), hop("127.0.0.1", None)] if "jump" in field else [hop(dial, user)]
    argv = ssh_argv(hops, tmp_path / "kh", ["true"], tty=False)
    argv[1:1] = ["-o", "ConnectTimeout=2", "-o", "BatchMode=yes", "-F", "/dev/null"]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 255, proc.stderr  # ssh's own failure: it never connected
    assert not list(tmp_path.glob("ran*")), f"ssh ran the profile's command: {argv}"


def _ssh_run(runs_root: Path, tmp_path: Path, sshd, **profile) -> RunDir:
    cluster = SSHCluster.from_profile(sshd.profile(**profile))
    rd = RunDir.create(runs_root, "m/h/x")
    from dataclasses import asdict

    rd.update_record(
        cluster=cluster.to_record(),
        node=asdict(cluster.nodes()[0]),
        node_run_dir=str(tmp_path / "noderun"),
        container=f"reproduce-{rd.run_id}",
    )
    rd.set_status("detached")
    (tmp_path / "noderun").mkdir()
    return rd


@pytest.mark.ssh
def test_ssh_runs_a_command_on_the_node_with_the_pinned_key(sshd, tmp_path, runs_root):
    nowhere = str(tmp_path / "no_known_hosts")  # the pin alone says which key is the node's
    rd = _ssh_run(
        runs_root, tmp_path, sshd, known_hosts=nowhere, host_key_fingerprint=sshd.host_fingerprint
    )
    result = _cli("ssh", rd.run_id, "--", "echo", "hello-from-$(hostname)", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().startswith("hello-from-")
    (known,) = (Path(os.environ["REPRODUCE_HOME"]) / "ssh").glob("*.known_hosts")
    assert stat.S_IMODE(known.stat().st_mode) == 0o600
    assert known.read_text().split()[1] == "ssh-ed25519"
    assert not Path(nowhere).exists()  # nothing trusted on first use


@pytest.mark.ssh
def test_ssh_refuses_a_node_showing_another_key(sshd, tmp_path, runs_root):
    rd = _ssh_run(
        runs_root,
        tmp_path,
        sshd,
        known_hosts=str(tmp_path / "none"),
        host_key_fingerprint="SHA256:" + "A" * 43,
    )
    result = _cli("ssh", rd.run_id, "--", "echo", "never", cwd=tmp_path)
    assert result.returncode == 3 and b"never" not in result.stdout
    assert b"refusing to connect" in result.stderr and b"Traceback" not in result.stderr


def test_ssh_of_a_local_run_says_where_its_directory_is(tmp_path, runs_root):
    rd = RunDir.create(runs_root, "m/h/x")
    rd.update_record(
        cluster={"kind": "local"},
        node={"name": "localhost", "host": "localhost"},
        node_run_dir="/var/tmp/x",
        container="c",
    )
    result = _cli("ssh", rd.run_id, cwd=tmp_path)
    assert result.returncode == 2 and b"/var/tmp/x" in result.stderr


@pytest.mark.parametrize(
    ("word", "suggestion"), [("statsu", "'status'"), ("atach", "'attach'"), ("lgos", "'logs'")]
)
def test_a_mistyped_command_gets_did_you_mean(tmp_path, word, suggestion):
    result = _cli(word, "RUN", cwd=tmp_path)
    err = result.stderr.decode()
    assert result.returncode == 2 and f"did you mean {suggestion}" in err
    assert "no such recipe file" not in err
    as_json = _cli(word, "--json", cwd=tmp_path)
    assert json.loads(as_json.stdout)["exit_code"] == 2


def test_a_missing_recipe_file_is_still_the_runs_error(tmp_path):
    result = _cli("recipes/nope.yaml", "--dry-run", cwd=tmp_path)
    assert result.returncode == 2 and b"no such recipe file" in result.stderr
