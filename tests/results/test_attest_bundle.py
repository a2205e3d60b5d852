"""`reproduce bundle` writes one .tar.gz that `verify` takes as it is; a hostile tar is refused
before anything of it is written (absolute names, `..`, links, devices), and an attested directory
holding a link is refused too."""

from __future__ import annotations

import io
import os
import tarfile

import pytest
from support.attest import cli, keypair, measured_out

from launcher.results.attest import ENVELOPE_FILE


@pytest.fixture(scope="module")
def attested(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundle")
    key, pub = keypair(root)
    out = measured_out(root)
    assert cli("attest", out, "--key", key).returncode == 0
    bundle = root / "out.tar.gz"
    proc = cli("bundle", out, "--out", bundle)
    assert proc.returncode == 0, proc.stderr
    return out, pub, bundle


def test_the_bundle_holds_the_attestation_and_each_subject_once(attested):
    out, _, bundle = attested
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        assert all(m.isfile() for m in tar.getmembers())
    top = out.name
    assert f"{top}/{ENVELOPE_FILE}" in names and f"{top}/inputs/train.log" in names
    assert len(names) == len(set(names)) and f"{top}/report.html" not in names


def test_verify_takes_the_bundle_of_a_measure_out_directory_as_it_is(attested):
    _, pub, bundle = attested
    proc = cli("verify", bundle, "--key", pub)
    assert proc.returncode == 0, proc.stderr
    assert "verified" in proc.stdout and "verdict reproduced" in proc.stdout


def test_a_bundle_is_never_overwritten_and_an_unattested_run_is_not_bundled(attested, tmp_path):
    out, _, bundle = attested
    again = cli("bundle", out, "--out", bundle)
    assert again.returncode == 2 and "never overwritten" in again.stderr
    bare = measured_out(tmp_path)
    refused = cli("bundle", bare, "--out", tmp_path / "b.tar.gz")
    assert refused.returncode == 2 and "not attested" in refused.stderr
    assert not (tmp_path / "b.tar.gz").exists()


def _hostile(path, member: tarfile.TarInfo, data: bytes = b"evil\n") -> None:
    with tarfile.open(path, "w:gz") as tar:
        env = tarfile.TarInfo("run/attestation.intoto.json")
        env.size = 2
        tar.addfile(env, io.BytesIO(b"{}"))
        member.size = len(data) if member.isfile() else 0
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)


def _sym(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


@pytest.mark.parametrize(
    "member",
    [
        tarfile.TarInfo("run/../../escaped.txt"),
        tarfile.TarInfo("/tmp/reproduce-absolute-escape.txt"),
        _sym("run/link", "/etc/passwd"),
        _sym("run/hard", "/etc/passwd", tarfile.LNKTYPE),
        _sym("run/dev", "", tarfile.CHRTYPE),
        _sym("run/fifo", "", tarfile.FIFOTYPE),
    ],
    ids=["dotdot", "absolute", "symlink", "hardlink", "device", "fifo"],
)
def test_a_hostile_bundle_is_refused_and_writes_nothing_outside(tmp_path, member):
    bundle = tmp_path / "hostile.tar.gz"
    _hostile(bundle, member)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = cli("verify", bundle)
    assert proc.returncode == 2, proc.stderr
    assert "refused" in proc.stderr.lower() and "Traceback" not in proc.stderr
    assert not (tmp_path.parent / "escaped.txt").exists()
    assert not os.path.exists("/tmp/reproduce-absolute-escape.txt")


def test_a_file_that_is_not_a_bundle_is_bad_input(tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"\x1f\x8b not really gzip")
    proc = cli("verify", junk)
    assert proc.returncode == 2 and "neither a directory nor a bundle" in proc.stderr


def test_an_attested_directory_with_a_link_in_it_is_refused(tmp_path):
    out = measured_out(tmp_path)
    (out / "sneaky").symlink_to("/etc/hostname")
    key, _ = keypair(tmp_path)
    proc = cli("attest", out, "--key", key)
    assert proc.returncode == 2 and "sneaky is a link or not a regular file" in proc.stderr
    assert not (out / ENVELOPE_FILE).exists()
