#!/usr/bin/env python3
"""Where each of a run's assets will come from, decided before anything costly (node_assets.py
resolve): cache, store, Hub, build or convert, or a failure that names the asset and every
source tried.

Runs on the node's host python3 in the first minute, before the image pull: it reads manifests
and the Hub's file listings and checks access with one byte of one file; it never downloads an
asset. Never imports `launcher`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # siblings import by name, also when loaded by path

import asset_spec  # noqa: E402 (after the sys.path line above)
import asset_store  # noqa: E402
import hf_hub  # noqa: E402
import safe_io  # noqa: E402
from asset_spec import describe, identity, store_key  # noqa: E402
from asset_store import StoreError  # noqa: E402

PLAN_FORMAT = "reproduce-asset-plan/1"
PENDING = ".reproduce-pending"
Log = Callable[[str], None]


class Failed(Exception):
    """An asset cannot be supplied or differs from what the recipe pins (exit 1; 3 when
    `infra`)."""

    def __init__(self, message: str, *, infra: bool = False):
        super().__init__(message)
        self.infra = infra


def reason(head: str, **facts: str) -> str:
    """A reason a person reads whole: HEAD, then each fact on a line of its own ("path  /x").

    Why: whoever shows it bounds every line it quotes (launcher/excerpt.py cuts a long line in
    the middle). A path is as long as its owner made it; on the same line as a revision or a
    hash it pushed the one fact that tells two snapshots apart into the cut (a CI run's tmp path
    did). One fact per line, and no path can hide another."""
    width = max(map(len, facts), default=0)
    return "\n".join([head, *(f"  {k.replace('_', ' '):<{width}}  {v}" for k, v in facts.items())])


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Throttled:
    """Progress of one asset's transfer: plain lines for a person reading the log (one per file
    every 15 s, and one at 100%), and, inside a node.sh stage (REPRODUCE_STAGE), the protocol's
    progress line for the launcher's live bar and ETA (bytes of the whole asset, about once a
    second; launcher/plan/protocol.py). Called from several download threads at once."""

    def __init__(
        self,
        label: str,
        log: Log = stderr_log,
        every_s: float = 15.0,
        *,
        total: int | None = None,
        stage: str | None = None,
    ):
        self.label, self.log, self.every_s = label, log, every_s
        # when each file's last line was shown; absent: never (so its first line always is; a
        # start of 0.0 hid it on a node up for less than every_s: time.monotonic() counts from boot)
        self.last: dict[str, float] = {}
        self.started = time.monotonic()
        self.total = total  # the asset's bytes, when known before the first file
        self.stage = stage if stage is not None else os.environ.get("REPRODUCE_STAGE", "")
        self.files: dict[str, tuple[int, int]] = {}
        self.line_at: float | None = None  # the last progress line; None: none printed yet
        self.lock = threading.Lock()

    def __call__(self, name: str, done: int, total: int) -> None:
        with self.lock:
            now = time.monotonic()
            finished = total > 0 and done >= total
            self.files[name] = (done, total)
            if self.stage:
                self._progress_line(now)
            last = self.last.get(name)
            if not finished and last is not None and now - last < self.every_s:
                return
            self.last[name] = now
            pct = f" ({100 * done / total:.0f}%)" if total > 0 else ""
            self.log(f"{self.label}: {name}: {done / 1e6:.1f} of {max(total, 0) / 1e6:.1f} MB{pct}")

    def _progress_line(self, now: float) -> None:
        done = sum(d for d, _ in self.files.values())
        seen = sum(max(t, 0) for _, t in self.files.values())
        total = max(self.total or 0, seen, done)
        if done < total and self.line_at is not None and now - self.line_at < 1.0:
            return
        self.line_at = now
        item = f"{self.label}: {len(self.files)} file(s)"
        print(
            f"##reproduce progress stage={shlex.quote(self.stage)} done={done} total={total} "
            f"unit=bytes item={shlex.quote(item)}",
            file=sys.stderr,
            flush=True,
        )


# ------------------------------------------------------------------------------------------------
# Resolve


def open_spec_store(spec: dict[str, Any]) -> asset_store.Store | None:
    return asset_store.open_store(spec["store"]) if spec.get("store") else None


def cache_occupant(path: Path, want: dict[str, Any]) -> str | None:
    """What else a cache directory holds (None: nothing, or an unfinished fetch of this asset)."""
    manifest = asset_store.read_local_manifest(path)
    if manifest is not None:
        return None if manifest.get("asset") == want else occupant(manifest.get("asset"))
    pending = read_json(path / PENDING)
    if pending is not None:
        return None if pending == want else f"an unfinished fetch of {json.dumps(pending)}"
    legacy = read_json(path / ".reproduce-complete")  # fetch_assets.py's marker
    if legacy is not None:
        same = (legacy.get("repo"), legacy.get("revision")) == (
            want.get("repo"),
            want.get("revision"),
        )
        return None if same else f"{legacy.get('repo')}@{legacy.get('revision')} (fetch_assets)"
    if path.is_dir() and any(path.iterdir()):
        return "files no manifest describes"
    return None


def occupant(asset: Any) -> str:
    """Another asset's identity in a few words, its revision whole (the one fact a person needs
    to tell two snapshots apart), or its JSON when it is not one we know."""
    if isinstance(asset, dict) and asset.get("kind") == "hf-snapshot":
        only = f" (only {', '.join(map(str, asset['include']))})" if asset.get("include") else ""
        return f"{asset.get('repo_type')} {asset.get('repo')}@{asset.get('revision')}{only}"
    return json.dumps(asset, sort_keys=True)


def read_json(path: Path) -> dict[str, Any] | None:
    """A small JSON object of ours (a marker, a plan); None when absent, unsafe or damaged."""
    try:
        data = json.loads(safe_io.read_text(path, owned=True))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _cache_dir(asset: dict[str, Any], full: bool, threads: int) -> tuple[bool, str]:
    """(usable, what was found) for an asset cached as a directory with a manifest."""
    path = Path(asset["path"])
    want = identity(asset)
    other = cache_occupant(path, want)
    if other is not None:
        raise Failed(
            reason(
                f"asset {asset['name']}: its cache holds something else (nothing was overwritten)",
                path=str(path),
                holds=other,
                wanted=describe(asset),
                fix="remove it, or point the profile's assets path elsewhere",
            )
        )
    manifest = asset_store.read_local_manifest(path)
    if manifest is None:
        return False, "cache: " + ("partial" if path.exists() else "absent") + f" at {path}"
    bad = asset_store.verify_tree(path, manifest, full=full, threads=threads)
    if bad:
        return False, f"cache: {len(bad)} file(s) differ from its manifest ({bad[0]}) at {path}"
    return True, f"cache {path} ({len(manifest['files'])} files, sha256 " + (
        "checked)" if full else "not re-read: sizes only)"
    )


def _files_in(path: Path, files: dict[str, str]) -> bool:
    try:
        return all(asset_store.file_sha256(path / n, owned=True) == h for n, h in files.items())
    except OSError:  # absent, or not a regular file of ours
        return False


def _store_lists(store: asset_store.Store, key: str, want: dict[str, Any]) -> tuple[bool, str]:
    try:
        manifest = store.read_manifest(key)
    except StoreError as err:
        infra = "" if err.mismatch else " [store]"  # the marker ends the line (resolve)
        return False, f"store: {err} at {store.where(key)}{infra}"
    if manifest is None:
        return False, f"store: no manifest at {store.where(key)}"
    if manifest.get("asset") != want:
        return False, reason(
            "store: holds something else under this asset's key",
            path=store.where(key),
            holds=occupant(manifest.get("asset")),
            wanted=occupant(want),
        )
    pinned = want.get("parquet_sha256") if want.get("kind") == "rows" else None
    listed = {e["path"]: e["sha256"] for e in manifest["files"]}
    if pinned and listed.get("rows.parquet") != pinned:  # the recipe's pin, not the store's word
        return False, reason(
            "store: its rows.parquet differs from the recipe's pin",
            path=store.where(key),
            sha256=str(listed.get("rows.parquet")),
            pinned=pinned,
        )
    return (
        True,
        f"store {store.where(key)} ({len(manifest['files'])} files, "
        f"{manifest['total_bytes']} bytes)",
    )


def _store_has_files(store: asset_store.Store, key: str, files: dict[str, str]) -> tuple[bool, str]:
    try:
        manifest = store.read_manifest(key)
    except StoreError as err:
        infra = "" if err.mismatch else " [store]"  # the marker ends the line (resolve)
        return False, f"store: {err} at {store.where(key)}{infra}"
    if manifest is None:
        return False, f"store: no manifest at {store.where(key)}"
    listed = {e["path"]: e["sha256"] for e in manifest["files"]}
    wrong = [n for n, h in files.items() if listed.get(n) != h]
    if wrong:
        return (
            False,
            f"store: does not list {', '.join(wrong)} with the pinned sha256 at {store.where(key)}",
        )
    return True, f"store {store.where(key)}"


def _hub_check(
    asset: dict[str, Any], cand: dict[str, str], token: str | None
) -> tuple[bool, str, int]:
    """Whether the Hub can supply the asset from candidate (repo, revision), and its bytes."""
    where = f"Hub {hf_hub.endpoint()} {cand['repo_type']} {cand['repo']}@{cand['revision'][:12]}"
    try:
        info = hf_hub.repo_info(cand["repo"], cand["revision"], cand["repo_type"], token)
        if hf_hub.COMMIT_RE.fullmatch(cand["revision"]) and info.commit != cand["revision"]:
            return False, f"{where}: the Hub answers with commit {info.commit}", 0
        if asset["kind"] == "hf-files":
            listed = {f.path: f for f in info.files}
            missing = [n for n in asset["files"] if n not in listed]
            if missing:
                return False, f"{where}: no {', '.join(missing)} at this revision", 0
            for n, h in asset["files"].items():
                lfs = listed[n].sha256
                if lfs and lfs != h:
                    return (
                        False,
                        reason(f"{where}: {n} differs from the recipe's pin", sha256=lfs, pinned=h),
                        0,
                    )
            chosen = [listed[n] for n in asset["files"]]
        else:
            chosen = info.select(asset.get("include"))
            if not chosen:
                return False, f"{where}: no file matches {asset.get('include')}", 0
        if info.gated and not token:
            return False, f"{where}: gated repository and no HF_TOKEN", 0
        hf_hub.check_access(info, min(chosen, key=lambda f: f.size).path, token)
    except hf_hub.HubError as err:
        return (
            False,
            f"Hub {hf_hub.endpoint()}: {hf_hub.redact(str(err), token)}"
            + (" [network]" if err.unreachable else " [hub]" if err.infra else ""),
            0,
        )
    total = sum(max(f.size, 0) for f in chosen)
    return True, f"{where} ({len(chosen)} files, {total} bytes)", total


def _resolve_one(
    asset: dict[str, Any],
    by_name: dict[str, dict[str, Any]],
    store: asset_store.Store | None,
    full: bool,
    threads: int,
    token: str | None,
    known: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    tried: list[str] = []
    result: dict[str, Any] = {"source": None, "path": asset["path"], "tried": tried}

    def done(source: str, detail: str, **extra: Any) -> dict[str, Any]:
        result.update(source=source, detail=detail, **extra)
        return result

    kind = asset["kind"]
    if kind == "rows":
        path = Path(asset["path"])
        want = asset.get("parquet_sha256")
        if os.path.lexists(str(path)):
            try:
                got = asset_store.file_sha256(path, owned=True)
            except OSError as err:
                raise Failed(
                    reason(
                        "asset rows: its cache cannot be read (nothing was overwritten)",
                        path=str(path),
                        error=str(err),
                        fix="remove it, or set assets.sft_data elsewhere",
                    )
                ) from None
            if want is None:
                return done("cache", f"cache {path} (the recipe pins no parquet_sha256)")
            if got == want:
                return done("cache", f"cache {path} (sha256 {want[:12]}... checked)")
            raise Failed(
                reason(
                    "asset rows: its cache differs from the recipe's pin (nothing was overwritten)",
                    path=str(path),
                    sha256=got,
                    pinned=f"{want} ({asset.get('field', 'parquet_sha256')})",
                    fix="remove it, or set assets.sft_data elsewhere",
                )
            )
        tried.append(f"cache: absent at {path}")
        if store is not None and want:
            ok, what = _store_lists(store, store_key(asset), identity(asset))
            tried.append(what)
            if ok:
                return done("store", what, key=store_key(asset))
        if asset.get("build_problem"):
            tried.append(f"build: {asset['build_problem']}")
            return result
        inputs = [by_name.get("tokenizer"), by_name.get("dataset")]
        if None in inputs:
            tried.append("build: the spec has no tokenizer or dataset asset")
            return result
        sub = {
            a["name"]: _resolve_one(a, by_name, store, full, threads, token) for a in inputs if a
        }
        result["inputs"] = sub
        bad = [n for n, r in sub.items() if r["source"] is None]
        if bad:
            tried.append(f"build: cannot get {', '.join(bad)} (below)")
            return result
        return done(
            "build", "build from " + " and ".join(f"{n} ({r['source']})" for n, r in sub.items())
        )

    if kind in ("hf-snapshot", "converted"):
        ok, what = _cache_dir(asset, full, threads)
        tried.append(what)
        if ok:
            return done("cache", what, verified="full" if full else "sizes")
    elif kind == "hf-files":
        path = Path(asset["path"])
        if _files_in(path, asset["files"]):
            return done("cache", f"cache {path} (sha256 checked)")
        tried.append(f"cache: the pinned files are not all there at {path}")
        ckpt = by_name.get("hf_ckpt")
        if ckpt and _files_in(Path(ckpt["path"]), asset["files"]):
            return done(
                "cache", f"cache {ckpt['path']} (hf_ckpt; sha256 checked)", copy_from=ckpt["path"]
            )
        if ckpt:
            tried.append(f"cache (hf_ckpt): not there with the pinned sha256 at {ckpt['path']}")

    if store is not None:
        if kind == "hf-files":
            ok, what = _store_has_files(store, store_key(asset), asset["files"])
            tried.append(what)
            if ok:
                return done("store", what, key=store_key(asset), asset_identity=identity(asset))
            ckpt = by_name.get("hf_ckpt")
            if ckpt:
                ok, what = _store_has_files(store, store_key(ckpt), asset["files"])
                tried.append(what + " (hf_ckpt)")
                if ok:
                    return done("store", what, key=store_key(ckpt), asset_identity=identity(ckpt))
        else:
            ok, what = _store_lists(store, store_key(asset), identity(asset))
            tried.append(what)
            if ok:
                return done("store", what, key=store_key(asset))
    else:
        tried.append("store: none configured")

    if kind == "converted":
        src = by_name.get(asset["identity"].get("from_asset", "hf_ckpt"))
        if src is None:
            tried.append("convert: the spec has no hf_ckpt asset")
            return result
        sub = (known or {}).get(src["name"]) or _resolve_one(
            src, by_name, store, full, threads, token
        )
        if sub["source"] is None:
            tried.append("convert: hf_ckpt cannot be supplied")
            return result
        return done("convert", f"convert {src['name']} ({sub['source']}) on the GPUs")

    for cand in asset_spec.hub_candidates(asset):
        ok, what, total = _hub_check(asset, cand, token)
        tried.append(what)
        if ok:
            return done("hub", what, hub=cand, bytes=total)
    if not asset_spec.hub_candidates(asset):
        tried.append("Hub: the spec names no repo for it")
    return result


def resolve(spec: dict[str, Any], *, full: bool = True, threads: int = 8) -> dict[str, Any]:
    """Where every asset will come from; never downloads an asset's bytes."""
    by_name = asset_spec.assets_by_name(spec)
    store = open_spec_store(spec)
    token = hf_hub.token_from_env()
    plan: dict[str, Any] = {"format": PLAN_FORMAT, "store": spec.get("store"), "assets": {}}
    problems: list[str] = []
    infra = False
    for name in ("rows", "hf_ckpt", "torch_dist"):
        asset = by_name.get(name)
        if asset is None:
            continue
        try:
            res = _resolve_one(asset, by_name, store, full, threads, token, plan["assets"])
        except Failed as err:
            res = {"source": None, "path": asset["path"], "tried": [str(err)]}
        plan["assets"][name] = res
        subs = res.pop("inputs", {})
        plan["assets"].update(subs)
        if res["source"] is None:
            problems.append(_explain(asset, res))
            tried = res["tried"] + [t for sub in subs.values() for t in sub["tried"]]
            infra = infra or any(t.endswith(("[network]", "[hub]", "[store]")) for t in tried)
    for name in ("tokenizer", "dataset"):
        if name in by_name and name not in plan["assets"]:
            plan["assets"][name] = {
                "source": "not-needed",
                "path": by_name[name]["path"],
                "tried": [],
            }
    for name in ("tokenizer", "dataset"):
        res = plan["assets"].get(name)
        if res is not None and res["source"] is None:
            problems.append(_explain(by_name[name], res))
    plan["ok"] = not problems
    plan["problems"] = problems
    plan["infra"] = infra
    return plan


def _explain(asset: dict[str, Any], res: dict[str, Any]) -> str:
    """What cannot be supplied, then each place tried on a line of its own: a reader that bounds
    every line it quotes (launcher/excerpt.py) then cuts a long path, never the reason."""
    field = f" ({asset['field']})" if asset.get("field") else ""
    head = f"asset {asset['name']}{field}: {describe(asset)} cannot be supplied; tried:"
    lines = [head]
    for t in res["tried"]:
        first, *rest = t.splitlines() or [""]
        lines += [f"  - {first}", *(f"    {r}" for r in rest)]
    return "\n".join(lines)
