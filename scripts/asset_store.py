#!/usr/bin/env python3
"""The asset store and its manifests: a directory (local or shared) or an S3 prefix.

Runs on the node's host python3, inside the training image, and in `reproduce prepare` (which
loads this file); never imports `launcher`. S3 goes through boto3 when it is importable and
through the `aws` CLI otherwise (REPRODUCE_S3_CLIENT=boto3|aws-cli picks one), in s3_store.py;
both honour AWS_ENDPOINT_URL.

Layout: every asset lives under one KEY (a relative path such as
`hf/models/Qwen--Qwen3-30B-A3B@ad44e777...`): its files, and `.reproduce-manifest.json`, which
is written LAST, so a key without a manifest is an unfinished upload. A cache directory on the
node has the same shape: the files and the same manifest, copied when the files were verified.
The manifest (docs/assets.md) is one JSON object: `format`, `asset` (what it is: repo, commit,
...), `files` ([{path, bytes, sha256}], sorted), `total_bytes`, `created_at`, `origin`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, Callable  # typing's: subscripted at run time (python 3.8 hosts)

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # siblings import by name, also when loaded by path

import hf_hub  # noqa: E402 (after the sys.path line above)

MANIFEST = ".reproduce-manifest.json"
FORMAT = "reproduce-asset-manifest/1"
CHUNK = 1 << 20
PART_BYTES = 64 << 20  # multipart part size (S3 allows 5 MiB .. 5 GiB, at most 10,000 parts)
SKIP_PARTS = (".partial", ".tmp")

Progress = Callable[[str, int, int], None]  # (file path, bytes done, bytes total)
Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class StoreError(Exception):
    """The store cannot be read or written (exit 3), or holds something else (exit 1 via
    `mismatch`)."""

    def __init__(self, message: str, *, mismatch: bool = False):
        super().__init__(message)
        self.mismatch = mismatch


# ------------------------------------------------------------------------------------------------
# Hashing and manifests


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_files(root: Path, paths: Iterable[str], threads: int = 8) -> dict[str, str]:
    """sha256 of each ROOT/path, in parallel (hashlib releases the GIL on large buffers)."""
    paths = list(paths)
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        return dict(zip(paths, pool.map(lambda p: file_sha256(root / p), paths)))


def safe_path(path: str) -> str:
    """A manifest path, refused unless it stays inside its directory (a store can be tampered
    with)."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or "\\" in path or "\x00" in path:
        raise StoreError(f"manifest path {path!r} leaves its directory", mismatch=True)
    return p.as_posix()


def list_tree(root: Path) -> list[str]:
    """Every file under ROOT (relative, sorted), without our manifest, partial files or hf's
    .cache."""
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] in (MANIFEST, ".cache", ".reproduce-pending", ".reproduce-complete"):
            continue
        if path.is_file() and not path.name.endswith(SKIP_PARTS):
            out.append(rel.as_posix())
    return out


def make_manifest(
    root: Path,
    asset: dict[str, Any],
    *,
    files: Iterable[str] | None = None,
    known: dict[str, str] | None = None,
    origin: str = "",
    threads: int = 8,
) -> dict[str, Any]:
    """The manifest of ROOT's files (or FILES), hashing what `known` does not already give."""
    names = sorted(files) if files is not None else list_tree(root)
    known = dict(known or {})
    known.update(hash_files(root, [n for n in names if n not in known], threads))
    entries = [{"path": n, "bytes": (root / n).stat().st_size, "sha256": known[n]} for n in names]
    return {
        "format": FORMAT,
        "asset": asset,
        "files": entries,
        "total_bytes": sum(e["bytes"] for e in entries),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "origin": origin,
    }


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


def read_local_manifest(root: Path) -> dict[str, Any] | None:
    path = root / MANIFEST
    if not path.is_file():
        return None
    try:
        return parse_manifest(path.read_text(encoding="utf-8"), str(path))
    except StoreError:
        return None  # a damaged cache manifest is no manifest: the cache is not trusted


def write_local_manifest(root: Path, manifest: dict[str, Any]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{MANIFEST}.{os.getpid()}.tmp"
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MANIFEST)


def verify_tree(
    root: Path, manifest: dict[str, Any], *, full: bool = True, threads: int = 8
) -> list[str]:
    """What differs between ROOT and its manifest (empty: every file there, every sha256 right)."""
    bad = []
    present = []
    for e in manifest["files"]:
        path = root / e["path"]
        try:
            size = path.stat().st_size
        except OSError:
            bad.append(f"{e['path']}: missing")
            continue
        if size != e["bytes"]:
            bad.append(f"{e['path']}: {size} bytes, the manifest says {e['bytes']}")
        else:
            present.append(e)
    if full and present:
        got = hash_files(root, [e["path"] for e in present], threads)
        bad += [
            f"{e['path']}: sha256 {got[e['path']]}, the manifest says {e['sha256']}"
            for e in present
            if got[e["path"]] != e["sha256"]
        ]
    return bad


