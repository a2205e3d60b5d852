"""The ranged, hashed-as-it-arrives fetch (scripts/store_base.py fetch_ranges) against stores that
misbehave: S3 through a damaging proxy in front of the loopback moto server (short, shifted,
lying and flipped ranges, a connection dropped mid-range), a directory store whose file is
shorter or differs, partial files left by an interrupted fetch, and a generated adversary that
mixes every fault at random. Whatever happens, the promise holds: a file takes its name only
when the sha256 of all its bytes is the manifest's; otherwise nothing but a `.partial` (a prefix
of what arrived, never trusted: hashed again when continued) is left.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest
from support.node_scripts import load_script
from support.s3_faults import Fault, FaultyS3

store_mod = load_script("asset_store")
base_mod = load_script("store_base")
ASSET = {"kind": "hf-snapshot", "repo": "o/m", "repo_type": "model", "revision": "2" * 40}
ASSET["include"] = None
RANGE = 64 << 10
BIG = os.urandom(RANGE * 10 + 123)  # 11 ranges, the last one short
FILES = {"config.json": b'{"a": 1}', "w/model.bin": BIG}


def quiet(_: str) -> None:
    pass


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch):
    monkeypatch.setattr(base_mod, "RANGE_BYTES", RANGE)
    monkeypatch.setattr(base_mod, "RANGES", 4)


def pushed(store_url: str, tmp_path: Path) -> tuple[object, Path]:
    src = tmp_path / "src"
    for name, data in FILES.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    store = store_mod.open_store(store_url)
    store_mod.push(store, "k", src, store_mod.make_manifest(src, ASSET), log=quiet)
    return store, tmp_path / "cache"


def adopted(dest: Path) -> dict[str, bytes]:
    """What took a name in the cache (partial files are not names anyone uses)."""
    return {
        p.relative_to(dest).as_posix(): p.read_bytes()
        for p in dest.rglob("*")
        if p.is_file() and not p.name.endswith(".partial")
    }


# ---- S3 through a proxy that damages its answers -------------------------------------------


@pytest.fixture
def faulty(s3, moto_s3_server, monkeypatch, tmp_path):
    """The asset pushed through moto; then the store opened through the damaging proxy."""
    monkeypatch.setenv("REPRODUCE_S3_CLIENT", "boto3")
    pushed(s3, tmp_path)
    proxy = FaultyS3(moto_s3_server).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    yield proxy, store_mod.open_store(s3), tmp_path / "cache"
    proxy.stop()


@pytest.mark.parametrize("kind", ["short", "shifted", "drop"])
def test_a_range_answered_badly_once_is_asked_again(faulty, kind):
    proxy, store, dest = faulty
    proxy.faults = [Fault(kind, "model.bin", times=1, offset=RANGE * 3)]
    got = store_mod.fetch(store, "k", dest, ASSET, log=quiet)
    assert got["fetched"] == 2 and proxy.applied == [f"{kind}@{RANGE * 3}"]
    assert adopted(dest) == {**FILES, store_mod.MANIFEST: adopted(dest)[store_mod.MANIFEST]}
    assert proxy.ranges.count(f"bytes={RANGE * 3}-{RANGE * 4 - 1}") == 2


@pytest.mark.parametrize("kind", ["short", "shifted", "drop"])
def test_a_range_that_never_comes_right_fails_and_adopts_nothing(faulty, kind):
    proxy, store, dest = faulty
    proxy.faults = [Fault(kind, "model.bin", times=-1, offset=RANGE * 5)]
    with pytest.raises(store_mod.StoreError, match=r"4 attempts failed") as err:
        store_mod.fetch(store, "k", dest, ASSET, log=quiet)
    assert not err.value.mismatch  # the store's fault (exit 3), not another asset
    assert "w/model.bin" not in adopted(dest) and store_mod.MANIFEST not in adopted(dest)
    partial = dest / "w/model.bin.partial"
    assert partial.read_bytes() == BIG[: RANGE * 5]  # in order: a prefix, kept for a resume


@pytest.mark.parametrize("kind", ["flip", "lying"])
def test_bytes_that_differ_in_one_range_are_refused_and_removed(faulty, kind):
    proxy, store, dest = faulty
    proxy.faults = [Fault(kind, "model.bin", times=-1, offset=RANGE * 2)]
    with pytest.raises(store_mod.StoreError, match="its manifest says") as err:
        store_mod.fetch(store, "k", dest, ASSET, log=quiet)
    assert err.value.mismatch
    assert not (dest / "w/model.bin").exists() and not (dest / "w/model.bin.partial").exists()
    assert store_mod.MANIFEST not in adopted(dest)


def test_a_fetch_cut_off_mid_file_resumes_from_its_prefix(faulty):
    proxy, store, dest = faulty
    proxy.faults = [Fault("drop", "model.bin", times=-1, offset=RANGE * 7)]
    with pytest.raises(store_mod.StoreError):
        store_mod.fetch(store, "k", dest, ASSET, log=quiet)
    proxy.faults, proxy.ranges = [], []
    assert store_mod.fetch(store, "k", dest, ASSET, log=quiet)["fetched"] == 1
    assert adopted(dest)["w/model.bin"] == BIG
    assert min(int(r.split("=")[1].split("-")[0]) for r in proxy.ranges) == RANGE * 7


def test_a_resumed_prefix_with_other_bytes_is_fetched_again_from_the_start(faulty):
    proxy, store, dest = faulty
    partial = dest / "w/model.bin.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"\x00" * (RANGE * 4))  # a prefix that is not the object's
    seen: list[str] = []
    store_mod.fetch(store, "k", dest, ASSET, log=seen.append)
    assert adopted(dest)["w/model.bin"] == BIG and not partial.exists()
    assert any("fetching it again" in line for line in seen)
    assert f"bytes=0-{RANGE - 1}" in proxy.ranges


def test_an_object_of_another_size_is_refused_before_its_bytes_are_kept(faulty, s3):
    import boto3

    _proxy, store, dest = faulty
    bucket, prefix = s3[5:].split("/", 1)
    boto3.client("s3").put_object(Bucket=bucket, Key=f"{prefix}/k/w/model.bin", Body=BIG + b"x")
    with pytest.raises(store_mod.StoreError, match="manifest says") as err:
        store_mod.fetch(store, "k", dest, ASSET, log=quiet)
    assert err.value.mismatch and "w/model.bin" not in adopted(dest)


def test_the_aws_cli_client_streams_hashes_and_refuses_an_object_of_another_size(
    s3, monkeypatch, tmp_path
):
    """The node's host client (`aws s3 cp URL -`): the bytes hashed from the pipe as they come;
    an object longer than the manifest says is cut off and refused, nothing adopted."""
    import boto3
    from support.assets import aws_cli

    monkeypatch.setenv("PATH", f"{Path(aws_cli()).parent}:{os.environ['PATH']}")
    monkeypatch.setenv("REPRODUCE_S3_CLIENT", "aws-cli")
    store, dest = pushed(s3, tmp_path)
    assert type(store).__name__ == "CliS3"
    store_mod.fetch(store, "k", dest, ASSET, log=quiet)
    assert adopted(dest)["w/model.bin"] == BIG
    bucket, prefix = s3[5:].split("/", 1)
    boto3.client("s3").put_object(Bucket=bucket, Key=f"{prefix}/k/w/model.bin", Body=BIG + b"x")
    again = tmp_path / "again"
    with pytest.raises(store_mod.StoreError, match="manifest says") as err:
        store_mod.fetch(store, "k", again, ASSET, log=quiet)
    assert err.value.mismatch and "w/model.bin" not in adopted(again)


# ---- the directory store ---------------------------------------------------------------------


def test_directory_store_file_shorter_or_other_bytes_is_refused(tmp_path):
    store, dest = pushed(str(tmp_path / "store"), tmp_path)
    stored = tmp_path / "store/k/w/model.bin"
    stored.write_bytes(BIG[:-1])
    with pytest.raises(store_mod.StoreError, match="manifest says") as err:
        store_mod.fetch(store, "k", dest, ASSET, log=quiet)
    assert err.value.mismatch and "w/model.bin" not in adopted(dest)
    stored.write_bytes(BIG[:5000] + bytes([BIG[5000] ^ 1]) + BIG[5001:])
    with pytest.raises(store_mod.StoreError, match="sha256") as err:
        store_mod.fetch(store, "k", dest, ASSET, log=quiet)
    assert err.value.mismatch and "w/model.bin" not in adopted(dest)
    assert not (dest / "w/model.bin.partial").exists()


def test_directory_store_resumes_a_partial_prefix(tmp_path):
    store, dest = pushed(str(tmp_path / "store"), tmp_path)
    partial = dest / "w/model.bin.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(BIG[: RANGE * 6 + 17])
    first: list[int] = []

    def progress(name: str, done: int, total: int) -> None:
        if name == "w/model.bin" and not first:
            first.append(done)

    store_mod.fetch(store, "k", dest, ASSET, log=quiet, progress=progress)
    assert adopted(dest)["w/model.bin"] == BIG
    assert first[0] > RANGE * 6  # continued, not started over


def test_a_partial_that_is_a_link_is_never_written_through(tmp_path):
    store, dest = pushed(str(tmp_path / "store"), tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (dest / "w").mkdir(parents=True)
    (dest / "w/model.bin.partial").symlink_to(victim)
    store_mod.fetch(store, "k", dest, ASSET, log=quiet)
    assert victim.read_bytes() == b"keep" and adopted(dest)["w/model.bin"] == BIG


# ---- a generated adversary: every fault, at random, against the promise ------------------------


class Hostile(store_mod.Store):
    """A store whose every range may come back short, long, shifted, flipped or not at all."""

    url = "hostile://"

    def __init__(self, data: dict[str, bytes], rng: random.Random, rate: float):
        self.data, self.rng, self.rate = data, rng, rate
        self.manifest = {
            "format": store_mod.FORMAT,
            "asset": ASSET,
            "files": [
                {"path": p, "bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                for p, b in sorted(data.items())
            ],
        }

    def read_manifest(self, key):
        return self.manifest

    def get_file(self, key, path, dest, size, progress, git_blob=False):
        data = self.data[path]

        def read(offset: int, length: int) -> bytes:
            good = data[offset : offset + length]
            if self.rng.random() >= self.rate:
                return good
            fault = self.rng.choice(["short", "long", "shift", "flip", "raise", "empty"])
            if fault == "short":
                return good[: self.rng.randrange(len(good))]
            if fault == "long":
                return good + b"x"
            if fault == "shift":
                return data[offset + 1 : offset + 1 + length].ljust(length, b"y")
            if fault == "flip":
                i = self.rng.randrange(len(good))
                return good[:i] + bytes([good[i] ^ 0x80]) + good[i + 1 :]
            if fault == "raise":
                raise ConnectionResetError("reset by peer")
            return b""

        return base_mod.fetch_ranges(read, dest, size, path, progress, ranges=3, git_blob=git_blob)


@pytest.mark.parametrize("seed", range(12))
def test_generated_faults_never_leave_an_unverified_file(tmp_path, seed):
    rng = random.Random(seed)
    files = {
        f"f{i}.bin": os.urandom(rng.choice([0, 1, RANGE - 1, RANGE, RANGE * 3 + 5]))
        for i in range(4)
    }
    dest = tmp_path / "cache"
    for attempt in range(6):  # a node retrying: partial files left by earlier attempts
        store = Hostile(files, rng, rate=rng.choice([0.0, 0.05, 0.2, 0.5]))
        try:
            store_mod.fetch(store, "k", dest, ASSET, threads=2, log=quiet)
        except (store_mod.StoreError, OSError):
            pass
        else:
            assert (dest / store_mod.MANIFEST).exists()
        for p in dest.rglob("*"):
            if p.name.endswith(".partial"):
                full = files[p.name[: -len(".partial")]]
                assert len(p.read_bytes()) <= len(full)
            elif p.is_file() and p.name != store_mod.MANIFEST:
                assert p.read_bytes() == files[p.name], (seed, attempt, p.name)
