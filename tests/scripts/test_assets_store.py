"""scripts/asset_store.py and s3_store.py: manifests, a directory store, S3 on a loopback moto.

The same push/fetch run against a local directory and S3 through boto3 (the aws CLI client runs
the node's whole path in test_assets_node.py). A re-run skips what is there; a file whose bytes
differ from the manifest is refused; an unfinished multipart upload continues where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from support.node_scripts import load_script

store_mod = load_script("asset_store")
s3_mod = load_script("s3_store")
ASSET = {
    "kind": "hf-snapshot",
    "repo": "o/m",
    "repo_type": "model",
    "revision": "1" * 40,
    "include": None,
}


def tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


FILES = {"config.json": b"{}", "sub/shard.bin": os.urandom(200_000), "empty.txt": b""}


@pytest.fixture(params=["dir", "boto3"])
def store_url(request, tmp_path, monkeypatch):
    """The aws CLI client runs the whole node path in test_assets_node (it is slow to start)."""
    if request.param == "dir":
        return str(tmp_path / "store")
    monkeypatch.setenv("REPRODUCE_S3_CLIENT", request.param)
    return request.getfixturevalue("s3")


def quiet(_: str) -> None:
    pass


def test_manifest_records_every_file_with_its_sha256(tmp_path):
    src = tree(tmp_path / "src", FILES)
    (src / "x.partial").write_bytes(b"half")  # an unfinished download is never listed
    m = store_mod.make_manifest(src, ASSET)
    assert [e["path"] for e in m["files"]] == ["config.json", "empty.txt", "sub/shard.bin"]
    assert m["files"][2]["sha256"] == hashlib.sha256(FILES["sub/shard.bin"]).hexdigest()
    assert m["total_bytes"] == 200_002 and m["asset"] == ASSET
    assert store_mod.verify_tree(src, m) == []
    (src / "config.json").write_bytes(b"[]")  # same size, other bytes: only the hash sees it
    assert store_mod.verify_tree(src, m, full=False) == []
    assert "config.json: sha256" in store_mod.verify_tree(src, m)[0]


@pytest.mark.parametrize("bad", ["../etc/passwd", "/etc/passwd", "a/../../b", ""])
def test_a_manifest_path_leaving_its_directory_is_refused(bad):
    text = json.dumps(
        {"format": store_mod.FORMAT, "files": [{"path": bad, "bytes": 1, "sha256": "0" * 64}]}
    )
    with pytest.raises(store_mod.StoreError, match="leaves its directory"):
        store_mod.parse_manifest(text, "m")


def test_push_then_fetch_round_trip_and_a_rerun_moves_nothing(store_url, tmp_path):
    store = store_mod.open_store(store_url)
    src = tree(tmp_path / "src", FILES)
    manifest = store_mod.make_manifest(src, ASSET)
    first = store_mod.push(store, "k/one", src, manifest, log=quiet)
    assert first["uploaded"] == 3
    assert store_mod.push(store, "k/one", src, manifest, log=quiet)["uploaded"] == 0
    dest = tmp_path / "cache"
    got = store_mod.fetch(store, "k/one", dest, ASSET, log=quiet)
    assert got["fetched"] == 3
    assert (dest / "sub/shard.bin").read_bytes() == FILES["sub/shard.bin"]
    cached = store_mod.read_local_manifest(dest)
    assert cached["files"] == manifest["files"] and cached["origin"].endswith("k/one")
    assert store_mod.fetch(store, "k/one", dest, ASSET, log=quiet)["fetched"] == 0  # resumes/keeps


def test_a_store_without_the_object_or_holding_another_asset(store_url, tmp_path):
    store = store_mod.open_store(store_url)
    if store_url.startswith("/"):
        Path(store_url).mkdir()
    assert store.read_manifest("nothing/here") is None
    with pytest.raises(store_mod.StoreError, match="no manifest"):
        store_mod.fetch(store, "nothing/here", tmp_path / "d", ASSET, log=quiet)
    src = tree(tmp_path / "src", {"a": b"1"})
    store_mod.push(store, "k", src, store_mod.make_manifest(src, ASSET), log=quiet)
    other = dict(ASSET, revision="2" * 40)
    with pytest.raises(store_mod.StoreError, match="holds") as err:
        store_mod.fetch(store, "k", tmp_path / "d", other, log=quiet)
    assert err.value.mismatch
    with pytest.raises(store_mod.StoreError, match="refusing to overwrite"):
        store_mod.push(store, "k", src, store_mod.make_manifest(src, other), log=quiet)


def test_stored_bytes_that_differ_from_the_manifest_are_refused(tmp_path):
    store = store_mod.open_store(str(tmp_path / "store"))
    src = tree(tmp_path / "src", {"w.bin": b"good bytes"})
    store_mod.push(store, "k", src, store_mod.make_manifest(src, ASSET), log=quiet)
    (tmp_path / "store/k/w.bin").write_bytes(b"evil bytes")  # same size
    with pytest.raises(store_mod.StoreError, match="sha256 .*its manifest says") as err:
        store_mod.fetch(store, "k", tmp_path / "cache", ASSET, log=quiet)
    assert err.value.mismatch and not (tmp_path / "cache/w.bin").exists()
    assert store_mod.read_local_manifest(tmp_path / "cache") is None


def test_tampered_s3_object_is_refused(s3, tmp_path):
    import boto3

    store = store_mod.open_store(s3)
    src = tree(tmp_path / "src", {"w.bin": b"good bytes"})
    store_mod.push(store, "k", src, store_mod.make_manifest(src, ASSET), log=quiet)
    bucket, prefix = s3_mod.split_s3(s3)
    boto3.client("s3").put_object(Bucket=bucket, Key=f"{prefix}/k/w.bin", Body=b"evil bytes")
    with pytest.raises(store_mod.StoreError, match="its manifest says"):
        store_mod.fetch(store, "k", tmp_path / "cache", ASSET, log=quiet)


class Interrupting:
    """A boto3 client that fails after N parts, as a dropped connection or Ctrl-C would."""

    def __init__(self, client, fail_after: int | None = None):
        self.client, self.fail_after, self.parts = client, fail_after, []

    def upload_part(self, **kw):
        if self.fail_after is not None and len(self.parts) >= self.fail_after:
            raise ConnectionError("connection reset")
        self.parts.append(kw["PartNumber"])
        return self.client.upload_part(**kw)

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_an_interrupted_multipart_upload_continues_with_the_parts_already_there(s3, tmp_path):
    import boto3

    client = boto3.client("s3")
    bucket, prefix = s3_mod.split_s3(s3)
    key = f"{prefix}/big.bin"
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(12 << 20))  # 3 parts of 5 MiB (the last one 2 MiB)
    sha = store_mod.file_sha256(big)
    first = Interrupting(client, fail_after=2)
    with pytest.raises(ConnectionError):
        s3_mod.upload_resuming(first, bucket, key, big, sha, part_bytes=5 << 20)
    assert first.parts == [1, 2]
    again = Interrupting(client)
    how = s3_mod.upload_resuming(again, bucket, key, big, sha, part_bytes=5 << 20)
    assert again.parts == [3] and how == "resumed (2 of 3 parts were already there)"
    body = client.get_object(Bucket=bucket, Key=key)
    assert hashlib.sha256(body["Body"].read()).hexdigest() == sha
    assert body["Metadata"] == {"content-sha256": sha}  # hashed from the bytes sent
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")


def test_parts_of_other_bytes_are_uploaded_again(s3, tmp_path):
    import boto3

    client = boto3.client("s3")
    bucket, prefix = s3_mod.split_s3(s3)
    key = f"{prefix}/big.bin"
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(11 << 20))
    with pytest.raises(ConnectionError):
        s3_mod.upload_resuming(
            Interrupting(client, 2), bucket, key, big, "x" * 64, part_bytes=5 << 20
        )
    big.write_bytes(os.urandom(11 << 20))  # the file changed between the two runs
    again = Interrupting(client)
    sha = store_mod.file_sha256(big)
    assert s3_mod.upload_resuming(again, bucket, key, big, sha, part_bytes=5 << 20) == "uploaded"
    assert again.parts == [1, 2, 3]
    data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    assert hashlib.sha256(data).hexdigest() == sha


def test_an_interrupted_directory_copy_continues(tmp_path):
    store = store_mod.LocalStore(str(tmp_path / "store"))
    src = tree(tmp_path / "src", {"w.bin": os.urandom(3 << 20)})
    partial = tmp_path / "store/k/w.bin.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes((src / "w.bin").read_bytes()[: 1 << 20])
    manifest = store_mod.make_manifest(src, ASSET)
    seen = []
    store_mod.push(store, "k", src, manifest, log=seen.append)
    assert any("w.bin: resumed" in line for line in seen)
    assert (tmp_path / "store/k/w.bin").read_bytes() == (src / "w.bin").read_bytes()


def test_store_urls(monkeypatch):
    with pytest.raises(store_mod.StoreError, match="expected s3://BUCKET"):
        store_mod.open_store("s3://A_bad_bucket/x")
    with pytest.raises(store_mod.StoreError, match="expected s3://BUCKET/PREFIX or a directory"):
        store_mod.open_store("gs://bucket/x")
    monkeypatch.setenv("REPRODUCE_S3_CLIENT", "curl")
    with pytest.raises(store_mod.StoreError, match="expected boto3 or aws-cli"):
        store_mod.open_store("s3://bucket/x")