# ------------------------------------------------------------------------------------------------
# Stores


class Store:
    """One place assets are kept. Subclasses move single files; fetch/push here do the rest."""

    url = ""

    def where(self, key: str, path: str = "") -> str:
        return f"{self.url.rstrip('/')}/{key}" + (f"/{path}" if path else "")

    def read_manifest(self, key: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def stat(self, key: str, path: str) -> tuple[int, str | None] | None:
        """(size, recorded sha256 or None) of a stored file, None when it is not there."""
        raise NotImplementedError

    def get_file(self, key: str, path: str, dest: Path, size: int, progress: Progress) -> None:
        raise NotImplementedError

    def put_file(self, key: str, path: str, src: Path, sha256: str, progress: Progress) -> str:
        """Upload SRC; returns a word for the log (uploaded, resumed ...)."""
        raise NotImplementedError

    def put_manifest(self, key: str, manifest: dict[str, Any]) -> None:
        raise NotImplementedError


class LocalStore(Store):
    """A directory, local or shared (NFS, FSx): KEY is a sub-directory shaped like a cache dir."""

    def __init__(self, root: str):
        self.root = Path(root).expanduser()
        self.url = str(self.root)

    def read_manifest(self, key: str) -> dict[str, Any] | None:
        path = self.root / key / MANIFEST
        if not path.is_file():
            if not self.root.is_dir():
                raise StoreError(f"store {self.root}: no such directory")
            return None
        return parse_manifest(path.read_text(encoding="utf-8"), str(path))

    def stat(self, key: str, path: str) -> tuple[int, str | None] | None:
        try:
            return (self.root / key / path).stat().st_size, None
        except OSError:
            return None

    def get_file(self, key: str, path: str, dest: Path, size: int, progress: Progress) -> None:
        _copy_resuming(self.root / key / path, dest, path, progress)

    def put_file(self, key: str, path: str, src: Path, sha256: str, progress: Progress) -> str:
        target = self.root / key / path
        partial = target.with_name(target.name + ".partial")
        resumed = partial.exists() and partial.stat().st_size > 0
        _copy_resuming(src, partial, path, progress)
        if file_sha256(partial) != sha256:
            partial.unlink()
            raise StoreError(f"{target}: the copy's sha256 differs from {src}'s; try again")
        os.replace(partial, target)
        return "resumed" if resumed else "copied"

    def put_manifest(self, key: str, manifest: dict[str, Any]) -> None:
        write_local_manifest(self.root / key, manifest)


def _copy_resuming(src: Path, dest: Path, name: str, progress: Progress) -> None:
    """SRC into DEST, continuing a DEST left shorter by an interrupted copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    total = src.stat().st_size
    have = dest.stat().st_size if dest.exists() else 0
    if have > total:
        dest.unlink()
        have = 0
    with src.open("rb") as fin, dest.open("ab" if have else "wb") as fout:
        fin.seek(have)
        done = have
        for chunk in iter(lambda: fin.read(CHUNK), b""):
            if hf_hub.CANCEL.is_set():
                raise hf_hub.Cancelled(name)
            fout.write(chunk)
            done += len(chunk)
            progress(name, done, total)
        fout.flush()
        os.fsync(fout.fileno())


def open_store(url: str, *, part_bytes: int = PART_BYTES) -> Store:
    """A store from its URL: s3://BUCKET/PREFIX, or a directory path."""
    if url.startswith("s3://"):
        client = os.environ.get("REPRODUCE_S3_CLIENT", "")
        if client not in ("", "boto3", "aws-cli"):
            raise StoreError(f"REPRODUCE_S3_CLIENT={client!r}: expected boto3 or aws-cli")
        import s3_store  # a sibling in scripts/ (its directory is on sys.path)

        if client == "aws-cli":
            return s3_store.CliS3(url)
        try:
            return s3_store.Boto3S3(url, part_bytes)
        except ImportError:
            if client == "boto3":
                raise StoreError(
                    f"store {url}: REPRODUCE_S3_CLIENT=boto3 but boto3 is not installed"
                ) from None
            return s3_store.CliS3(url)
    if "://" in url:
        raise StoreError(f"store {url!r}: expected s3://BUCKET/PREFIX or a directory path")
    return LocalStore(url)


# ------------------------------------------------------------------------------------------------
# Whole assets: store -> cache directory, cache directory -> store


def _quiet_progress(name: str, done: int, total: int) -> None:
    return None


def fetch(
    store: Store,
    key: str,
    dest: Path,
    asset: dict[str, Any],
    *,
    only: Iterable[str] | None = None,
    threads: int = 8,
    progress: Progress = _quiet_progress,
    log: Log = _stderr,
) -> dict[str, Any]:
    """Make DEST hold the asset stored under KEY, every file checked against the store's
    manifest; files already in DEST with the right sha256 are kept (a re-run resumes). The
    store's manifest lands in DEST last. ONLY limits it to some files (no manifest written)."""
    manifest = store.read_manifest(key)
    if manifest is None:
        raise StoreError(
            f"{store.where(key)}: no manifest (nothing stored, or an unfinished upload)"
        )
    if manifest.get("asset") != asset:
        raise StoreError(
            f"{store.where(key)} holds {json.dumps(manifest.get('asset'), sort_keys=True)}, "
            f"not {json.dumps(asset, sort_keys=True)}",
            mismatch=True,
        )
    entries = manifest["files"]
    if only is not None:
        wanted = set(only)
        entries = [e for e in entries if e["path"] in wanted]
        missing = wanted - {e["path"] for e in entries}
        if missing:
            raise StoreError(
                f"{store.where(key)}: the manifest lists no {sorted(missing)}", mismatch=True
            )

    def one(e: dict[str, Any]) -> str:
        target = dest / e["path"]
        if target.is_file() and target.stat().st_size == e["bytes"]:
            if file_sha256(target) == e["sha256"]:
                return "kept"
        partial = target.with_name(target.name + ".partial")
        store.get_file(key, e["path"], partial, e["bytes"], progress)
        got = file_sha256(partial)
        if got != e["sha256"]:
            partial.unlink()
            raise StoreError(
                f"{store.where(key, e['path'])}: sha256 {got}, its manifest says {e['sha256']}",
                mismatch=True,
            )
        os.replace(partial, target)
        return "fetched"

    dest.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        results = list(pool.map(one, entries))
    fetched = results.count("fetched")
    log(
        f"{store.where(key)} -> {dest}: {fetched} file(s) fetched, {len(results) - fetched} "
        f"already there, {sum(e['bytes'] for e in entries)} bytes, every sha256 checked"
    )
    if only is None:
        write_local_manifest(dest, {**manifest, "origin": store.where(key)})
    return {"fetched": fetched, "kept": len(results) - fetched, "files": len(results)}


def push(
    store: Store,
    key: str,
    src: Path,
    manifest: dict[str, Any],
    *,
    threads: int = 8,
    progress: Progress = _quiet_progress,
    log: Log = _stderr,
) -> dict[str, Any]:
    """Upload SRC's files under KEY, then MANIFEST. A file the store already holds with the same
    size and sha256 is skipped; an unfinished upload continues; the manifest comes last."""
    if isinstance(store, LocalStore):
        store.root.mkdir(parents=True, exist_ok=True)
    existing = store.read_manifest(key)
    if existing is not None and existing.get("asset") != manifest["asset"]:
        raise StoreError(
            f"{store.where(key)} holds {json.dumps(existing.get('asset'), sort_keys=True)}; "
            "refusing to overwrite it",
            mismatch=True,
        )
    if existing is not None and _same_files(existing, manifest):
        log(
            f"{store.where(key)}: already complete ({len(manifest['files'])} files); "
            "nothing uploaded"
        )
        return {"uploaded": 0, "skipped": len(manifest["files"]), "files": len(manifest["files"])}

    def one(e: dict[str, Any]) -> str:
        there = store.stat(key, e["path"])
        if there is not None and there[0] == e["bytes"]:
            recorded = there[1]
            if recorded == e["sha256"]:
                return "skipped"
            if recorded is None and isinstance(store, LocalStore):
                if file_sha256(store.root / key / e["path"]) == e["sha256"]:
                    return "skipped"
        how = store.put_file(key, e["path"], src / e["path"], e["sha256"], progress)
        log(f"  {e['path']}: {how} ({e['bytes']} bytes)")
        return "uploaded"

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        results = list(pool.map(one, manifest["files"]))
    store.put_manifest(key, manifest)
    uploaded = results.count("uploaded")
    log(
        f"{src} -> {store.where(key)}: {uploaded} file(s) uploaded, "
        f"{len(results) - uploaded} already there; manifest written"
    )
    return {"uploaded": uploaded, "skipped": len(results) - uploaded, "files": len(results)}


def _same_files(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def key(m: dict[str, Any]) -> list[tuple[str, int, str]]:
        return sorted((e["path"], e["bytes"], e["sha256"]) for e in m["files"])

    return key(a) == key(b)
