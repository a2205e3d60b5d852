"""The walk: every state an aws run can be in x the commands that read or end it x where the user
stands (the launch directory, another directory, a shell without $HOME and without the user's
index). It holds both promises of docs/operator.md at once: a command does the same from any
directory, and a node bills only while a run needs it.

Real parts, each the cheapest that is still the real thing: the launch is AwsCluster's against a
moto server on loopback (the CLI's own session, AWS_ENDPOINT_URL), the "instance" is the sshd
fixture, the launcher that follows the run is the real runner in its own process
(tests/support/drive.py: signals reach it as they reach the CLI), the node script is a short one
running the stand-in miles (its real log format), and every command is the CLI's (in this
process: support.cli.completed_here). After each state's commands: moto holds no instance,
address, group or key pair the user did not ask to keep; every cost shown is the instance's
lifetime x price (within a second of what AWS states); the commands' words and exit codes are
the same from every directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from support.attest import _node_body
from support.aws import OPERATOR_KEY, live_resources, load, seed_recipe, serve_placement_groups
from support.cli import completed_here
from support.helpers import start_driver, wait_for
from support.measure import SEED, seed_raw, step_times_for_tps
from support.paths import REPO

from launcher.records.rundir import RunDir

pytestmark = [pytest.mark.aws, pytest.mark.ssh]

PRICE = 63.296
SLUG = "test/walk"
# every state a run can be in, and what the user did last (the command that ends it, from where)
STATES = {
    "followed": None,  # the launcher followed it to its end: released
    "detached-running": ("cancel", "homeless"),
    "detached-finished": ("attach", "other"),
    "killed-9": ("attach", "homeless"),
    "cancelled": ("cancel", "other"),  # cancelled while running, from another directory
    "kept": None,  # --keep: the user asked to keep the node
    "down": ("down", "other"),  # a kept node ended with `down`
}
STEP_S = step_times_for_tps(seed_raw()["result"]["tokens_per_s_per_gpu"])
READERS = ("status", "logs", "measure", "compare")


@pytest.fixture
def place(tmp_path, moto_server, sshd, monkeypatch):
    """The launch directory, another one, an empty state home (the shell without $HOME), the
    moto account with the operator's key and an AMI."""
    import urllib.request

    from launcher.clusters.aws.session import new_session

    # the server's backends live in this process and outlive it: each state starts from nothing
    reset = urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST")
    urllib.request.urlopen(reset).close()
    serve_placement_groups(monkeypatch)  # moto's server has none: the launcher asks
    dirs = {name: tmp_path / name for name in ("launch", "other", "homeless", "xdg")}
    for d in dirs.values():
        d.mkdir()
    session = new_session("us-east-1")
    ec2 = session.client("ec2")
    ec2.import_key_pair(
        KeyName=OPERATOR_KEY, PublicKeyMaterial=Path(f"{sshd.identity_file}.pub").read_bytes()
    )
    ami = ec2.register_image(Name="dlami", RootDeviceName="/dev/sda1", Architecture="x86_64")
    monkeypatch.chdir(dirs["launch"])
    return {"dirs": dirs, "session": session, "ec2": ec2, "ami": ami["ImageId"], "sshd": sshd}


def launch(place: dict[str, Any], tmp_path: Path, *, keep: bool, tail: str) -> dict[str, Any]:
    """Launch an instance for a new run (from the launch directory, its runs root relative to it)
    and start the launcher that follows it, in its own process."""
    from launcher.clusters.aws.cluster import AwsCluster

    sshd = place["sshd"]
    rd = RunDir.create(Path("runs"), SLUG)
    rd.write_text("recipe.yaml", SEED.read_text())
    rd.write_json("plan.json", {"profile": {"name": "aws-walk", "kind": "aws"}, "nodes": 1})
    rd.update_record(cost={"price_per_hour": PRICE, "nodes": 1, "gpus_per_node": 8})
    profile = load(
        tmp_path, port=sshd.port, user=sshd.user, identity_file=str(sshd.identity_file),
        key_name=OPERATOR_KEY, price_per_hour=PRICE, elastic_ip=False, run_end_grace_s=5,
    )  # fmt: skip
    cluster = AwsCluster(
        seed_recipe(), profile, rd.run_id, keep=keep, session=place["session"],
        ami_resolver=lambda _name: place["ami"], state_path=rd.path / "aws.json",
        poll_s=0.05, owner="walker", price_per_hour=PRICE,
    )  # fmt: skip
    cluster.acquire()
    node_run_dir = str(tmp_path / "node" / rd.run_id)
    spec = {
        "cluster": cluster.to_record(),
        "node_script": _script(rd.run_id, node_run_dir, tail),
        "run_dir": str(rd.path),
        "run_id": rd.run_id,
        "node_run_dir": node_run_dir,
        "on_interrupt": "detach",
        "poll_s": 0.1,
    }
    proc = start_driver(spec, tmp_path)
    return {"rd": rd, "proc": proc, "node_run_dir": Path(node_run_dir)}


