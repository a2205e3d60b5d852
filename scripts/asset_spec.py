#!/usr/bin/env python3
"""A run's asset spec: what each asset is, where it is cached on the node, its key in the store.

The launcher writes the spec (launcher/plan/asset_spec.py, from the recipe and the profile) as JSON;
the node programs (node_assets.py) and `reproduce prepare` read it through this module, so an
asset's identity and its store key are defined here once. Never imports `launcher`.

    {"format": "reproduce-asset-spec/1", "store": null | "s3://BUCKET/PREFIX" | "/dir",
     "assets": [{"name": "tokenizer" | "dataset" | "rows" | "hf_ckpt" | "torch_dist",
                 "kind": "hf-files" | "hf-snapshot" | "rows" | "converted",
                 "path": cache location on the node, "field": the recipe field it comes from,
                 ...kind-specific fields, see docs/assets.md}]}
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

SPEC_FORMAT = "reproduce-asset-spec/1"
NAMES = ("tokenizer", "dataset", "rows", "hf_ckpt", "torch_dist")
KINDS = {
    "tokenizer": "hf-files",
    "dataset": "hf-snapshot",
    "rows": "rows",
    "hf_ckpt": "hf-snapshot",
    "torch_dist": "converted",
}
HEX64 = re.compile(r"[0-9a-f]{64}")
REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


class SpecError(Exception):
    """The spec is malformed (exit 2)."""


def slug(repo: str) -> str:
    return repo.replace("/", "--")


def _short_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def identity(asset: dict[str, Any]) -> dict[str, Any]:
    """What the asset IS, independent of where it sits; a manifest records it, and a cache or
    store entry whose manifest records something else is never used for this asset."""
    kind = asset["kind"]
    if kind == "hf-snapshot":
        return {
            "kind": kind,
            "repo_type": asset["repo_type"],
            "repo": asset["repo"],
            "revision": asset["revision"],
            "include": sorted(asset["include"]) if asset.get("include") else None,
        }
    if kind == "hf-files":
        return {"kind": kind, "files": dict(sorted(asset["files"].items()))}
    if kind == "rows":
        return {"kind": kind, "parquet_sha256": asset["parquet_sha256"]}
    if kind == "converted":
        return {"kind": kind, **asset["identity"]}
    raise SpecError(f"asset {asset.get('name')}: unknown kind {kind!r}")


def store_key(asset: dict[str, Any]) -> str:
    """Where the asset lives in a store, relative to the store's URL (docs/assets.md)."""
    kind = asset["kind"]
    if kind == "hf-snapshot":
        key = f"hf/{asset['repo_type']}s/{slug(asset['repo'])}@{asset['revision']}"
        return key + (
            f".only-{_short_hash(sorted(asset['include']))}" if asset.get("include") else ""
        )
    if kind == "hf-files":
        return f"files/{_short_hash(identity(asset)['files'])}"
    if kind == "rows":
        return f"rows/{asset['parquet_sha256']}"
    if kind == "converted":
        src = asset["identity"]["from"]
        return f"torch_dist/{slug(src['repo'])}@{src['revision']}/{_short_hash(identity(asset))}"
    raise SpecError(f"asset {asset.get('name')}: unknown kind {kind!r}")


def hub_candidates(asset: dict[str, Any]) -> list[dict[str, str]]:
    """(repo, revision, repo_type) the asset may come from on the Hub, in the order tried."""
    if asset["kind"] == "hf-snapshot":
        return [
            {"repo": asset["repo"], "revision": asset["revision"], "repo_type": asset["repo_type"]}
        ]
    if asset["kind"] == "hf-files":
        return [dict(c, repo_type=c.get("repo_type", "model")) for c in asset.get("sources") or []]
    return []


def _check(asset: dict[str, Any]) -> None:
    name = asset.get("name")
    if name not in NAMES:
        raise SpecError(f"asset {name!r}: expected one of {', '.join(NAMES)}")
    if asset.get("kind") != KINDS[name]:
        raise SpecError(f"asset {name}: kind {asset.get('kind')!r}, expected {KINDS[name]}")
    if not isinstance(asset.get("path"), str) or not asset["path"].startswith("/"):
        raise SpecError(f"asset {name}: path must be an absolute path")
    kind = asset["kind"]
    if kind == "hf-snapshot":
        if not REPO.fullmatch(str(asset.get("repo"))) or not asset.get("revision"):
            raise SpecError(f"asset {name}: needs repo (OWNER/NAME) and revision")
        if asset.get("repo_type") not in ("model", "dataset"):
            raise SpecError(f"asset {name}: repo_type must be model or dataset")
    elif kind == "hf-files":
        files = asset.get("files")
        if not isinstance(files, dict) or not files:
            raise SpecError(f"asset {name}: needs files {{name: sha256}}")
        for f, h in files.items():
            if not HEX64.fullmatch(str(h)) or "/" in f or f.startswith("."):
                raise SpecError(f"asset {name}: {f}: expected a plain file name and 64 hex")
        for c in asset.get("sources") or []:
            if not REPO.fullmatch(str(c.get("repo"))) or not c.get("revision"):
                raise SpecError(f"asset {name}: a source needs repo and revision: {c!r}")
    elif kind == "rows":
        if asset.get("parquet_sha256") is not None and not HEX64.fullmatch(
            str(asset["parquet_sha256"])
        ):
            raise SpecError(f"asset {name}: parquet_sha256 must be 64 hex")
    elif kind == "converted":
        src = (asset.get("identity") or {}).get("from") or {}
        if not src.get("repo") or not src.get("revision"):
            raise SpecError(f"asset {name}: identity.from needs repo and revision")


def load_spec(path: Path) -> dict[str, Any]:
    try:
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SpecError(f"--spec {path}: {err}") from None
    if not isinstance(spec, dict) or spec.get("format") != SPEC_FORMAT:
        raise SpecError(f"--spec {path}: not a {SPEC_FORMAT} document")
    assets = spec.get("assets")
    if not isinstance(assets, list):
        raise SpecError(f"--spec {path}: no asset list")
    seen = set()
    for a in assets:
        if not isinstance(a, dict):
            raise SpecError(f"--spec {path}: an asset is not an object")
        _check(a)
        if a["name"] in seen:
            raise SpecError(f"--spec {path}: asset {a['name']} twice")
        seen.add(a["name"])
    return spec


def assets_by_name(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in spec["assets"]}


def describe(asset: dict[str, Any]) -> str:
    kind = asset["kind"]
    if kind == "hf-snapshot":
        only = f" (only {', '.join(asset['include'])})" if asset.get("include") else ""
        return f"{asset['repo_type']} {asset['repo']}@{asset['revision'][:12]}{only}"
    if kind == "hf-files":
        return f"{', '.join(sorted(asset['files']))}"
    if kind == "rows":
        return f"rows parquet sha256 {str(asset.get('parquet_sha256'))[:12]}"
    src = asset["identity"]["from"]
    return f"converted {src['repo']}@{src['revision'][:12]}"
