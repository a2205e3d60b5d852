#!/usr/bin/env python3
"""S3 as an asset store: boto3 (the launcher, images with it) or the `aws` CLI (the DLAMI host).

Loaded by asset_store.open_store; imports store_base (never asset_store, which loads this file)
and never `launcher`. Objects carry their sha256 as user metadata (x-amz-meta-content-sha256),
computed from the very bytes uploaded as they were read (an upload whose bytes are not the
manifest's is aborted or removed), so a re-run skips what is already stored without reading it
back. Objects of older pushes, which recorded the sealed hash without reading it, carry only
x-amz-meta-sha256, which is not trusted: they are uploaded again.
Big files go up in parts (boto3: our own multipart loop, which continues an unfinished upload of
the same key, keeping every part whose MD5 matches the local bytes; the CLI: its own multipart).
Both honour AWS_ENDPOINT_URL (the tests' moto server).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable  # typing's: subscripted at run time (python 3.8 hosts)

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # siblings import by name, also when loaded by path

import hf_hub  # noqa: E402 (after the sys.path line above)
import safe_io  # noqa: E402
from store_base import (  # noqa: E402
    MANIFEST,
    PART_BYTES,
    Digest,
    Progress,
    Store,
    StoreError,
    fetch_ranges,
    parse_manifest,
    s3_absent,
    s3_cli_code,
)

MAX_PARTS = 10_000
POOL = 128  # connections: asset_store.fetch's 8 files x store_base.RANGES ranges, and more
SHA_META = "content-sha256"  # x-amz-meta-content-sha256: hashed from the uploaded bytes


def _mismatch(where: str, got: str, want: str) -> StoreError:
    return StoreError(
        f"upload to {where}: the bytes read have sha256 {got}, the manifest says {want} (the "
        "file changed after it was sealed); not stored",
        mismatch=True,
    )


def split_s3(url: str) -> tuple[str, str]:
    m = re.fullmatch(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(.*))?", url.rstrip("/"))
    if not m:
        raise StoreError(f"store {url!r}: expected s3://BUCKET[/PREFIX]")
    return m.group(1), (m.group(2) or "").strip("/")


class S3Store(Store):
    """An S3 prefix. Objects carry their sha256 as metadata (x-amz-meta-sha256), which lets a
    re-run skip what is already there without downloading it."""

    def __init__(self, url: str):
        self.bucket, self.prefix = split_s3(url)
        self.url = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")

    def object_key(self, key: str, path: str) -> str:
        return "/".join(p for p in (self.prefix, key, path) if p)


class Boto3S3(S3Store):
    def __init__(self, url: str, part_bytes: int = PART_BYTES):
        super().__init__(url)
        import boto3  # the store needs it only here (the launcher and images with boto3)
        from botocore.config import Config

        self.client = boto3.client(
            "s3",
            config=Config(
                retries={"max_attempts": 8, "mode": "adaptive"},
                max_pool_connections=POOL,  # botocore's default (10) would queue the ranges
            ),
        )
        self.part_bytes = part_bytes

    def _error(self, err: BaseException, what: str) -> StoreError:
        code = (getattr(err, "response", None) or {}).get("Error", {}).get("Code", "") or type(
            err
        ).__name__
        return StoreError(f"{what}: {code}: {str(err)[:300]}")

    def read_manifest(self, key: str) -> dict[str, Any] | None:
        okey = self.object_key(key, MANIFEST)
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=okey)["Body"].read()
        except Exception as err:  # noqa: BLE001 (botocore's errors are many; each becomes one line)
            if _missing(err):
                return None
            raise self._error(err, f"store {self.where(key, MANIFEST)}") from None
        return parse_manifest(body.decode("utf-8"), self.where(key, MANIFEST))

    def stat(self, key: str, path: str) -> tuple[int, str | None] | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.object_key(key, path))
        except Exception as err:  # noqa: BLE001 (as above)
            if _missing(err):
                return None
            raise self._error(err, f"store {self.where(key, path)}") from None
        return int(head["ContentLength"]), (head.get("Metadata") or {}).get(SHA_META)

    def get_file(
        self,
        key: str,
        path: str,
        dest: Path,
        size: int,
        progress: Progress,
        *,
        git_blob: bool = False,
    ) -> tuple[Digest, bool]:
        """Ranged GETs, RANGES at a time per file (store_base.fetch_ranges), each answer checked
        for the range it says it holds (Content-Range) before its bytes are hashed and kept."""
        okey = self.object_key(key, path)
        where = self.where(key, path)

        def read(offset: int, length: int) -> bytes:
            want = f"bytes {offset}-{offset + length - 1}/{size}"
            try:
                got = self.client.get_object(
                    Bucket=self.bucket, Key=okey, Range=f"bytes={offset}-{offset + length - 1}"
                )
                body = got["Body"].read()
            except Exception as err:  # noqa: BLE001 (botocore's errors are many; one line each)
                if _missing(err):
                    raise StoreError(f"download of {where}: the object is not there") from None
                raise self._error(err, f"download of {where}") from None
            said = str(got.get("ContentRange") or "")
            if said != want:
                if "/" in said and said.rsplit("/", 1)[-1] != str(size):
                    raise StoreError(
                        f"download of {where}: the object is {said.rsplit('/', 1)[-1]} bytes, "
                        f"its manifest says {size}; not fetched",
                        mismatch=True,
                    )
                raise StoreError(f"download of {where}: asked for {want}, got {said!r}")
            return body

        return fetch_ranges(read, dest, size, path, progress, git_blob=git_blob)

    def put_file(self, key: str, path: str, src: Path, sha256: str, progress: Progress) -> str:
        try:
            return upload_resuming(
                self.client,
                self.bucket,
                self.object_key(key, path),
                src,
                sha256,
                part_bytes=self.part_bytes,
                progress=lambda done, total: progress(path, done, total),
            )
        except StoreError:
            raise
        except Exception as err:  # noqa: BLE001 (as above)
            raise self._error(err, f"upload to {self.where(key, path)}") from None

    def put_manifest(self, key: str, manifest: dict[str, Any]) -> None:
        body = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=self.object_key(key, MANIFEST),
                Body=body,
                ContentMD5=base64.b64encode(hashlib.md5(body).digest()).decode(),  # noqa: S324
                ContentType="application/json",
            )
        except Exception as err:  # noqa: BLE001 (as above)
            raise self._error(err, f"upload to {self.where(key, MANIFEST)}") from None


def _missing(err: BaseException) -> bool:
    code = str((getattr(err, "response", None) or {}).get("Error", {}).get("Code", ""))
    return s3_absent(code)


def _md5_b64(data: bytes) -> tuple[str, str]:
    """(hex, base64) MD5 of a part: S3 checks Content-MD5 and returns the hex as the part's
    ETag."""
    digest = hashlib.md5(data).digest()  # noqa: S324 (S3's integrity check, not security)
    return digest.hex(), base64.b64encode(digest).decode()


def upload_resuming(
    client: Any,
    bucket: str,
    key: str,
    src: Path,
    sha256: str,
    *,
    part_bytes: int = PART_BYTES,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> str:
    """Upload SRC to s3://BUCKET/KEY (multipart when big), continuing an unfinished multipart
    upload of the same key: parts already there whose MD5 matches the local bytes are kept.
    Every byte is hashed as it is read (from one open file, never through a symlink); bytes
    that are not SHA256 abort the upload before the object exists."""
    with safe_io.open_read(src, owned=True) as f:
        return _upload_open(client, bucket, key, f, sha256, part_bytes, progress)


def _upload_open(
    client: Any,
    bucket: str,
    key: str,
    f: Any,
    sha256: str,
    part_bytes: int,
    progress: Callable[[int, int], None],
) -> str:
    size = os.fstat(f.fileno()).st_size
    meta = {SHA_META: sha256}
    where = f"s3://{bucket}/{key}"
    if size <= part_bytes:
        data = f.read(size + 1)
        got = hashlib.sha256(data).hexdigest()
        if got != sha256:
            raise _mismatch(where, got, sha256)
        client.put_object(
            Bucket=bucket, Key=key, Body=data, ContentMD5=_md5_b64(data)[1], Metadata=meta
        )
        progress(size, size)
        return "uploaded"
    part_bytes = max(part_bytes, -(-size // MAX_PARTS))
    count = -(-size // part_bytes)
    upload_id, have = _unfinished_upload(client, bucket, key, part_bytes, count, size)
    if upload_id is None:
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key, Metadata=meta)[
            "UploadId"
        ]
    etags: list[dict[str, Any]] = []
    reused = 0
    done = 0
    whole = hashlib.sha256()
    for number in range(1, count + 1):
        if hf_hub.CANCEL.is_set():
            raise hf_hub.Cancelled(key)
        data = f.read(part_bytes)
        whole.update(data)
        md5_hex, md5_b64 = _md5_b64(data)
        if have.get(number) == md5_hex:
            reused += 1
        else:
            client.upload_part(
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=data,
                ContentMD5=md5_b64,
            )
        etags.append({"PartNumber": number, "ETag": f'"{md5_hex}"'})
        done += len(data)
        progress(done, size)
    if f.read(1) or whole.hexdigest() != sha256:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        raise _mismatch(where, whole.hexdigest(), sha256)
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": etags}
    )
    return f"resumed ({reused} of {count} parts were already there)" if reused else "uploaded"


def _unfinished_upload(
    client: Any, bucket: str, key: str, part_bytes: int, count: int, size: int
) -> tuple[str | None, dict[int, str]]:
    """The newest unfinished multipart upload of KEY with our part size, and its parts' MD5s."""
    uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=key).get("Uploads") or []
    uploads = sorted((u for u in uploads if u["Key"] == key), key=lambda u: u["Initiated"])
    if not uploads:
        return None, {}
    upload_id = uploads[-1]["UploadId"]
    parts: dict[int, str] = {}
    marker = 0
    while True:
        page = client.list_parts(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumberMarker=marker
        )
        for p in page.get("Parts") or []:
            n = int(p["PartNumber"])
            want = part_bytes if n < count else size - part_bytes * (count - 1)
            if n > count or int(p["Size"]) != want:
                client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
                return None, {}
            parts[n] = str(p["ETag"]).strip('"')
        if not page.get("IsTruncated"):
            return upload_id, parts
        marker = int(page["NextPartNumberMarker"])


