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

Every file in a cache directory or a directory store is opened through safe_io.py: never through
a symlink, written only into a fresh file that is then renamed into place, and, in our own cache,
only when it is a regular file of ours (docs/architecture.md, "The trust boundary"). What is
uploaded is hashed as it is read, so a store object never carries a sha256 its bytes do not have.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import (
    Any,
    Callable,
    ContextManager,
)  # typing's: subscripted at run time (python 3.8 hosts)

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # siblings import by name, also when loaded by path

import hf_hub  # noqa: E402 (after the sys.path line above)
import safe_io  # noqa: E402
from store_base import (  # noqa: E402, F401 (re-exported: the store's one vocabulary)
    FORMAT,
    MANIFEST,
    PART_BYTES,
    Digest,
    Pins,
    Progress,
    Store,
    StoreError,
    digest_file,
    fetch_ranges,
    parse_manifest,
    safe_path,
)

CHUNK = 1 << 20
SKIP_PARTS = (".partial", ".tmp")

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# Hashing and manifests


def file_sha256(path: Path, *, owned: bool = False) -> str:
    """sha256 of a regular file, never read through a symlink (OWNED: ours only)."""
    return safe_io.sha256_of(path, owned=owned)


def hash_files(
    root: Path, paths: Iterable[str], threads: int = 8, *, owned: bool = True
) -> dict[str, str]:
    """sha256 of each ROOT/path, in parallel (hashlib releases the GIL on large buffers)."""
    paths = list(paths)
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        return dict(zip(paths, pool.map(lambda p: file_sha256(root / p, owned=owned), paths)))


def list_tree(root: Path) -> list[str]:
    """Every file under ROOT (relative, sorted), without our manifest, partial files or hf's
    .cache. Walked by `safe_io.walk`: ROOT a real directory, nothing followed, nothing unread;
    an entry that is neither a directory nor a regular file is refused (UnsafeFile), never
    left out of a manifest in silence."""
    out = []
    for e in safe_io.walk(root):
        if e.rel.split("/")[0] in (MANIFEST, ".cache", ".reproduce-pending", ".reproduce-complete"):
            continue
        if stat.S_ISDIR(e.st.st_mode):
            continue
        if not stat.S_ISREG(e.st.st_mode):
            what = "a symlink" if stat.S_ISLNK(e.st.st_mode) else "not a regular file"
            raise safe_io.UnsafeFile(root / e.rel, f"{what}, in a tree to be listed")
        if not e.name.endswith(SKIP_PARTS):
            out.append(e.rel)
    return sorted(out)


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
    entries = [
        {"path": n, "bytes": os.lstat(str(root / n)).st_size, "sha256": known[n]} for n in names
    ]
    return {
        "format": FORMAT,
        "asset": asset,
        "files": entries,
        "total_bytes": sum(e["bytes"] for e in entries),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "origin": origin,
    }


def read_local_manifest(root: Path) -> dict[str, Any] | None:
    """The cache directory's manifest, only when it is a regular file of ours (a link or another
    user's file there is no manifest: the cache is then not trusted)."""
    path = root / MANIFEST
    try:
        return parse_manifest(safe_io.read_text(path, owned=True), str(path))
    except (OSError, UnicodeDecodeError, StoreError):
        return None  # absent, unsafe or damaged: no manifest, the cache is not trusted


def write_local_manifest(root: Path, manifest: dict[str, Any], *, base: Path | None = None) -> None:
    """The manifest into ROOT through a fresh file and a rename (never through what is there)."""
    body = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    safe_io.make_dirs(root, base=base)
    safe_io.write_atomic(root / MANIFEST, body.encode("utf-8"))