def _script(run_id: str, node_run_dir: str, tail: str) -> str:
    from support.nodescript import script

    return script(run_id, node_run_dir, f"reproduce-{run_id}", _node_body(STEP_S) + tail)


def trained(run: dict[str, Any]) -> bool:
    log = run["rd"].logs / "node.log"
    return log.is_file() and "step 19" in log.read_text(errors="replace")


def reach(place: dict[str, Any], tmp_path: Path, state: str) -> dict[str, Any]:
    """A run in `state`, reached the way a user gets there."""
    keep = state in ("kept", "down")
    tail = "" if state in ("followed", "kept", "down") else "sleep 3\n"
    if state in ("detached-running", "cancelled"):
        tail = "sleep 120\n"  # still running when the user comes back
    run = launch(place, tmp_path, keep=keep, tail=tail)
    proc = run["proc"]
    if state in ("followed", "kept", "down"):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
        if keep:  # the command that ends it works from anywhere: the run's absolute directory
            assert f"`reproduce down {run['rd'].path}`" in out + err, out + err
    else:
        wait_for(lambda: trained(run), 60, "the training's last step")
        if state == "killed-9":
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        else:  # Ctrl-C, answered "detach"
            os.killpg(proc.pid, signal.SIGINT)
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0 and "detached: run" in err, out + err
            assert "it ends itself 5 s after the run ends" in err  # what will really happen
        if state == "detached-finished":
            wait_for(lambda: (run["node_run_dir"] / "exit_code").is_file(), 30, "the run's end")
    return run


def cli(place: dict[str, Any], where: str, run: dict[str, Any], *args: str):
    """`reproduce ARGS` from `where`; the run given by id, or (no $HOME, no index) by path."""
    rd = run["rd"]
    ref = str(rd.path) if where == "homeless" else rd.run_id
    argv = [a.replace("RUN", ref) for a in args]
    if where == "homeless":
        env = {"XDG_STATE_HOME": str(place["dirs"]["xdg"])}
        return completed_here(
            *argv, cwd=place["dirs"][where], env=env, unset=("HOME", "REPRODUCE_HOME")
        )
    return completed_here(*argv, cwd=place["dirs"][where])


