#!/usr/bin/env python3
"""What every asset store shares: the manifest's name and format, its parser, the Store interface
and StoreError. A module of its own so that asset_store.py (manifests, the directory store, fetch
and push) and s3_store.py (S3) both import it and neither imports the other at load time.

Standard library only; python 3.8 (the node's host python3); never imports `launcher`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any, Callable

MANIFEST = ".reproduce-manifest.json"
FORMAT = "reproduce-asset-manifest/1"
PART_BYTES = 64 << 20  # multipart part size (S3 allows 5 MiB .. 5 GiB, at most 10,000 parts)

Progress = Callable[[str, int, int], None]  # (file path, bytes done, bytes total)


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

    def get_file(self, key: str, path: str, dest: Path, size: int, progress: Progress) -> None:
        raise NotImplementedError

    def put_file(self, key: str, path: str, src: Path, sha256: str, progress: Progress) -> str:
        """Upload SRC, hashing the bytes as they are read; StoreError (mismatch) when they are not
        SHA256 (nothing then takes the name). Returns a word for the log (uploaded, resumed ...)."""
        raise NotImplementedError

    def put_manifest(self, key: str, manifest: dict[str, Any]) -> None:
        raise NotImplementedError