def verify_tree(
    root: Path, manifest: dict[str, Any], *, full: bool = True, threads: int = 8
) -> list[str]:
    """What differs between ROOT and its manifest (empty: every file there, every sha256 right)."""
    bad = []
    present = []
    for e in manifest["files"]:
        path = root / e["path"]
        try:
            st = safe_io.lstat_regular(path, owned=True)
        except OSError as err:
            bad.append(f"{e['path']}: {err}")
            continue
        if st is None:
            bad.append(f"{e['path']}: missing")
            continue
        size = st.st_size
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


class LocalStore(Store):
    """A directory, local or shared (NFS, FSx): KEY is a sub-directory shaped like a cache dir."""

    def __init__(self, root: str):
        self.root = Path(root).expanduser()
        self.url = str(self.root)

    def read_manifest(self, key: str) -> dict[str, Any] | None:
        path = self.root / key / MANIFEST
        try:
            text = safe_io.read_text(path, owned=False)  # another writer's: its hashes are checked
        except FileNotFoundError:
            if not self.root.is_dir():
                raise StoreError(f"store {self.root}: no such directory") from None
            return None
        except (OSError, UnicodeDecodeError) as err:
            raise StoreError(f"{path}: {err}", mismatch=True) from None
        return parse_manifest(text, str(path))

    def stat(self, key: str, path: str) -> tuple[int, str | None] | None:
        try:
            st = safe_io.lstat_regular(self.root / key / path, owned=False)
        except OSError:
            return None  # not a regular file (a link ...): as good as absent, pushed again
        return (st.st_size, None) if st is not None else None

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
        """Parallel preads of one open file (never a link; another writer's, so its bytes are
        checked): a shared filesystem (NFS, FSx) serves many reads in flight far faster than
        one."""
        src = self.root / key / path
        with safe_io.open_read(src, owned=False) as fin:
            there = os.fstat(fin.fileno()).st_size
            if there != size:
                raise StoreError(
                    f"{src}: {there} bytes, its manifest says {size}; not fetched", mismatch=True
                )
            fd = fin.fileno()
            return fetch_ranges(
                lambda off, n: os.pread(fd, n, off), dest, size, path, progress, git_blob=git_blob
            )

    def exclusive(self, key: str) -> ContextManager[None]:
        return _push_lock(self.root, key, self.where(key))

    def put_file(self, key: str, path: str, src: Path, sha256: str, progress: Progress) -> str:
        """SRC copied into a temporary file of this writer's own (an interrupted copy's
        `.partial` is claimed by renaming it, so two writers never share one), hashed through
        that file, and renamed into place only when its bytes are SHA256."""
        target = self.root / key / path
        partial = target.with_name(target.name + ".partial")
        mine = _claim(partial)
        try:
            got, resumed = _copy_resuming(src, mine, path, progress, base=self.root)
            if got != sha256 and resumed:  # an older attempt's bytes: once more from the start
                os.unlink(str(mine))
                got, resumed = _copy_resuming(src, mine, path, progress, base=self.root)
            if got != sha256:
                os.unlink(str(mine))
                raise StoreError(
                    f"{target}: the bytes read from {src} have sha256 {got}, its manifest says "
                    f"{sha256}; not stored",
                    mismatch=True,
                )
            ino = os.lstat(str(mine)).st_ino
            os.replace(str(mine), str(target))  # replaces whatever name was there, never follows
        except BaseException:
            _unclaim(mine, partial)  # what was copied stays for the next attempt to continue
            raise
        if os.lstat(str(target)).st_ino != ino:
            raise StoreError(f"{target}: another writer replaced it while it was stored")
        return "resumed" if resumed else "copied"

    def put_manifest(self, key: str, manifest: dict[str, Any]) -> None:
        write_local_manifest(self.root / key, manifest, base=self.root)


PUSH_LOCK = ".reproduce-push.lock"


