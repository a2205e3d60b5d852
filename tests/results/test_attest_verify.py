"""`reproduce attest` and `reproduce verify` as a user runs them, on a run directory the real runner
made and on a `measure --out` directory; and every way the evidence can be changed afterwards,
each caught and named (which file, which figure, by how much)."""

from __future__ import annotations

import base64
import json
import random
import shutil
from pathlib import Path

import pytest
import yaml
from support.attest import CLAIM, cli, keypair, measured_out, real_run

from launcher.errors import CheckFailed
from launcher.results.attest import ENVELOPE_FILE, PUB_FILE, sign
from launcher.results.attest_keys import load_signing_key
from launcher.results.attest_verify import verify_dir


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A real run directory and a measure --out directory, both attested with one key."""
    root = tmp_path_factory.mktemp("attest")
    key, pub = keypair(root)
    (root / "runs").mkdir()
    run = real_run(root / "runs", root / "node")
    out = measured_out(root / "bare")
    unattested = measured_out(root / "bare2")
    for d in (run, out):
        proc = cli("attest", d, "--key", key)
        assert proc.returncode == 0, proc.stderr
    return {"run": run, "out": out, "key": key, "pub": pub, "root": root, "unattested": unattested}


def copy_of(src: Path, tmp_path: Path, name: str = "copy") -> Path:
    dest = tmp_path / name
    shutil.copytree(src, dest)
    return dest


def statement_of(d: Path) -> dict:
    return json.loads(base64.b64decode(json.loads((d / ENVELOPE_FILE).read_text())["payload"]))


def failure(d: Path, pub: Path | None) -> str:
    with pytest.raises(CheckFailed) as info:
        verify_dir(d, pub)
    return str(info.value)


def test_a_run_directory_the_runner_made_is_attested_and_verifies(made):
    run, pub = made["run"], made["pub"]
    proc = cli("verify", run, "--key", pub)
    assert proc.returncode == 0, proc.stderr
    fp = json.loads(cli("verify", run, "--key", pub, "--json").stdout)["signed_by"]
    assert fp.startswith("SHA256:") and fp in proc.stdout and "(the key given)" in proc.stdout
    assert "verdict reproduced" in proc.stdout and f"{CLAIM}" in proc.stdout
    names = {s["name"] for s in statement_of(run)["subject"]}
    for evidence in (
        "logs/node.log",
        "logs/train.log",
        "timeline.json",
        "preflight.json",
        "preflight-gpu.json",
        "image.json",
        "stack.json",
        "recipe.yaml",
        "run.json",
        "result.yaml",
        "verdict.json",
        "measure.json",
    ):
        assert evidence in names, evidence
    assert not names & {ENVELOPE_FILE, PUB_FILE, "report.html", ".follow.lock"}
    predicate = statement_of(run)["predicate"]
    assert predicate["gpus"]["count"] == 8 and predicate["gpus"]["driver_version"] == "580.159.04"
    assert all(d["uuid"].startswith("GPU-") and d["serial"] for d in predicate["gpus"]["devices"])
    assert predicate["image"]["repo_digests"] == [predicate["image"]["pinned"]]
    assert predicate["verdict"]["status"] == "reproduced"
    assert predicate["figures"]["tokens_per_s_per_gpu"] == CLAIM
    assert predicate["launcher"]["run"]["version"] and predicate["policy"]["version"] == 6
    # a local host has no instance id: null, with the reason, never invented
    assert predicate["instance"]["nodes"][0]["instance_id"] is None
    assert "local" in predicate["unavailable"]["instance.nodes.instance_id"]


def test_a_measure_out_directory_holds_what_was_measured_and_verifies_without_the_original(
    made, tmp_path
):
    out, pub = made["out"], made["pub"]
    assert (out / "inputs" / "train.log").read_bytes() == (
        made["root"] / "bare" / "logs" / "train.log"
    ).read_bytes()
    moved = copy_of(out, tmp_path)
    shutil.rmtree(made["root"] / "bare" / "logs")  # the log measured is gone; the copy holds it
    proc = cli("verify", moved, "--key", pub)
    assert proc.returncode == 0, proc.stderr


def test_verify_passes_on_a_copy_elsewhere_and_on_a_bundle(made, tmp_path):
    run, pub = made["run"], made["pub"]
    moved = copy_of(run, tmp_path, "elsewhere")
    assert cli("verify", moved, "--key", pub).returncode == 0
    bundle = tmp_path / "run.tar.gz"
    proc = cli("bundle", moved, "--out", bundle)
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(moved)
    far = tmp_path / "far" / "away.tar.gz"
    far.parent.mkdir()
    shutil.copyfile(bundle, far)
    got = cli("verify", far, "--key", pub)
    assert got.returncode == 0, got.stderr
    assert "verdict reproduced" in got.stdout
    assert not list(far.parent.glob("*/"))  # verify unpacked it elsewhere, and removed that


def test_verify_writes_nothing_into_the_directory_it_checks(made):
    run, pub = made["run"], made["pub"]

    def snapshot() -> dict:
        return {
            p.relative_to(run).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
            for p in run.rglob("*")
            if p.is_file()
        }

    before = snapshot()
    assert cli("verify", run, "--key", pub).returncode == 0
    assert snapshot() == before


@pytest.mark.parametrize("which", ["run", "out"])
def test_any_subject_altered_by_one_byte_fails_naming_that_file(made, tmp_path, which):
    """Every subject, one byte each (an adversary's byte at a random place: seeded)."""
    pub = made["pub"]
    d = copy_of(made[which], tmp_path)
    rng = random.Random(21)
    for subject in statement_of(d)["subject"]:
        path = d / subject["name"]
        original = path.read_bytes()
        data = bytearray(original)
        at = rng.randrange(len(data)) if data else 0
        if data:
            data[at] ^= 1 << rng.randrange(8)
        else:
            data = bytearray(b"x")
        path.write_bytes(bytes(data))
        message = failure(d, pub)
        assert f"{subject['name']} changed since it was attested" in message, message
        path.write_bytes(original)
    verify_dir(d, pub)  # all restored: it holds again


def test_one_changed_byte_is_exit_1_with_one_clear_message(made, tmp_path):
    d = copy_of(made["run"], tmp_path)
    log = d / "logs" / "train.log"
    data = bytearray(log.read_bytes())
    data[100] ^= 0x20
    log.write_bytes(bytes(data))
    proc = cli("verify", d, "--key", made["pub"])
    assert proc.returncode == 1
    assert "logs/train.log changed since it was attested" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    as_json = cli("verify", d, "--key", made["pub"], "--json")
    data = json.loads(as_json.stdout)  # one object, on failure too
    assert as_json.returncode == 1 and data["verified"] is False and data["exit_code"] == 1
    assert "logs/train.log changed" in data["error"]


def test_a_figure_edited_in_result_yaml_is_named_with_both_values_and_the_gap(made, tmp_path):
    d = copy_of(made["run"], tmp_path)
    result = yaml.safe_load((d / "result.yaml").read_text())
    result["tokens_per_s_per_gpu"] = 7000.0
    (d / "result.yaml").write_text(yaml.safe_dump(result, sort_keys=False))
    proc = cli("verify", d, "--key", made["pub"])
    assert proc.returncode == 1
    assert "result.yaml changed since it was attested" in proc.stderr
    assert f"tokens_per_s_per_gpu: attested {CLAIM}, now 7000.0 (by +86.77" in proc.stderr


def test_the_verdict_edited_is_named(made, tmp_path):
    d = copy_of(made["run"], tmp_path)
    verdict = json.loads((d / "verdict.json").read_text())
    verdict["status"] = "slower"
    (d / "verdict.json").write_text(json.dumps(verdict, indent=2) + "\n")
    message = failure(d, made["pub"])
    assert "verdict.json changed since it was attested" in message
    assert "status: attested 'reproduced', now 'slower'" in message


def test_the_predicate_edited_after_signing_breaks_the_signature(made, tmp_path):
    d = copy_of(made["run"], tmp_path)
    envelope = json.loads((d / ENVELOPE_FILE).read_text())
    stmt = json.loads(base64.b64decode(envelope["payload"]))
    stmt["predicate"]["figures"]["tokens_per_s_per_gpu"] = 7500.0
    envelope["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    (d / ENVELOPE_FILE).write_text(json.dumps(envelope))
    proc = cli("verify", d, "--key", made["pub"])
    assert proc.returncode == 1
    assert "does not verify over the envelope's payload" in proc.stderr
    assert "changed after it was signed" in proc.stderr


def test_a_subject_digest_edited_in_the_statement_breaks_the_signature(made, tmp_path):
    d = copy_of(made["run"], tmp_path)
    envelope = json.loads((d / ENVELOPE_FILE).read_text())
    stmt = json.loads(base64.b64decode(envelope["payload"]))
    (d / "result.yaml").write_text("tokens_per_s_per_gpu: 9999\n")
    for s in stmt["subject"]:
        if s["name"] == "result.yaml":
            import hashlib

            s["digest"]["sha256"] = hashlib.sha256(b"tokens_per_s_per_gpu: 9999\n").hexdigest()
    envelope["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    (d / ENVELOPE_FILE).write_text(json.dumps(envelope))
    assert "does not verify" in failure(d, made["pub"])


def test_signed_by_another_key_is_named_by_both_fingerprints(made, tmp_path):
    d = copy_of(made["run"], tmp_path)
    other, other_pub = keypair(tmp_path, "other")
    assert cli("attest", d, "--key", other).returncode == 0  # re-signed by someone else
    proc = cli("verify", d, "--key", made["pub"])
    assert proc.returncode == 1
    mine = json.loads(cli("verify", made["run"], "--json").stdout)["signed_by"]
    theirs = json.loads(cli("verify", d, "--json").stdout)["signed_by"]
    assert f"signed by {theirs}, not by the key given ({mine})" in proc.stderr
    # the other key's signature under this key's name (keyid) is still refused
    envelope = json.loads((d / ENVELOPE_FILE).read_text())
    envelope["signatures"][0]["keyid"] = mine
    (d / ENVELOPE_FILE).write_text(json.dumps(envelope))
    assert "does not verify" in failure(d, made["pub"])
    # and without --key, the verdict says the key was only the one found beside it
    plain = cli("verify", copy_of(made["run"], tmp_path, "c2"))
    assert plain.returncode == 0 and "pass --key to check who signed" in plain.stdout


def test_a_subject_missing_is_named(made, tmp_path):
    d = copy_of(made["run"], tmp_path)
    (d / "logs" / "train.log").unlink()
    proc = cli("verify", d, "--key", made["pub"])
    assert proc.returncode == 1
    assert "subject logs/train.log is missing" in proc.stderr


def test_a_signer_who_signs_figures_the_log_does_not_give_is_caught_by_the_remeasure(
    made, tmp_path
):
    """The adversary holds the key: edits result.yaml and signs the edit. The signature and the
    digests hold; measuring the log again does not give that figure."""
    d = copy_of(made["run"], tmp_path)
    result = yaml.safe_load((d / "result.yaml").read_text())
    result["tokens_per_s_per_gpu"] = 7100.5
    (d / "result.yaml").write_text(yaml.safe_dump(result, sort_keys=False))
    refused = cli("attest", d, "--key", made["key"])  # attest itself will not sign it
    assert refused.returncode == 1 and "result.yaml is not what the log gives" in refused.stderr
    assert "tokens_per_s_per_gpu: file 7100.5, re-measured 6913.23" in refused.stderr
    from launcher.results.attest import evidence_files, statement, subjects_of
    from launcher.results.attest_predicate import build_predicate

    stmt = statement(subjects_of(d, evidence_files(d)), build_predicate(d))
    envelope = sign(stmt, load_signing_key(made["key"]))
    (d / ENVELOPE_FILE).write_text(json.dumps(envelope))
    message = failure(d, made["pub"])
    assert "the attested figures are not what the log gives" in message
    assert "tokens_per_s_per_gpu: attested 7100.5, re-measured 6913.23 (by -187.27" in message


def test_a_refused_attest_leaves_nothing_behind(made, tmp_path):
    d = copy_of(made["unattested"], tmp_path)
    before = sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))
    verdict = json.loads((d / "verdict.json").read_text())
    verdict["difference_percent"] = 0.5
    (d / "verdict.json").write_text(json.dumps(verdict))
    proc = cli("attest", d, "--key", made["key"])
    assert proc.returncode == 1 and "verdict.json is not what the log gives" in proc.stderr
    assert "difference_percent: file 0.5, re-measured" in proc.stderr
    assert sorted(p.relative_to(d).as_posix() for p in d.rglob("*")) == before  # no inputs/ left


def test_a_run_still_going_on_is_not_attested(made, tmp_path):
    d = copy_of(made["run"], tmp_path)
    (d / ENVELOPE_FILE).unlink()
    status = json.loads((d / "status.json").read_text())
    (d / "status.json").write_text(json.dumps({**status, "state": "detached"}))
    proc = cli("attest", d, "--key", made["key"])
    assert proc.returncode == 2 and "has not ended (state 'detached')" in proc.stderr
    assert not (d / ENVELOPE_FILE).exists()


def test_bad_input_is_exit_2_with_one_paragraph(made, tmp_path):
    checks = [
        (cli("verify", tmp_path / "nope"), "does not exist"),
        (cli("verify", made["unattested"]), "not attested"),
        (cli("attest", made["run"], "--key", tmp_path / "nokey"), "does not exist"),
        (cli("attest", tmp_path, "--key", made["key"]), "measure.json"),
        (cli("verify", made["run"], "--key", made["key"]), "not an OpenSSH public key"),
    ]
    (tmp_path / "rsa").write_text(
        "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n"
    )
    checks.append((cli("attest", made["run"], "--key", tmp_path / "rsa"), "cannot be read"))
    for proc, text in checks:
        assert proc.returncode == 2, (proc.args, proc.stderr)
        assert text in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_key_made_by_ssh_keygen_signs_and_its_fingerprint_is_openssh_own(made, tmp_path):
    import subprocess

    key = tmp_path / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret words", "-f", str(key)], check=True
    )
    d = copy_of(made["out"], tmp_path)
    no_pass = cli("attest", d, "--key", key)
    assert no_pass.returncode == 2 and "encrypted" in no_pass.stderr
    ok = cli("attest", d, "--key", key, env={"REPRODUCE_KEY_PASSPHRASE": "secret words"})
    assert ok.returncode == 0, ok.stderr
    shown = subprocess.run(
        ["ssh-keygen", "-l", "-f", f"{key}.pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert shown in ok.stdout
    assert cli("verify", d, "--key", f"{key}.pub").returncode == 0


def _mutations(stmt: dict) -> list[tuple[str, dict]]:
    """Statements a hostile signer could sign: wrong shapes where verify reads."""
    import copy

    out = []

    def case(name, edit):
        s = copy.deepcopy(stmt)
        edit(s)
        out.append((name, s))

    case("subject-not-a-list", lambda s: s.__setitem__("subject", {"a": 1}))
    case("subject-digest-a-string", lambda s: s["subject"][0].__setitem__("digest", "abc"))
    case("subject-escapes", lambda s: s["subject"][0].__setitem__("name", "../../etc/passwd"))
    case("subject-absolute", lambda s: s["subject"][0].__setitem__("name", "/etc/passwd"))
    case("no-predicate", lambda s: s.__setitem__("predicate", []))
    case("other-type", lambda s: s.__setitem__("predicateType", "https://slsa.dev/provenance/v1"))
    case(
        "policy-other", lambda s: s["predicate"].__setitem__("policy", {"name": "x", "version": 9})
    )
    case("policy-list", lambda s: s["predicate"].__setitem__("policy", [1]))
    case("inputs-list", lambda s: s["predicate"]["measurement"].__setitem__("inputs", [1, 2]))
    case("measurement-str", lambda s: s["predicate"].__setitem__("measurement", "x"))
    case(
        "log-not-subject",
        lambda s: s["predicate"]["measurement"]["inputs"]["log"].__setitem__("path", "nope.log"),
    )
    case("figures-missing", lambda s: s["predicate"].pop("figures"))
    case("verdict-str", lambda s: s["predicate"].__setitem__("verdict", "reproduced"))
    return out


def test_a_hostile_signer_s_malformed_statements_fail_cleanly_never_a_traceback(made, tmp_path):
    """Signed with the right key, so only verify's own reading stands between them and a crash."""
    from launcher.errors import ReproduceError

    d = copy_of(made["run"], tmp_path)
    key = load_signing_key(made["key"])
    stmt = statement_of(d)
    for name, bad in _mutations(stmt):
        (d / ENVELOPE_FILE).write_text(json.dumps(sign(bad, key)))
        with pytest.raises(ReproduceError) as info:
            verify_dir(d, made["pub"])
        assert info.value.exit_code in (1, 2), name
    (d / ENVELOPE_FILE).write_text(json.dumps(sign(stmt, key)))
    verify_dir(d, made["pub"])  # the same statement, well-formed, holds
