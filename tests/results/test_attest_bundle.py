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


# --- what verify writes of a bundle before and after its signature is checked ---

BIG = 256 << 20  # gzip makes it about a quarter of a megabyte; the child may write 64 MiB a file


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # type: ignore[no-untyped-def]
        n = min(len(buf), self.left)
        buf[:n] = bytes(n)
        self.left -= n
        return n


def _rebundle(bundle, out, *, before=None, replace=None, after=None) -> None:
    """The real bundle's entries with a huge entry of zeros put first (`before`: its name), put
    in place of a subject (`replace`), or added at the end (`after`)."""
    with tarfile.open(bundle) as src, tarfile.open(out, "w:gz", compresslevel=1) as dst:
        members = src.getmembers()
        top = members[0].name.split("/")[0]

        def huge(name: str) -> None:
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = BIG
            dst.addfile(info, io.BufferedReader(_Zeros(BIG)))

        if before:
            huge(before)
        for m in members:
            if replace and m.name == f"{top}/{replace}":
                huge(replace)
                continue
            dst.addfile(m, src.extractfile(m))
        if after:
            huge(after)


def _verify_with_file_limit(bundle, *args):
    import resource
    import subprocess
    import sys

    from support.paths import REPO

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))

    return subprocess.run(
        [sys.executable, "-m", "launcher", "verify", str(bundle), *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=limit,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("where", "words", "code"),
    [
        ({"after": "inputs/extra.bin"}, "not a subject of its signed statement", 2),
        ({"before": "zeros.bin"}, "a bundle starts with its attestation.intoto.json", 2),
        ({"before": ENVELOPE_FILE}, "more than an attestation holds", 2),
        ({"replace": "inputs/train.log"}, "changed since it was attested", 1),
    ],
    ids=["unnamed-entry", "entry-before-the-envelope", "huge-envelope", "subject-grown"],
)
def test_verify_writes_only_what_the_signed_statement_names_at_its_size(
    attested, tmp_path, where, words, code
):
    """A bundle of a quarter of a megabyte that unpacks to 256 MiB, the child allowed 64 MiB a
    file (RLIMIT_FSIZE: writing past it kills the child with SIGXFSZ): verify refuses with its
    exit code and one paragraph, having written nothing of the huge entry."""
    _, pub, bundle = attested
    hostile = tmp_path / "hostile.tar.gz"
    _rebundle(bundle, hostile, **where)
    assert hostile.stat().st_size < 4 << 20
    for key in ([], ["--key", pub]):
        proc = _verify_with_file_limit(hostile, *key)
        assert proc.returncode == code, (proc.returncode, proc.stderr)
        assert words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_bundle_whose_statement_records_no_sizes_is_refused_before_its_files(attested, tmp_path):
    """An attestation made before sizes were recorded (re-signed here without them): the bundle
    is refused, naming the way out; the directory itself still verifies."""
    import base64
    import json

    from launcher.results.attest import sign
    from launcher.results.attest_keys import load_signing_key

    out, _, _ = attested
    key = out.parent / "key"
    old = tmp_path / out.name
    import shutil

    shutil.copytree(out, old)
    envelope = json.loads((old / ENVELOPE_FILE).read_text())
    stmt = json.loads(base64.b64decode(envelope["payload"]))
    for subject in stmt["subject"]:
        subject.pop("annotations", None)
    (old / ENVELOPE_FILE).write_text(json.dumps(sign(stmt, load_signing_key(key))))
    assert cli("verify", old).returncode == 0
    bundle = tmp_path / "old.tar.gz"
    assert cli("bundle", old, "--out", bundle).returncode == 0
    proc = cli("verify", bundle)
    assert proc.returncode == 2 and "records no size" in proc.stderr, proc.stderr