@contextlib.contextmanager
def _push_lock(root: Path, key: str, where: str) -> Iterator[None]:
    """An exclusive, non-blocking flock on KEY's lock file, held for the whole push (the kernel
    drops it when the writer dies, so a killed push never leaves the key locked)."""
    folder = safe_io.make_dirs(root / key, base=root)
    lock = folder / PUSH_LOCK
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(str(lock), flags, 0o644)
    except OSError as err:
        raise StoreError(f"{where}: cannot open its lock file {lock} ({err.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StoreError(
                f"{where}: another push into it is under way (it holds {lock}); this push "
                "stored nothing. Run it again when that one has ended: what the other push "
                "stored is then checked, not copied again"
            ) from None
        yield
    finally:
        os.close(fd)


def _claim(partial: Path) -> Path:
    """A name of this writer's own for a copy to PARTIAL's place: PARTIAL itself renamed (an
    interrupted copy is continued by exactly one writer), else a fresh name."""
    mine = partial.with_name(f".{partial.name[:-8]}.{os.getpid()}.{secrets.token_hex(6)}.partial")
    try:
        os.rename(str(partial), str(mine))  # atomic: of two writers, one gets it
    except FileNotFoundError:
        pass
    return mine


def _unclaim(mine: Path, partial: Path) -> None:
    """Give a failed copy's bytes back to PARTIAL's name (unless another writer's are there)."""
    try:
        os.link(str(mine), str(partial))
    except OSError:
        pass
    try:
        os.unlink(str(mine))
    except OSError:
        pass


