#!/usr/bin/env python3
"""The Hub's pins of a snapshot at its pinned commit, and the one check of a store's copy against
them (docs/architecture.md, "The trust boundary"; docs/assets.md, "What is verified where").

Why: a store has other writers, and its manifest says which bytes the store holds, not which
bytes the Hub has. A snapshot (a checkpoint, a dataset) taken from a store is therefore trusted
file by file against the Hub's listing of the commit the recipe pins, and nothing else:

- the store's manifest must name exactly the files the listing names (a file the listing does not
  name, or one it names that the manifest lacks, refuses the snapshot), with the listing's sizes,
  and each LFS file with the listing's sha256; checked before any byte is fetched;
- each file's bytes, hashed as they arrive (store_base.Digest: one pass, no second read), must be
  the listing's: an LFS file by its sha256, every other file (config.json, the tokenizer's files,
  anything kept in git) by its git blob id, sha1 of "blob <size>\\0" + bytes; before the file
  takes its name. A file the listing gives neither hash for cannot be checked, and is refused.

The listing is the live one when the Hub answers. When it gives no answer at all (refused, DNS,
a timeout: hf_hub.KINDS' one "unreachable" kind), the listing recorded beside
the snapshot when it was downloaded from the Hub (`hub_listing` in the store's manifest) stands in
for it: that record lives in the store, so it keeps out a damaged or half-replaced copy, not a
writer of the store who rewrites the record too (docs/architecture.md says so). A manifest of an
older reproduce records only the LFS sha256 (`hub_lfs_sha256`), which cannot check the other
files: it is refused, with a message saying to prepare the store again. Any answer of the Hub
is never read as its absence: a missing revision, a 401 or 403 (the token), a 429 or 5xx after
hf_hub's bounded retries, a 200 that is not a listing, each refuses the store's copy, since the
record is the store's own word and a store writer could have rewritten it with the bytes.

Standard library only; python 3.8; never imports `launcher`. Used by node_assets.py (the record,
when a snapshot comes from the Hub) and asset_trust.py (the check, when it comes from a store).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Sequence

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # siblings import by name, also when loaded by path

import hf_hub  # noqa: E402 (after the sys.path line above)
from asset_resolve import Failed, Log, stderr_log  # noqa: E402
from store_base import Digest  # noqa: E402

RECORD = "hub_listing"  # the store manifest's key for the recorded listing
OLD_RECORD = "hub_lfs_sha256"  # an older reproduce's record: LFS files only
_SHA256 = re.compile(r"[0-9a-f]{64}")
_BLOB = re.compile(r"[0-9a-f]{40}")


def _hex(value: Any, pattern: re.Pattern[str]) -> str | None:
    """VALUE as a lower-case hash of PATTERN's shape, else None (a listing's odd value pins
    nothing, so the file it belongs to is refused as unchecked, never waved through)."""
    text = str(value).lower() if isinstance(value, str) else ""
    return text if pattern.fullmatch(text) else None


class Pin:
    """One file of the listing: its size (-1: not listed), its LFS sha256 or None, its git blob
    id or None (an LFS file's is its pointer's, never compared with the content)."""

    def __init__(self, size: int, sha256: str | None, blob_id: str | None):
        self.size = size
        self.sha256 = sha256
        self.blob_id = blob_id


class HubPins:
    """The Hub's listing of one snapshot at its commit, as the checks a store's copy must pass
    (store_base.Pins: asset_store.fetch runs them where the bytes arrive). HOW says where the
    listing came from, in every message."""

    def __init__(self, files: dict[str, Pin], how: str, kept: dict[str, Any] | None = None):
        self.files = files
        self.how = how
        self.kept = kept or {}

    @classmethod
    def of_listing(cls, remote: Sequence[hf_hub.RemoteFile], how: str) -> HubPins:
        return cls(
            {f.path: Pin(f.size, _hex(f.sha256, _SHA256), _hex(f.blob_id, _BLOB)) for f in remote},
            how,
        )

    def check_manifest(self, manifest: dict[str, Any]) -> list[str]:
        """Every way the store's manifest differs from the listing (empty: none): a file only
        one of them names, a size, an LFS sha256, a file the listing gives no hash for."""
        listed = {str(e["path"]): e for e in manifest.get("files") or []}
        wrong = [
            f"{p}: the store's manifest lists it, the Hub's listing does not"
            for p in sorted(set(listed) - set(self.files))
        ]
        wrong += [
            f"{p}: the Hub lists it, the store's manifest does not"
            for p in sorted(set(self.files) - set(listed))
        ]
        for p in sorted(set(listed) & set(self.files)):
            pin, e = self.files[p], listed[p]
            if pin.size >= 0 and e.get("bytes") != pin.size:
                wrong.append(
                    f"{p}: the store's manifest says {e.get('bytes')} bytes, the Hub {pin.size}"
                )
            elif pin.sha256 and e.get("sha256") != pin.sha256:
                wrong.append(
                    f"{p}: the store's manifest says sha256 {e.get('sha256') or 'nothing'}, "
                    f"the Hub {pin.sha256}"
                )
            elif not pin.sha256 and not pin.blob_id:
                wrong.append(f"{p}: the Hub lists neither an LFS sha256 nor a git blob id for it")
        return wrong

    def wants_blob(self, path: str) -> bool:
        pin = self.files.get(path)
        return pin is not None and not pin.sha256

    def check(self, path: str, digest: Digest) -> str | None:
        """None when the bytes hashed into DIGEST are the listed file PATH, else what differs."""
        pin = self.files.get(path)
        if pin is None:
            return "the Hub's listing does not name it"
        if pin.sha256:
            if digest.sha256 == pin.sha256:
                return None
            return f"sha256 {digest.sha256}, the Hub lists {pin.sha256}"
        if pin.blob_id is None or digest.blob_id is None:
            return "no git blob id to compare (the file cannot be checked)"
        if digest.blob_id == pin.blob_id:
            return None
        return f"git blob {digest.blob_id}, the Hub lists {pin.blob_id}"


def pins_record(commit: str, chosen: Sequence[hf_hub.RemoteFile]) -> dict[str, Any]:
    """What a snapshot's manifest keeps of the Hub's listing when it was downloaded from the Hub
    (`RECORD`): every file's size, LFS sha256 and git blob id, and the commit."""
    return {
        "commit": commit,
        "files": {
            f.path: {"bytes": f.size, "sha256": f.sha256, "blob_id": f.blob_id} for f in chosen
        },
    }


