#!/usr/bin/env python3
"""What every asset store shares: the manifest's name and format, its parser, the Store interface,
StoreError, and the one way bytes come out of a store (`fetch_ranges`). A module of its own so that
asset_store.py (manifests, the directory store, fetch and push) and s3_store.py (S3) both import
it and neither imports the other at load time.

Why ranged and parallel: one S3 connection carries about 100 MB/s, and a GPU node can take 100
Gb/s from S3 (AWS's performance guidelines: parallel byte-range GETs of 8-16 MB). So a file comes
in ranges fetched by several threads at once, and the bytes are hashed as they arrive, in order,
not read back in a second pass: the partial file on disk is always a prefix of the object (written
in order), so an interrupted fetch resumes from its length, and nothing takes the file's name
until the sha256 of all its bytes is the manifest's (docs/architecture.md, "The trust boundary").
A file that a check (`Pins`, hub_pins.py) pins by its git blob id gets that hash in the same pass
(`Digest`).

Standard library only; python 3.8 (the node's host python3); never imports `launcher`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import (
    Any,
    Callable,
    ContextManager,
    Protocol,
)  # typing's: subscripted at run time (python 3.8)

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # siblings import by name, also when loaded by path

import hf_hub  # noqa: E402 (after the sys.path line above; its CANCEL stops every transfer)
import safe_io  # noqa: E402

MANIFEST = ".reproduce-manifest.json"
FORMAT = "reproduce-asset-manifest/1"
PART_BYTES = 64 << 20  # multipart part size (S3 allows 5 MiB .. 5 GiB, at most 10,000 parts)

RANGE_BYTES = 8 << 20  # one ranged request (AWS: 8-16 MB per byte-range GET)
RANGES = int(os.environ.get("REPRODUCE_STORE_RANGES", "") or 8)  # in flight per file
RETRIES = 4  # attempts per range: a dropped connection or a short answer is asked again

Progress = Callable[[str, int, int], None]  # (file path, bytes done, bytes total)
ReadRange = Callable[[int, int], bytes]  # (offset, length) -> the store's bytes there


class StoreError(Exception):
    """The store cannot be read or written (exit 3), or holds something else (exit 1 via
    `mismatch`)."""

    def __init__(self, message: str, *, mismatch: bool = False):
        super().__init__(message)
        self.mismatch = mismatch


# How a store's answers are read, for every caller (docs/assets.md, "Errors are not absence").
# Only these S3 error codes mean "this object is not there"; NoSuchBucket, AccessDenied, a
# throttle, a 5xx, no connection, anything else is the store failing (StoreError, exit 3), and
# bytes that differ from a manifest are a mismatch (exit 1). A directory store's one "absent" is
# FileNotFoundError under a root that exists. A HEAD carries no error body, so S3 says only "404"
# there (a missing bucket too): `stat` may read it as absent, which only ever leads to an
# upload, and the upload then fails on a missing bucket.
S3_ABSENT = frozenset({"404", "NoSuchKey", "NotFound"})
_CLI_CODE = re.compile(r"An error occurred \(([A-Za-z0-9.]+)\)")


def s3_absent(code: str) -> bool:
    """Whether an S3 error CODE means the object is not there (S3_ABSENT), and nothing else."""
    return code in S3_ABSENT


def s3_cli_code(stderr: str) -> str:
    """The S3 error code in the aws CLI's message ("An error occurred (NoSuchKey) when ..."),
    '' when it names none (a connection error, a crash: never read as absent)."""
    found = _CLI_CODE.findall(stderr)
    return found[-1] if found else ""


class Digest:
    """One file's hashes, fed once with its bytes in order as they arrive: the sha256 (what a
    manifest records) always, and the git blob id (sha1 of "blob <size>\\0" + bytes, what the Hub
    lists for a file kept in git rather than LFS) when asked. Why both from one feed: a file is
    read once, as it comes; a second pass over a checkpoint costs minutes and would hash bytes
    that could have changed since. SIZE is the size the file must end with (the header of the
    blob id names it first); a file of another size is refused before its hashes mean anything."""

    def __init__(self, size: int, git_blob: bool = False):
        self._sha = hashlib.sha256()
        # git names a blob by this sha1; matching the Hub's id is a second preimage, not a collision
        self._blob = hashlib.sha1(b"blob %d\0" % size) if git_blob else None  # noqa: S324

    def update(self, data: bytes) -> None:
        self._sha.update(data)
        if self._blob is not None:
            self._blob.update(data)

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()

    @property
    def blob_id(self) -> str | None:
        return self._blob.hexdigest() if self._blob is not None else None


def digest_file(path: Path, size: int, *, git_blob: bool = False, owned: bool = True) -> Digest:
    """The Digest of a regular file (never read through a link; ours when OWNED), one pass."""
    d = Digest(size, git_blob)
    with safe_io.open_read(path, owned=owned) as f:
        for chunk in iter(lambda: f.read(safe_io.CHUNK), b""):
            d.update(chunk)
    return d


class Pins(Protocol):
    """What a fetch checks a store's copy against besides the store's own manifest (the Hub's
    listing of a snapshot: hub_pins.HubPins). Why a protocol here: the fetch (asset_store) runs
    the checks where the bytes arrive, and the one place that knows the pins (hub_pins.py)
    imports the store, not the other way round."""

    how: str  # where the pins come from, for the message
    # What the fetched copy's manifest records of the pins, replacing the store's own record
    # (empty: keep the store's): a listing read live from the Hub is what a later push carries on,
    # never the record of a store that may have been rewritten.
    kept: dict[str, Any]

    def check_manifest(self, manifest: dict[str, Any]) -> list[str]:
        """What differs between the store's manifest and the pins (empty: nothing)."""
        ...

    def wants_blob(self, path: str) -> bool:
        """Whether PATH is pinned by its git blob id (so the fetch hashes it too)."""
        ...

    def check(self, path: str, digest: Digest) -> str | None:
        """None when the bytes hashed into DIGEST are the pinned file PATH, else what differs."""
        ...


