#!/usr/bin/env python3
"""The host's checks of bytes that came from outside its trust: what a container made, and what
a store holds (docs/architecture.md, "The trust boundary").

- `adopt`: a container (the rows build, the conversion) writes only into a fresh, empty directory
  of its own; the host checks that directory (real directories and regular files of ours with
  one name: no link it could follow), checks the rows against the recipe's parquet_sha256, seals
  a converted checkpoint from the bytes it hashed itself, and only then moves it into the cache.
- rows from anywhere are checked against the recipe's own parquet_sha256, never only against a
  manifest that came with them;
- a snapshot from the store is checked, every file of it, against the Hub's listing of the pinned
  commit (hub_pins.py: LFS files by sha256, the others by git blob id; the live listing, or the
  one recorded beside the snapshot when the Hub cannot be reached).

Standard library only; python 3.8; never imports `launcher`. Used by node_assets.py.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # siblings import by name, also when loaded by path

import asset_spec  # noqa: E402 (after the sys.path line above)
import asset_store  # noqa: E402
import hub_pins  # noqa: E402
import safe_io  # noqa: E402
from asset_resolve import Failed, Log, cache_occupant, stderr_log  # noqa: E402
from asset_spec import identity  # noqa: E402

ROWS_STORE_FILE = "rows.parquet"
BUILD_SUMMARY = "build.json"  # beside the rows a container built, in its --out directory


def _check_rows_pin(path: Path, asset: dict[str, Any], origin: str) -> None:
    """Rows from anywhere (the store, a container's build) against the recipe's own
    parquet_sha256, never only against a manifest that came with them."""
    want = asset.get("parquet_sha256")
    if not want:
        return
    got = asset_store.file_sha256(path, owned=True)
    if got != want:
        field = (asset.get("hash_fields") or {}).get("parquet_sha256", "parquet_sha256")
        raise Failed(
            f"asset rows: MISMATCH {path} from {origin} has sha256 {got}; the recipe's {field} "
            f"is {want}; it did not take $SFT_DATA's name (kept where it is)"
        )


def check_against_hub(
    asset: dict[str, Any], store: asset_store.Store, key: str, log: Log = stderr_log
) -> hub_pins.HubPins:
    """The Hub's pins that a snapshot in the store must match, every file of it (hub_pins.py:
    the live listing, else the one recorded in the store's manifest); the fetch checks the
    manifest it reads and each file's bytes against them. Failed, before any byte, when the
    store holds no manifest (an unfinished upload: nothing to check the pins against)."""
    manifest = store.read_manifest(key)
    if manifest is None:
        raise Failed(f"asset {asset['name']}: {store.where(key)}: no manifest; nothing was fetched")
    return hub_pins.for_snapshot(asset, manifest, log)


def adopt(
    spec: dict[str, Any], name: str, src: Path, *, threads: int = 8, log: Log = stderr_log
) -> dict[str, Any]:
    """Move what a container made in its own fresh directory SRC (the rows build's --out, the
    conversion's --save) into the cache, after checking it on the host: nothing but real
    directories and regular files of ours with one name (no link the host could follow); the
    rows against the recipe's parquet_sha256; a converted checkpoint sealed by the host from the
    bytes it hashed. Anything else stays in SRC, named in the error. SRC itself must be a real
    directory: a container can put a symlink in its place (to the host user's home), which
    would have the host walk, prune and hash that instead; nothing is read through it."""
    asset = asset_spec.assets_by_name(spec)[name]
    dest = Path(asset["path"])
    try:
        safe_io.real_dir(src)
    except safe_io.UnsafeFile as err:
        raise Failed(
            f"asset {name}: what the container made is not adopted: --from must be a real "
            f"directory, and {src} is not ({err.why}); nothing there was read, removed or moved"
        ) from None
    if asset["kind"] == "rows":  # only the rows file itself is taken; the rest stays behind
        bad = []
        item = src / ROWS_STORE_FILE
    else:
        item = src
        try:
            removed = safe_io.prune_links(src)
            bad = safe_io.check_tree(src)
        except (safe_io.UnsafeFile, PermissionError) as err:
            raise Failed(_unchecked(name, src, err)) from None
        if removed:
            log(
                f"{name}: removed {len(removed)} entries that are not regular files from what the "
                f"container made (never followed): {', '.join(removed[:5])}"
            )
    if bad:
        raise Failed(
            f"asset {name}: what the container made in {src} is not only regular files of this "
            f"user ({'; '.join(bad[:3])}); nothing was moved into the cache"
        )
    if asset["kind"] == "rows":
        try:
            st = safe_io.lstat_regular(item)
        except OSError as err:
            raise Failed(f"asset rows: {err}; nothing was moved into the cache") from None
        if st is None:
            raise Failed(f"asset rows: the build left no {item}")
        if st.st_nlink != 1:
            raise Failed(f"asset rows: {item} has {st.st_nlink} names; not moved into the cache")
        _check_rows_pin(item, asset, f"the build in the image ({src})")
        sha = asset_store.file_sha256(item, owned=True)
        summary = _summary_of(src / BUILD_SUMMARY)
        summary.update(parquet_sha256=sha, checked_on_host=bool(asset.get("parquet_sha256")))
        _move_file(item, dest)
        safe_io.write_atomic(
            Path(str(dest) + ".build.json"),
            (json.dumps(summary, indent=1, sort_keys=True) + "\n").encode(),
        )
        pinned = (
            "checked against the recipe's parquet_sha256"
            if asset.get("parquet_sha256")
            else ("NOT checked: the recipe pins no parquet_sha256 or the profile turned it off")
        )
        log(f"rows: {dest}: sha256 {sha}, {pinned}, moved into the cache by the host")
        return {"path": str(dest), "parquet_sha256": sha}
    other = cache_occupant(dest, identity(asset))
    if other is not None:
        raise Failed(f"asset {name}: {dest} holds {other}; nothing was overwritten")
    try:
        manifest = asset_store.make_manifest(
            src, identity(asset), origin=f"made on {os.uname().nodename}", threads=threads
        )
    except (safe_io.UnsafeFile, PermissionError) as err:
        raise Failed(_unchecked(name, src, err)) from None
    if not manifest["files"]:
        raise Failed(f"asset {name}: the container left nothing in {src}")
    if os.path.lexists(str(dest)):
        shutil.rmtree(str(dest))  # an unfinished attempt of this very asset (cache_occupant)
    asset_store.write_local_manifest(src, manifest)
    safe_io.make_dirs(dest.parent, base=dest.parent.parent)
    try:
        os.rename(str(src), str(dest))  # the same file system: src is in $CACHE_DIR/.incoming
    except OSError as err:
        if err.errno != 18:  # EXDEV: the profile put $TORCH_DIST on another file system
            raise
        tmp = dest.with_name(f".{dest.name}.adopting")
        shutil.rmtree(str(tmp), ignore_errors=True)
        for e in manifest["files"]:  # what the host hashed, file by file: no walk of src again
            _copy_file(src / e["path"], tmp / e["path"], base=tmp.parent)
        asset_store.write_local_manifest(tmp, manifest)
        bad = asset_store.verify_tree(tmp, manifest, threads=threads)
        if bad:
            raise Failed(f"asset {name}: the copy to {tmp} differs ({bad[0]})") from None
        os.rename(str(tmp), str(dest))
        shutil.rmtree(str(src), ignore_errors=True)
    log(f"{name}: {len(manifest['files'])} files, {manifest['total_bytes']} bytes, checked and "
        f"sealed on the host, moved into {dest}")  # fmt: skip
    return manifest


def _summary_of(path: Path) -> dict[str, Any]:
    """The build's own summary (what the container says it did), for the record only: the host
    decides nothing by it, and overwrites its parquet_sha256 with the one it computed."""
    try:
        data = json.loads(safe_io.read_text(path, owned=True))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _unchecked(name: str, src: Path, err: OSError) -> str:
    return (
        f"asset {name}: what the container made in {src} cannot be checked whole ({err}); "
        "nothing was moved into the cache"
    )


def _move_file(src: Path, dest: Path) -> None:
    """SRC into DEST's name: a rename where they share a file system, else a copy into a fresh
    file beside DEST, whose sha256 must be SRC's."""
    safe_io.make_dirs(dest.parent, base=dest.parent.parent)
    try:
        os.replace(str(src), str(dest))
        return
    except OSError as err:
        if err.errno != 18:  # EXDEV
            raise
    want = asset_store.file_sha256(src, owned=True)
    _copy_file(src, dest, base=dest.parent.parent)
    if asset_store.file_sha256(dest, owned=True) != want:
        raise Failed(f"{dest}: the copy of {src} differs from it")
    os.unlink(str(src))


def _copy_file(src: Path, dest: Path, *, base: Path) -> None:
    """SRC (a regular file of ours, never read through a link) into a fresh file renamed to
    DEST, whose directories are made below BASE, none of them a link."""
    with safe_io.open_read(src) as fin:
        fout, tmp = safe_io.create_new(dest, base=base)
        with fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
            safe_io.commit(fout, tmp, dest)