class CliS3(S3Store):
    """S3 through the `aws` CLI (the DLAMI host has it; its python may not have boto3)."""

    def __init__(self, url: str):
        super().__init__(url)
        self.aws = shutil.which("aws")
        if not self.aws:
            raise StoreError(f"store {url}: neither boto3 nor the aws CLI is installed here")

    def _run(self, args: list[str], what: str, *, stdin: bytes | None = None) -> bytes | None:
        """stdout, or None when the object does not exist; StoreError for anything else."""
        proc = subprocess.run(
            [str(self.aws), *args], input=stdin, capture_output=True, timeout=24 * 3600
        )
        if proc.returncode == 0:
            return proc.stdout
        err = proc.stderr.decode("utf-8", "replace").strip()
        if s3_absent(s3_cli_code(err)):
            return None
        raise StoreError(f"{what}: aws {args[0]} {args[1]} failed: {err.splitlines()[-1:]}")

    def read_manifest(self, key: str) -> dict[str, Any] | None:
        okey = self.object_key(key, MANIFEST)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "m.json"
            got = self._run(
                ["s3api", "get-object", "--bucket", self.bucket, "--key", okey, str(out)],
                f"store {self.where(key, MANIFEST)}",
            )
            if got is None:
                return None
            return parse_manifest(out.read_text(encoding="utf-8"), self.where(key, MANIFEST))

    def stat(self, key: str, path: str) -> tuple[int, str | None] | None:
        out = self._run(
            ["s3api", "head-object", "--bucket", self.bucket, "--key", self.object_key(key, path)],
            f"store {self.where(key, path)}",
        )
        if out is None:
            return None
        head = json.loads(out)
        return int(head["ContentLength"]), (head.get("Metadata") or {}).get(SHA_META)

    def get_file(
        self,
        key: str,
        path: str,
        dest: Path,
        size: int,
        progress: Progress,
        *,
        git_blob: bool = False,
    ) -> tuple[Digest, bool]:
        """`aws s3 cp URL -`: the CLI's own parallel ranged GETs, written to our pipe in order,
        which we hash and append as they arrive (no second pass). The CLI cannot start at an
        offset on stdout, so a partial file starts over."""
        url = f"s3://{self.bucket}/{self.object_key(key, path)}"
        fout, have = safe_io.open_resume(dest)
        with fout, tempfile.TemporaryFile() as err:
            fout.truncate(0)
            args = [str(self.aws), "s3", "cp", "--only-show-errors", url, "-"]
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err)
            h = Digest(size, git_blob)
            done = 0
            out = proc.stdout
            assert out is not None
            read_all = False
            try:
                for chunk in iter(lambda: out.read(1 << 20), b""):
                    if hf_hub.CANCEL.is_set():
                        raise hf_hub.Cancelled(path)
                    done += len(chunk)
                    if done > size:  # more than the manifest's: stop, keep none of it
                        break
                    h.update(chunk)
                    fout.write(chunk)
                    progress(path, done, size)
                else:
                    read_all = True
            finally:
                if not read_all and proc.poll() is None:  # nobody reads its pipe any more
                    proc.kill()
                rc = proc.wait(timeout=24 * 3600)
            fout.flush()
            os.fsync(fout.fileno())
            if done > size:
                raise StoreError(
                    f"download of {url}: more than the {size} bytes its manifest says",
                    mismatch=True,
                )
            if rc != 0:
                err.seek(0)
                text = err.read().decode("utf-8", "replace").strip()
                if s3_absent(s3_cli_code(text)):
                    raise StoreError(f"download of {url}: the object is not there")
                raise StoreError(f"download of {url}: aws s3 cp failed: {text.splitlines()[-1:]}")
        if done != size:
            raise StoreError(
                f"download of {url}: {done} bytes came, its manifest says {size}", mismatch=True
            )
        return h, False

    def put_file(self, key: str, path: str, src: Path, sha256: str, progress: Progress) -> str:
        """The CLI reads our stdin, which we feed from one open file, hashing as we read; an
        object whose bytes turn out not to be SHA256 is removed again before anything names it."""
        url = f"s3://{self.bucket}/{self.object_key(key, path)}"
        with safe_io.open_read(src, owned=True) as f, tempfile.TemporaryFile() as err:
            size = os.fstat(f.fileno()).st_size
            args = [str(self.aws), "s3", "cp", "--only-show-errors", "--metadata",
                    f"{SHA_META}={sha256}", "--expected-size", str(size), "-", url]  # fmt: skip
            proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=err, stderr=err)
            h = hashlib.sha256()
            done = 0
            try:
                assert proc.stdin is not None
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    if hf_hub.CANCEL.is_set():
                        proc.kill()
                        raise hf_hub.Cancelled(path)
                    h.update(chunk)
                    proc.stdin.write(chunk)
                    done += len(chunk)
                    progress(path, done, size)
                proc.stdin.close()
            except BrokenPipeError:
                pass
            rc = proc.wait(timeout=24 * 3600)
            if rc != 0:
                err.seek(0)
                last = err.read().decode("utf-8", "replace").strip().splitlines()[-1:]
                raise StoreError(f"upload to {url}: aws s3 cp failed: {last}")
        if h.hexdigest() != sha256:
            self._run(["s3", "rm", "--only-show-errors", url], f"removal of {url}")
            raise _mismatch(url, h.hexdigest(), sha256)
        return "uploaded"

    def put_manifest(self, key: str, manifest: dict[str, Any]) -> None:
        url = f"s3://{self.bucket}/{self.object_key(key, MANIFEST)}"
        body = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
        if (
            self._run(["s3", "cp", "--only-show-errors", "-", url], f"upload to {url}", stdin=body)
            is None
        ):
            raise StoreError(f"upload to {url} failed")
