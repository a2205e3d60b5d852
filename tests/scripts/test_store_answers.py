"""Every answer a store can give, fed to every call of it (docs/assets.md, "Errors are not
absence").

The promise: only a store's "the object is not there" (store_base.S3_ABSENT; a directory's
FileNotFoundError) lets a caller go on as if nothing were stored; every other answer (access
denied, no such bucket, a throttle, a 5xx, no connection, an I/O error, a link where a file
should be) fails the call with a StoreError, and a call that must move bytes fails on absence
too. S3 is the loopback moto server through boto3, each answer put in front of it by botocore's
own before-call hook (the same place botocore's Stubber answers); the aws CLI client's reading
of its error lines is walked over the same codes. A directory store gets each OSError kind from
the file it opens.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from support.node_scripts import load_script

store_base = load_script("store_base")
asset_store = load_script("asset_store")
s3_store = load_script("s3_store")
safe_io = load_script("safe_io")
StoreError = store_base.StoreError

ASSET = {"kind": "rows", "parquet_sha256": "a" * 64}
# (the code S3 answers, its HTTP status): one of every kind
S3_ANSWERS = {
    "NoSuchKey": 404,
    "404": 404,
    "NoSuchBucket": 404,
    "AccessDenied": 403,
    "InvalidAccessKeyId": 403,
    "SlowDown": 503,
    "InternalError": 500,
    "ServiceUnavailable": 503,
    "connection": 0,  # no answer at all
}
ABSENT = {"NoSuchKey", "404"}


def test_the_table_is_the_one_the_walk_expects():
    assert store_base.S3_ABSENT >= ABSENT and store_base.S3_ABSENT <= ABSENT | {"NotFound"}
    assert all(not store_base.s3_absent(c) for c in S3_ANSWERS if c not in ABSENT)


def _inject(client: Any, code: str) -> None:
    """Every S3 call of CLIENT answered with CODE (or no connection), before it reaches moto."""
    from botocore.awsrequest import AWSResponse
    from botocore.exceptions import EndpointConnectionError

    def answer(**_: Any) -> Any:
        if code == "connection":
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
        status = S3_ANSWERS[code]
        return (
            AWSResponse("http://127.0.0.1", status, {}, None),
            {"Error": {"Code": code, "Message": "injected"}, "ResponseMetadata": {}},
        )

    client.meta.events.register_first("before-call.s3.*", answer)


def _src(tmp: Path) -> tuple[Path, dict[str, Any]]:
    src = tmp / "src"
    src.mkdir()
    (src / "rows.parquet").write_bytes(os.urandom(4096))
    return src, asset_store.make_manifest(src, ASSET)


def _calls(
    store: Any, tmp: Path, made: tuple[Path, dict[str, Any]] | None = None
) -> dict[str, Any]:
    src, manifest = made or _src(tmp)
    return {
        "read_manifest": lambda: store.read_manifest("k"),
        "stat": lambda: store.stat("k", "rows.parquet"),
        "get_file": lambda: store.get_file(
            "k", "rows.parquet", tmp / "got.partial", 4096, lambda *a: None
        ),
        "put_file": lambda: store.put_file(
            "k",
            "rows.parquet",
            src / "rows.parquet",
            manifest["files"][0]["sha256"],
            lambda *a: None,
        ),
        "put_manifest": lambda: store.put_manifest("k", manifest),
        "push": lambda: asset_store.push(store, "k", src, manifest, log=lambda _: None),
        "fetch": lambda: asset_store.fetch(store, "k", tmp / "dest", ASSET, log=lambda _: None),
    }


# A call that reads whether something is there may answer "absent" (None); the others must fail.
MAY_BE_ABSENT = {"read_manifest", "stat"}
CALL_NAMES = sorted(
    ["read_manifest", "stat", "get_file", "put_file", "put_manifest", "push", "fetch"]
)


def _expect(name: str, absent: bool, run: Any) -> None:
    if absent and name in MAY_BE_ABSENT:
        assert run() is None
        return
    with pytest.raises((StoreError, asset_store.safe_io.UnsafeFile, OSError)) as err:
        run()
    if isinstance(err.value, StoreError) and not absent:
        assert not err.value.mismatch, str(err.value)  # the store failed: exit 3, never "no"


@pytest.mark.parametrize("call", CALL_NAMES)
@pytest.mark.parametrize("code", sorted(S3_ANSWERS))
def test_every_s3_answer_to_every_call(s3, tmp_path, monkeypatch, code, call):
    monkeypatch.setenv("REPRODUCE_S3_CLIENT", "boto3")
    store = asset_store.open_store(s3)
    from botocore.config import Config

    store.client = __import__("boto3").client("s3", config=Config(retries={"max_attempts": 1}))
    calls = _calls(store, tmp_path)
    _inject(store.client, code)
    _expect(call, code in ABSENT, calls[call])


def _cli_says(code: str) -> str:
    if code == "connection":
        return "Could not connect to the endpoint URL: http://127.0.0.1:1/"
    if code == "NoSuchBucket":  # its message carries the words "does not exist"
        return f"An error occurred ({code}) when calling the GetObject operation: The specified bucket does not exist"
    return f"An error occurred ({code}) when calling the GetObject operation: injected"


@pytest.mark.parametrize("call", ["read_manifest", "stat"])
@pytest.mark.parametrize("code", sorted(S3_ANSWERS))
def test_every_answer_the_aws_cli_client_reads(tmp_path, monkeypatch, code, call):
    """The node's other S3 client reads the aws CLI's error line: a stand-in `aws` that
    answers CODE as the CLI prints it (exit 254)."""
    fake = tmp_path / "bin" / "aws"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho {_cli_says(code)!r} >&2\nexit 254\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    store = s3_store.CliS3("s3://bucket/store")
    run = {"read_manifest": lambda: store.read_manifest("k"), "stat": lambda: store.stat("k", "f")}
    _expect(call, code in ABSENT, run[call])


OS_ERRORS = {
    "ENOENT": errno.ENOENT,
    "EACCES": errno.EACCES,
    "EIO": errno.EIO,
    "ELOOP": errno.ELOOP,
    "ENOSPC": errno.ENOSPC,
}


@pytest.mark.parametrize("call", ["read_manifest", "get_file", "fetch"])
@pytest.mark.parametrize("kind", sorted(OS_ERRORS))
def test_every_directory_answer_to_every_read(tmp_path, monkeypatch, kind, call):
    root = tmp_path / "store"
    (root / "k").mkdir(parents=True)
    store = asset_store.LocalStore(str(root))
    src, manifest = _src(tmp_path)
    asset_store.push(store, "k", src, manifest, log=lambda _: None)
    calls = _calls(store, tmp_path, (src, manifest))
    real = safe_io.open_read

    def failing(path: Any, *a: Any, **kw: Any) -> Any:
        if str(path).startswith(str(root)):
            raise OSError(OS_ERRORS[kind], os.strerror(OS_ERRORS[kind]), str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(safe_io, "open_read", failing)
    monkeypatch.setattr(
        safe_io,
        "read_text",
        lambda path, **kw: failing(path) if str(path).startswith(str(root)) else None,
    )
    absent = kind == "ENOENT"
    if absent and call == "read_manifest":
        assert calls[call]() is None
        return
    with pytest.raises((StoreError, OSError)):
        calls[call]()
