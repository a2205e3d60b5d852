"""`attest` and `verify` on a run of K measured runs (result.runs: 3): verify cuts node.log into
its runs again, re-measures each and their mean, and holds the attested measured/<k>/ to what the
log gives. The adversary signs what it changed (its own signature is valid): an edited run's
figures, a log with a run's step removed, a run left out, a run added; each is caught and named.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from support.attest import cli, keypair
from support.measure import seed_raw, step_times_for_tps
from support.measured_runs import k_runs, times_env

from launcher.errors import CheckFailed
from launcher.results.attest import ENVELOPE_FILE, evidence_files, sign, statement, subjects_of
from launcher.results.attest_keys import load_signing_key
from launcher.results.attest_predicate import build_predicate
from launcher.results.attest_verify import verify_dir

CLAIM = seed_raw()["result"]["tokens_per_s_per_gpu"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A run of three measured runs the real runner made, attested with `reproduce attest`."""
    root = tmp_path_factory.mktemp("attest-k")
    key, pub = keypair(root)
    times = [step_times_for_tps(CLAIM * f) for f in (0.99, 1.0, 1.01)]
    rd, _, execute = k_runs(root, 3, times_env(times))
    assert execute().exit_code == 0
    proc = cli("attest", rd.path, "--key", key)
    assert proc.returncode == 0, proc.stderr
    return {"run": rd.path, "key": key, "pub": pub}


def signed_copy(made: dict, tmp_path: Path, change) -> Path:
    """A copy of the attested run, changed by CHANGE(dir), then signed anew by the same key
    without attest's own check (a signer who does not re-measure)."""
    d = tmp_path / "copy"
    shutil.copytree(made["run"], d)
    change(d)
    stmt = statement(subjects_of(d, evidence_files(d)), build_predicate(d))
    (d / ENVELOPE_FILE).write_text(json.dumps(sign(stmt, load_signing_key(made["key"]))))
    return d


def refusal(d: Path, pub: Path) -> str:
    with pytest.raises(CheckFailed) as info:
        verify_dir(d, pub)
    return str(info.value)


def test_a_run_of_three_measured_runs_verifies_here_in_a_copy_and_in_a_bundle(made, tmp_path):
    run, pub = made["run"], made["pub"]
    proc = cli("verify", run, "--key", pub, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    mean = yaml.safe_load((run / "result.yaml").read_text())
    assert out["verdict"] == "reproduced"
    assert out["figures"]["tokens_per_s_per_gpu"] == mean["tokens_per_s_per_gpu"]
    copy = tmp_path / "elsewhere"
    shutil.copytree(run, copy)
    assert cli("verify", copy, "--key", pub).returncode == 0
    bundle = tmp_path / "run.tar.gz"
    assert cli("bundle", run, "--out", bundle).returncode == 0
    proc = cli("verify", bundle, "--key", pub)
    assert proc.returncode == 0, proc.stderr
    before = sorted(p.relative_to(run).as_posix() for p in run.rglob("*"))
    verify_dir(run, pub)
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) == before  # writes none


def _edit_run_2_figure(d: Path) -> None:
    path = d / "measured/2/result.yaml"
    data = yaml.safe_load(path.read_text())
    data["tokens_per_s_per_gpu"] = round(data["tokens_per_s_per_gpu"] * 1.05, 2)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _drop_a_step_of_run_2(d: Path) -> None:
    """One step line of the second run gone from node.log, train.log and the run's own cut (the
    logs agree with each other; its steps and figures, as signed, do not)."""
    cut = (d / "measured/2/logs/train.log").read_bytes()
    line = next(ln for ln in cut.splitlines(keepends=True) if b"step 5:" in ln)
    node = (d / "logs/node.log").read_bytes()
    second = node.index(b"stage=train event=start", node.index(b"stage=train event=start") + 1)
    first_run = len((d / "measured/1/logs/train.log").read_bytes())
    for name, after in (
        ("logs/node.log", second),
        ("logs/train.log", first_run),
        ("measured/2/logs/train.log", 0),
    ):
        data = (d / name).read_bytes()
        at = data.index(line, after)
        (d / name).write_bytes(data[:at] + data[at + len(line) :])


def _leave_run_3_out(d: Path) -> None:
    shutil.rmtree(d / "measured/3")


def _add_a_run_4(d: Path) -> None:
    shutil.copytree(d / "measured/3", d / "measured/4")


@pytest.mark.parametrize(
    "change, named",
    [
        (_edit_run_2_figure, "measured/2/result.yaml is not what the log gives: "
         "tokens_per_s_per_gpu: file"),
        (_drop_a_step_of_run_2, "measured/2/result.yaml is not what the log gives: provenance.parse.lines"),
        (_leave_run_3_out, "the log gives measured/3/"),
        (_add_a_run_4, "measured/4/"),
    ],
    ids=["edited-figure", "dropped-step", "run-left-out", "run-added"],
)  # fmt: skip
def test_a_signed_change_to_the_measured_runs_is_named(made, tmp_path, change, named):
    d = signed_copy(made, tmp_path, change)
    message = refusal(d, made["pub"])
    assert named in message, message


def test_a_mean_without_node_log_among_its_subjects_cannot_be_measured_again(made, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(made["run"], d)
    predicate = build_predicate(d)  # as measured, then node.log left out of what is signed
    (d / "logs/node.log").unlink()
    stmt = statement(subjects_of(d, evidence_files(d)), predicate)
    (d / ENVELOPE_FILE).write_text(json.dumps(sign(stmt, load_signing_key(made["key"]))))
    message = refusal(d, made["pub"])
    assert "mean of 3 measured runs" in message and "logs/node.log" in message


def test_a_measure_out_directory_of_the_three_runs_is_attested_and_verifies(made, tmp_path):
    """`measure RUN --out DIR` of a run of three: DIR holds the mean and measured/<k>/, not the
    node.log they were cut from; attest copies it in (inputs/logs/node.log) and verify
    re-measures from the copy, here and in a copy of DIR."""
    out = tmp_path / "out"
    assert cli("measure", made["run"], "--out", out).returncode == 0
    proc = cli("attest", out, "--key", made["key"])
    assert proc.returncode == 0, proc.stderr
    assert (out / "inputs/logs/node.log").read_bytes() == (
        made["run"] / "logs/node.log"
    ).read_bytes()
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for d in (out, copy):
        proc = cli("verify", d, "--key", made["pub"], "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["verdict"] == "reproduced"
    (copy / "inputs/logs/node.log").write_bytes(b"")  # the cut's source gone: caught
    assert "inputs/logs/node.log changed since it was attested" in refusal(copy, made["pub"])
