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

Standard library only; python 3.8 (the node's host python3); never imports `launcher`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, Callable  # typing's: subscripted at run time (python 3.8 hosts)

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
        self, key: str, path: str, dest: Path, size: int, progress: Progress
    ) -> tuple[str, bool]:
        """Complete the partial file DEST to the stored object's SIZE bytes (a prefix already
        there is continued); returns the sha256 of DEST's bytes, hashed as they arrived, and
        whether a prefix was continued. The caller compares it with the manifest."""
        raise NotImplementedError

    def put_file(self, key: str, path: str, src: Path, sha256: str, progress: Progress) -> str:
        """Upload SRC, hashing the bytes as they are read; StoreError (mismatch) when they are not
        SHA256 (nothing then takes the name). Returns a word for the log (uploaded, resumed ...)."""
        raise NotImplementedError

    def put_manifest(self, key: str, manifest: dict[str, Any]) -> None:
        raise NotImplementedError


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
) -> tuple[str, bool]:
    """DEST, a partial file whose bytes are a prefix of the object, completed to SIZE bytes with
    RANGES ranged reads in flight at once; returns (sha256 of all of DEST's bytes, whether a
    prefix was continued). The prefix is hashed first (it is ours, but only the final hash makes
    it good); each range is checked for its length, asked again on a short answer or an error
    (RETRIES), then hashed and appended in order, so a crash at any point leaves a prefix. At
    most 2 x RANGES ranges are held in memory."""
    ranges = max(1, ranges or RANGES)
    range_bytes = max(1, range_bytes or RANGE_BYTES)  # read at call time (tests set it small)
    fout, have = safe_io.open_resume(dest, base=base)
    with fout:
        if have > size:
            fout.truncate(0)
            have = 0
        h = hashlib.sha256()
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
    return h.hexdigest(), have > 0


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