def ssh(place: dict[str, Any], run: dict[str, Any]) -> subprocess.CompletedProcess:
    """`reproduce ssh RUN -- true` from another directory: the system ssh, so its own process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "launcher", "ssh", run["rd"].run_id, "--", "true"],
        cwd=place["dirs"]["other"], env=env, capture_output=True, text=True,
        stdin=subprocess.DEVNULL, timeout=60,
    )  # fmt: skip


def instances(place: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        i["InstanceId"]: i
        for r in place["ec2"].describe_instances()["Reservations"]
        for i in r["Instances"]
    }


def true_cost(inst: dict[str, Any], now: float) -> float:
    """What AWS bills for one instance so far: its LaunchTime to its end (or now)."""
    from launcher.clusters.aws.lifetime import ended_at

    start = inst["LaunchTime"].astimezone(UTC).timestamp()
    end = ended_at(inst, now) if inst["State"]["Name"] == "terminated" else now
    return (end - start) / 3600 * PRICE


@pytest.mark.parametrize("state", list(STATES))
def test_every_command_from_every_directory_in_every_state(place, tmp_path, state):
    run = reach(place, tmp_path, state)
    rd = run["rd"]
    try:
        # a shell on the node from another directory: while its instance lives, and refused
        # (saying why) once it is gone
        if state in ("killed-9", "kept"):  # one process each: only where it tells most
            shell = ssh(place, run)
            assert shell.returncode == 0, shell.stderr
        elif state == "followed":
            shell = ssh(place, run)
            assert shell.returncode == 2 and "its instance was ended with it" in shell.stderr
        ender = STATES[state]
        if ender is not None:
            command, where = ender
            got = cli(place, where, run, command, "RUN")
            said = got.stdout + got.stderr
            assert got.returncode == 0 and "Traceback" not in said, said
        # the readers: the same words and exit code from every directory
        seen: dict[str, dict[str, Any]] = {}
        for reader in READERS:
            args = {"status": ["status", "RUN", "--refresh", "--json"], "logs": ["logs", "RUN"],
                    "measure": ["measure", "RUN", "--json"],
                    "compare": ["compare", "RUN", "RUN"]}[reader]  # fmt: skip
            for where in ("launch", "other", "homeless"):
                got = cli(place, where, run, *args)
                said = got.stdout + got.stderr
                assert "Traceback" not in said, (reader, where, said)
                seen.setdefault(reader, {})[where] = (got.returncode, _same(reader, got.stdout))
            codes = seen[reader]
            assert len(set(codes.values())) == 1, (reader, codes)
        assert seen["logs"]["other"][0] == 0 and seen["status"]["other"][0] == 0
        # the user's own listings (not of one run): the same from the launch dir and another
        for args in (["history", SLUG, "--json"], ["runs", "--json"]):
            here, there = (cli(place, w, run, *args) for w in ("launch", "other"))
            assert here.returncode == there.returncode, (args, here.stderr, there.stderr)
            assert "Traceback" not in here.stderr + there.stderr
        made = [p for d in ("other", "homeless") for p in place["dirs"][d].iterdir()]
        assert made == [], made  # a command that takes a run makes nothing where it is run

        # moto: nothing the user did not ask to keep
        live = live_resources(place["ec2"])
        live["key_pairs"].remove(OPERATOR_KEY)
        alive = {i: x for i, x in instances(place).items() if x["State"]["Name"] != "terminated"}
        if state == "kept":
            assert len(alive) == 1 and live["security_groups"] and live["key_pairs"] == []
        else:
            assert alive == {} and live == {
                "instances": [], "addresses": [], "security_groups": [], "key_pairs": []
            }, live  # fmt: skip
        # the cost shown is the instance's lifetime x price, within a second of billing
        got = cli(place, "other", run, "status", "RUN", "--refresh", "--json")
        now = time.time()
        shown = json.loads(got.stdout)["cost_usd"]
        [inst] = instances(place).values()
        assert shown == pytest.approx(true_cost(inst, now), abs=PRICE / 3600 * 1.0), state
        if not alive:  # gone: the cost is frozen
            time.sleep(1.0)
            again = json.loads(cli(place, "launch", run, "status", "RUN", "--json").stdout)
            assert again["cost_usd"] == pytest.approx(shown, abs=1e-6)
        runs = json.loads(cli(place, "other", run, "runs", "--cost", "--json").stdout)
        [row] = [r for r in runs["runs"] if r["run_id"] == rd.run_id]
        assert row["billing"] == bool(alive)
    finally:
        if run["proc"].poll() is None:
            os.killpg(run["proc"].pid, signal.SIGKILL)
        if instances(place) and any(
            i["State"]["Name"] != "terminated" for i in instances(place).values()
        ):
            completed_here("down", str(rd.path))
        (run["node_run_dir"]).mkdir(parents=True, exist_ok=True)


def _same(reader: str, stdout: str) -> Any:
    """What must not differ between directories (time-dependent figures left out)."""
    if reader == "status":
        data = json.loads(stdout)
        return (data["state"], data["run_dir"], bool(data["billing"]), data["verdict"])
    if reader == "measure":
        try:
            return json.loads(stdout)["verdict"]["status"]
        except (ValueError, KeyError, TypeError):
            return stdout
    return stdout