def safe_path(path: str) -> str:
    """A manifest path, refused unless it stays inside its directory (a store can be tampered
    with)."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or "\\" in path or "\x00" in path:
        raise StoreError(f"manifest path {path!r} leaves its directory", mismatch=True)
    return p.as_posix()


def parse_manifest(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        raise StoreError(f"{where}: not JSON", mismatch=True) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StoreError(f"{where}: not a {FORMAT} manifest", mismatch=True)
    files = data.get("files")
    if not isinstance(files, list):
        raise StoreError(f"{where}: no file list", mismatch=True)
    for e in files:
        if not isinstance(e, dict) or not re.fullmatch(r"[0-9a-f]{64}", str(e.get("sha256"))):
            raise StoreError(f"{where}: a file entry without a sha256: {e!r}", mismatch=True)
        e["path"] = safe_path(str(e.get("path")))
        if not isinstance(e.get("bytes"), int) or e["bytes"] < 0:
            raise StoreError(f"{where}: {e['path']}: no size", mismatch=True)
    return data


class Store:
    """One place assets are kept. Subclasses move single files; asset_store's fetch/push do the
    rest."""

    url = ""

    def where(self, key: str, path: str = "") -> str:
        return f"{self.url.rstrip('/')}/{key}" + (f"/{path}" if path else "")

    def read_manifest(self, key: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def stat(self, key: str, path: str) -> tuple[int, str | None] | None:
        """(size, the sha256 recorded from the stored bytes, or None) of a stored file; None when
        it is not there."""
        raise NotImplementedError

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
        """Complete the partial file DEST to the stored object's SIZE bytes (a prefix already
        there is continued); returns the Digest of DEST's bytes (GIT_BLOB: with the blob id),
        hashed as they arrived, and whether a prefix was continued. The caller compares it with
        the manifest and its pins."""
        raise NotImplementedError

    def put_file(self, key: str, path: str, src: Path, sha256: str, progress: Progress) -> str:
        """Upload SRC, hashing the bytes as they are read; StoreError (mismatch) when they are not
        SHA256 (nothing then takes the name). Returns a word for the log (uploaded, resumed ...)."""
        raise NotImplementedError

    def put_manifest(self, key: str, manifest: dict[str, Any]) -> None:
        raise NotImplementedError

    def exclusive(self, key: str) -> ContextManager[None]:
        """Held for a whole push into KEY: a second writer fails at once with StoreError, so no
        manifest is ever written over files another writer replaced meanwhile. A store that
        cannot lock (S3) holds nothing; its objects carry the sha256 of their own bytes."""
        return contextlib.nullcontext()


def fetch_ranges(
    read: ReadRange,
    dest: Path,
    size: int,
    name: str,
    progress: Progress,
    *,
    base: Path | None = None,
    ranges: int = 0,
    range_bytes: int = 0,
    git_blob: bool = False,
) -> tuple[Digest, bool]:
    """DEST, a partial file whose bytes are a prefix of the object, completed to SIZE bytes with
    RANGES ranged reads in flight at once; returns (the Digest of all of DEST's bytes, with the
    git blob id when GIT_BLOB, and whether a prefix was continued). The prefix is hashed first
    (it is ours, but only the final hash makes it good); each range is checked for its length,
    asked again on a short answer or an error (RETRIES), then hashed and appended in order, so a
    crash at any point leaves a prefix. At most 2 x RANGES ranges are held in memory."""
    ranges = max(1, ranges or RANGES)
    range_bytes = max(1, range_bytes or RANGE_BYTES)  # read at call time (tests set it small)
    fout, have = safe_io.open_resume(dest, base=base)
    with fout:
        if have > size:
            fout.truncate(0)
            have = 0
        h = Digest(size, git_blob)
        fout.seek(0)
        for chunk in iter(lambda: fout.read(safe_io.CHUNK), b""):
            h.update(chunk)
        spans = iter([(o, min(range_bytes, size - o)) for o in range(have, size, range_bytes)])
        done = have
        with ThreadPoolExecutor(max_workers=ranges) as pool:
            pending: deque[Future[bytes]] = deque()

            def more() -> None:
                span = next(spans, None)
                if span is not None:
                    pending.append(pool.submit(_read_range, read, span[0], span[1], name, size))

            for _ in range(2 * ranges):
                more()
            try:
                while pending:
                    data = pending.popleft().result()
                    more()
                    h.update(data)
                    fout.write(data)
                    done += len(data)
                    progress(name, done, size)
            finally:
                for f in pending:
                    f.cancel()
        fout.flush()
        os.fsync(fout.fileno())
        if os.fstat(fout.fileno()).st_size != size:  # someone else wrote to it meanwhile
            raise StoreError(f"{dest}: not {size} bytes after the fetch", mismatch=True)
    return h, have > 0


def _read_range(read: ReadRange, offset: int, length: int, name: str, size: int) -> bytes:
    """LENGTH bytes at OFFSET, asked again when the answer is short, long or fails."""
    why = ""
    for _ in range(RETRIES):
        if hf_hub.CANCEL.is_set():
            raise hf_hub.Cancelled(name)
        try:
            data = read(offset, length)
        except StoreError as err:
            if err.mismatch:
                raise
            why = str(err)
            continue
        except (OSError, ValueError) as err:  # a dropped connection, a reset, a timeout
            why = f"{type(err).__name__}: {err}"
            continue
        if len(data) == length:
            return data
        why = f"{len(data)} bytes came back"
    raise StoreError(
        f"{name}: bytes {offset}-{offset + length - 1} of {size}: {RETRIES} attempts failed "
        f"(last: {why[:300]})"
    )