def records(commit: str, chosen: Sequence[hf_hub.RemoteFile]) -> dict[str, Any]:
    """The manifest's keys that record the listing: RECORD, and the LFS-only OLD_RECORD an older
    reproduce reads."""
    return {
        RECORD: pins_record(commit, chosen),
        OLD_RECORD: {f.path: f.sha256 for f in chosen if f.sha256},
    }


def recorded(asset: dict[str, Any], manifest: dict[str, Any], err: hf_hub.HubError) -> HubPins:
    """The listing recorded in the store's manifest, standing in for the Hub that did not answer
    (ERR); Failed when there is none this launcher can check every file against."""
    name, infra = asset["name"], err.infra
    rec = manifest.get(RECORD)
    if not isinstance(rec, dict):
        if manifest.get(OLD_RECORD):
            raise Failed(
                f"asset {name}: the Hub cannot be reached ({err}), and the store's manifest "
                f"records only the Hub's LFS sha256 ({OLD_RECORD}, written by an older "
                "reproduce): its other files (config, tokenizer) cannot be checked. Prepare the "
                "store again with the Hub reachable (`reproduce prepare`), or let this node "
                "reach the Hub; nothing was fetched",
                infra=infra,
            )
        raise Failed(
            f"asset {name}: the Hub cannot be reached ({err}), and the store's manifest records "
            "no listing of the Hub to check its files against; nothing was fetched",
            infra=infra,
        )
    files = rec.get("files")
    if rec.get("commit") != asset["revision"] or not isinstance(files, dict) or not files:
        raise Failed(
            f"asset {name}: the Hub cannot be reached ({err}), and the listing recorded in the "
            f"store's manifest is not one of commit {asset['revision']}; nothing was fetched"
        )
    pins = {}
    for path, f in files.items():
        f = f if isinstance(f, dict) else {}
        size = f.get("bytes")
        pins[str(path)] = Pin(
            size if isinstance(size, int) and not isinstance(size, bool) else -1,
            _hex(f.get("sha256"), _SHA256),
            _hex(f.get("blob_id"), _BLOB),
        )
    return HubPins(
        pins, "the Hub's listing recorded by prepare (the Hub is not reachable from here)"
    )


def for_snapshot(asset: dict[str, Any], manifest: dict[str, Any], log: Log = stderr_log) -> HubPins:
    """The pins a snapshot from the store is checked against: the Hub's live listing of the
    pinned commit (the asset's include patterns, as the download selects them), else the
    listing recorded in MANIFEST (`recorded`)."""
    rev = asset["revision"]
    try:
        info = hf_hub.repo_info(
            asset["repo"], rev, asset.get("repo_type", "model"), hf_hub.token_from_env()
        )
        chosen = info.select(asset.get("include"))
        pins = HubPins.of_listing(chosen, f"the Hub's listing of {asset['repo']}@{rev[:12]}")
        pins.kept = records(info.commit, chosen)
    except hf_hub.HubError as err:
        if not err.unreachable:
            raise Failed(
                f"asset {asset['name']}: the Hub answered, but not with the listing of "
                f"{asset['repo']}@{rev[:12]}: {err}. The store's copy is not taken: the listing "
                "recorded in the store stands in only when the Hub cannot be reached at all; "
                "nothing was fetched",
                infra=err.infra,
            ) from None
        pins = recorded(asset, manifest, err)
    log(f"{asset['name']}: every one of {len(pins.files)} file(s) is checked against {pins.how}")
    return pins