def _copy_resuming(
    src: Path,
    dest: Path,
    name: str,
    progress: Progress,
    *,
    src_owned: bool = True,
    base: Path | None = None,
) -> tuple[str, bool]:
    """SRC into DEST, continuing a DEST left shorter by an interrupted copy; returns the sha256
    of DEST's bytes (hashed as they are read and written) and whether it resumed. Neither name is
    ever followed as a symlink (safe_io)."""
    with safe_io.open_read(src, owned=src_owned) as fin:
        total = os.fstat(fin.fileno()).st_size
        fout, have = safe_io.open_resume(dest, base=base)
        with fout:
            if have > total:
                fout.truncate(0)
                have = 0
            h = hashlib.sha256()
            fout.seek(0)
            for chunk in iter(lambda: fout.read(CHUNK), b""):  # what DEST already holds
                h.update(chunk)
            fin.seek(have)
            done = have
            for chunk in iter(lambda: fin.read(CHUNK), b""):
                if hf_hub.CANCEL.is_set():
                    raise hf_hub.Cancelled(name)
                fout.write(chunk)
                h.update(chunk)
                done += len(chunk)
                progress(name, done, total)
            fout.flush()
            os.fsync(fout.fileno())
    return h.hexdigest(), have > 0


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
    pins: Pins | None = None,
    threads: int = 8,
    progress: Progress = _quiet_progress,
    log: Log = _stderr,
) -> dict[str, Any]:
    """Make DEST hold the asset stored under KEY, every file checked against the store's
    manifest; files already in DEST with the right sha256 are kept (a re-run resumes). The
    store's manifest lands in DEST last. ONLY limits it to some files (no manifest written).

    PINS (a snapshot: the Hub's listing, hub_pins.py) are checked where the store's own word is
    not enough: the manifest this fetch reads against them before any byte (a file too many, one
    missing, a size or LFS sha256 of its own), then each file's bytes as they arrive, before the
    file takes its name; the files pinned by their git blob id (small, kept in git) come first,
    so a swapped config is refused before the weights are fetched."""
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
    if pins is not None:
        wrong = pins.check_manifest(manifest)
        if wrong:
            raise StoreError(
                f"{store.where(key)} differs from {pins.how}: {'; '.join(wrong[:3])}"
                + (f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else "")
                + "; nothing was fetched",
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

    def pinned(e: dict[str, Any], got: Digest) -> str | None:
        """What differs from the pins (None: nothing, or no pins)."""
        return pins.check(e["path"], got) if pins is not None else None

    def one(e: dict[str, Any]) -> str:
        target = dest / e["path"]
        blob = pins is not None and pins.wants_blob(e["path"])
        try:
            st = safe_io.lstat_regular(target, owned=True)
        except OSError:
            st = None  # not a file of ours: replaced below (a rename never follows it)
        if st is not None and st.st_size == e["bytes"]:
            have = digest_file(target, e["bytes"], git_blob=blob)
            if have.sha256 == e["sha256"] and pinned(e, have) is None:
                return "kept"
        partial = target.with_name(target.name + ".partial")
        safe_io.make_dirs(partial.parent, base=dest)
        got, resumed = store.get_file(key, e["path"], partial, e["bytes"], progress, git_blob=blob)
        if got.sha256 != e["sha256"] and resumed:  # an earlier attempt's prefix: from byte 0
            log(f"  {e['path']}: the continued partial file's sha256 differs; fetching it again")
            _clear(partial)
            got, resumed = store.get_file(
                key, e["path"], partial, e["bytes"], progress, git_blob=blob
            )
        if got.sha256 != e["sha256"]:
            _clear(partial)
            raise StoreError(
                f"{store.where(key, e['path'])}: sha256 {got.sha256}, its manifest says "
                f"{e['sha256']}",
                mismatch=True,
            )
        bad = pinned(e, got)
        if bad is not None and pins is not None:
            _clear(partial)
            raise StoreError(
                f"{store.where(key, e['path'])} differs from {pins.how}: {bad}; it did not take "
                "its name",
                mismatch=True,
            )
        os.replace(str(partial), str(target))  # hashed as it arrived: no second pass
        return "fetched"

    safe_io.make_dirs(dest, base=dest.parent)
    by_blob = [pins is not None and pins.wants_blob(e["path"]) for e in entries]
    results: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for first in (True, False):
            results += pool.map(one, [e for e, b in zip(entries, by_blob) if b is first])
    fetched = results.count("fetched")
    log(
        f"{store.where(key)} -> {dest}: {fetched} file(s) fetched, {len(results) - fetched} "
        f"already there, {sum(e['bytes'] for e in entries)} bytes, every sha256 checked"
        + (f", every file against {pins.how}" if pins is not None else "")
    )
    if only is None:
        kept = pins.kept if pins is not None else {}  # the live listing, not the store's word
        write_local_manifest(dest, {**manifest, **kept, "origin": store.where(key)})
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
    with store.exclusive(key):
        return _push_held(store, key, src, manifest, threads=threads, progress=progress, log=log)


def _push_held(
    store: Store,
    key: str,
    src: Path,
    manifest: dict[str, Any],
    *,
    threads: int,
    progress: Progress,
    log: Log,
) -> dict[str, Any]:
    existing = store.read_manifest(key)
    if existing is not None and existing.get("asset") != manifest["asset"]:
        raise StoreError(
            f"{store.where(key)} holds {json.dumps(existing.get('asset'), sort_keys=True)}; "
            "refusing to overwrite it",
            mismatch=True,
        )
    # No "already complete" from the manifest alone: each object is checked (a directory
    # store's bytes are hashed, an S3 object's sha256 was recorded from the bytes it was made
    # of), so a re-push repairs an object whose bytes differ from the manifest.

    def one(e: dict[str, Any]) -> str:
        there = store.stat(key, e["path"])
        if there is not None and there[0] == e["bytes"]:
            recorded = there[1]
            if recorded == e["sha256"]:
                return "skipped"
            if recorded is None and isinstance(store, LocalStore):
                try:
                    same = file_sha256(store.root / key / e["path"]) == e["sha256"]
                except OSError:
                    same = False
                if same:
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


def _clear(path: Path) -> None:
    """Remove a name (a leftover partial, or a link planted there); never follows it."""
    try:
        st = os.lstat(str(path))
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise safe_io.UnsafeFile(path, "a directory is in its place")
    os.unlink(str(path))
