"""Every run.json field that names a file or reaches a command line is checked against its form
when the record is read back (launcher/records/recordform.py, `RunDir.record`).

The attacker hands over a run directory whose run.json says `run_id: ../../escaped`: `reproduce
ssh` connected to the node (the real test sshd) and wrote the run's known_hosts two levels above
$REPRODUCE_HOME/ssh/. Now the read refuses it (exit 2, naming the field) before anything is
connected to, written or run. The class, generically: every key of real run.json files (a local
run the runner made, an ssh and an aws cluster's records) is either one of FORMS or named here
as data the launcher only shows (a key added later fails until it is placed), and every key of
FORMS, wherever it stands, holding each hostile value, is refused by the read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from support.json_docs import key_paths, with_value
from support.nodescript import job
from support.paths import REPO

from launcher.clusters.ssh import SSHCluster
from launcher.errors import BadInput
from launcher.inputs.profile import load_profile
from launcher.records.recordform import FORMS
from launcher.records.rundir import Files, RunDir

# Keys of run.json that neither name a file nor reach a command line: shown, compared, summed.
DATA_KEYS = {
    "kind", "created_at", "cluster", "node", "nodes", "meta", "name", "via", "offset_source",
    "budget", "launcher", "ssh", "hosts", "cost", "price", "launch_ids", "launched_at",
    "exit_code", "collected", "connect_timeout_s", "io_timeout_s", "host_key_fingerprint",
    "accept_unknown_host", "region", "keep", "target", "max_usd", "max_hours", "version",
    "commit", "dirty", "commit_note", "shared_node", "price_per_hour", "nodes_count",
    "instance_id",
}  # fmt: skip

HOSTILE = ["../../escaped", "..", "a/../../b", "-oProxyCommand=touch /tmp/pwned", "a b",
           "x\ny", "x; rm -rf /", "$(touch /tmp/pwned)", "", 5, -1, True, [1], {"a": 1}]  # fmt: skip


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )


def _ssh_run(runs_root: Path, tmp_path: Path, sshd: Any) -> RunDir:
    cluster = SSHCluster.from_profile(
        sshd.profile(known_hosts=str(tmp_path / "none"), host_key_fingerprint=sshd.host_fingerprint)
    )
    rd = RunDir.create(runs_root, "m/h/x")
    rd.update_record(
        cluster=cluster.to_record(),
        node=asdict(cluster.nodes()[0]),
        nodes=[asdict(cluster.nodes()[0])],
        node_run_dir=str(tmp_path / "noderun"),
        container=f"reproduce-{rd.run_id}",
    )
    rd.set_status("detached")
    (tmp_path / "noderun").mkdir()
    return rd


@pytest.mark.ssh
def test_ssh_never_writes_where_run_json_s_run_id_points(sshd, tmp_path, runs_root):
    rd = _ssh_run(runs_root, tmp_path, sshd)
    home = Path(os.environ["REPRODUCE_HOME"])
    record = json.loads((rd.path / Files.RUN).read_text())
    top = tmp_path.parents[1]  # the session's temporary root: every target below resolves here

    def planted() -> set[Path]:
        return {*top.rglob("*node0.known_hosts"), *top.rglob("*escaped*"), *top.rglob("b-node*")}

    before = planted()
    for run_id in ("../../escaped", "../../../escaped", "a/../../../b", ".."):
        record["run_id"] = run_id
        (rd.path / Files.RUN).write_text(json.dumps(record))
        result = _cli("ssh", str(rd.path), "--", "true", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert "run_id" in result.stderr and "Traceback" not in result.stderr
        assert planted() == before, planted() - before
    assert not (home / "ssh").exists() or not list((home / "ssh").iterdir())


def _real_records(tmp_path: Path) -> list[dict[str, Any]]:
    """run.json of a run the real runner made (local), and the cluster records an ssh and an
    aws run keep (their backends' own to_record)."""
    from launcher.clusters.local import LocalCluster
    from launcher.runner.runner import Runner

    rd, plan = job(tmp_path / "runs", tmp_path / "node", "_mark train start; _mark train end ok\n")
    (tmp_path / "scripts").mkdir()
    Runner(scripts_dir=tmp_path / "scripts", poll_s=0.05, measure=False).execute(
        plan, rd, LocalCluster()
    )
    local = rd.record()
    ssh = SSHCluster.from_profile(load_profile("ssh").raw)
    ssh_record = {
        **local,
        "cluster": ssh.to_record(),
        "nodes": [asdict(n) for n in ssh.nodes()],
        "node": asdict(ssh.nodes()[0]),
    }
    aws_record = {
        **local,
        "cluster": {
            "kind": "aws", "state_path": str(tmp_path / "aws.json"), "region": "us-east-2",
            "run_id": local["run_id"], "launch_id": "l-0123", "keep": False, "target": None,
            "ssh": {"user": "ubuntu", "identity_file": str(tmp_path / "key")},
        },  # fmt: skip
        "nodes": [{"name": "node0", "host": "10.0.0.5", "connect_host": "203.0.113.5",
                   "port": 22, "user": "ubuntu", "identity_file": str(tmp_path / "key"),
                   "meta": {"instance_id": "i-0abc"}, "work_dir": None,
                   "via": {"name": "head", "host": "10.0.0.4", "connect_host": "203.0.113.4",
                           "port": 22, "user": "ubuntu", "identity_file": None, "meta": {},
                           "work_dir": None, "via": None}}],
    }  # fmt: skip
    return [local, ssh_record, aws_record]


def _keys(value: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            found.add(key)
            if key not in ("env", "env_vars", "ray_job"):
                found |= _keys(item)
    elif isinstance(value, list):
        for item in value:
            found |= _keys(item)
    return found


def test_every_key_of_real_records_is_a_form_or_named_data(tmp_path):
    keys = set().union(*(_keys(r) for r in _real_records(tmp_path)))
    unplaced = keys - set(FORMS) - DATA_KEYS
    assert not unplaced, (
        f"run.json keys neither in recordform.FORMS nor named data here: {sorted(unplaced)}; "
        "a key that names a file or reaches a command line gets a form in FORMS"
    )


def test_every_form_key_wherever_it_stands_refuses_every_hostile_value(tmp_path):
    records = _real_records(tmp_path)
    rd = RunDir(tmp_path / "probe")
    rd.path.mkdir()
    tried = set()
    for record in records:
        (rd.path / Files.RUN).write_text(json.dumps(record))
        assert rd.record() == record  # the real records pass
        for path in key_paths(record):
            if path[-1] not in FORMS:
                continue
            tried.add(path[-1])
            for bad in HOSTILE:
                if FORMS[path[-1]][1](bad):
                    continue  # a value of the form (e.g. an integer port)
                (rd.path / Files.RUN).write_text(json.dumps(with_value(record, path, bad)))
                with pytest.raises(BadInput, match=str(path[-1])):
                    rd.record()
    assert tried >= {"run_id", "node_run_dir", "container", "host", "user", "identity_file"}


@pytest.mark.ssh
def test_a_record_missing_any_field_is_named_never_a_traceback(sshd, tmp_path, runs_root):
    """Absence is not a KeyError: a detached run whose run.json lacks any one field, given to each
    command that reads a run, ends with a documented exit code and, where it fails, a message;
    never Python's traceback. Walks every top-level key of a real record, so a field added later
    is covered unasked."""
    rd = _ssh_run(runs_root, tmp_path, sshd)
    whole = json.loads((rd.path / Files.RUN).read_text())
    assert {"node_run_dir", "container", "cluster", "nodes"} <= set(whole)
    for key in sorted(whole):
        (rd.path / Files.RUN).write_text(json.dumps({k: v for k, v in whole.items() if k != key}))
        for command in (["status", str(rd.path)], ["logs", str(rd.path)]):
            out = _cli(*command, cwd=tmp_path)
            said = out.stdout + out.stderr
            assert "Traceback" not in said, (key, command, said[-2000:])
            assert out.returncode in (0, 1, 2, 3), (key, command, out.returncode, said[-2000:])
            if out.returncode:
                assert said.strip(), (key, command)
