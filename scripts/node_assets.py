#!/usr/bin/env python3
"""A run's assets on the node, cheapest first: resolve every source before anything costly, then
fetch, build, seal and push.

Runs on the node's host python3 (standard library; S3 through the `aws` CLI or boto3) and inside
the training image for `build-rows`; never imports `launcher`. The launcher writes the spec
(asset_spec.py); docs/assets.md has the whole story, and which stage runs which command.

    node_assets.py resolve --spec SPEC [--out PLAN] [--verify full|sizes]
        where each asset will come from: cache (its manifest's sha256s check out), store (its
        manifest lists it), hub (the Hub lists it at that revision, readable with this token),
        build (rows: from the tokenizer and dataset), convert (torch_dist: from hf_ckpt on the
        GPUs), or not-needed. Exit 1, naming the asset and every source tried, when one cannot
        be supplied; 3 when the reason is a network or store failure.
    node_assets.py fetch --spec SPEC --plan PLAN NAME...   (rows = what the rows need)
    node_assets.py build-rows --spec SPEC --plan PLAN [--out DIR]   (in the image; no network)
    node_assets.py adopt --spec SPEC NAME --from DIR       (what a container made, checked on
                                                            the host, into the cache)
    node_assets.py source --plan PLAN NAME                 (prints the planned source word)
    node_assets.py seal --spec SPEC NAME                   (a manifest for what the node made)
    node_assets.py push --spec SPEC NAME                   (cache -> store, manifest last)
    node_assets.py verify --spec SPEC NAME

A container never writes the cache (docs/architecture.md, "The trust boundary"): the rows build
and the conversion write into a fresh, empty directory of their own (`--out`, `--save`), and
`adopt` checks it on the host (no links, regular files of ours; the rows against the recipe's
parquet_sha256) before it moves it into the cache.

Exit codes: 0 done, 1 an asset cannot be supplied or a hash differs, 2 bad arguments or spec,
3 the network, the store or the disk failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # siblings import by name, also when loaded by path

import asset_spec  # noqa: E402 (after the sys.path line above)
import asset_store  # noqa: E402
import hf_hub  # noqa: E402
import hub_pins  # noqa: E402
import safe_io  # noqa: E402
from asset_resolve import (  # noqa: E402
    PENDING,
    PLAN_FORMAT,
    Failed,
    Log,
    Throttled,
    cache_occupant,
    open_spec_store,
    read_json,
    resolve,
    stderr_log,
)
from asset_spec import SpecError, describe, identity, store_key  # noqa: E402
from asset_store import StoreError  # noqa: E402
from asset_trust import (  # noqa: E402
    BUILD_SUMMARY,
    ROWS_STORE_FILE,
    _check_rows_pin,
    adopt,
    check_against_hub,
)

# ------------------------------------------------------------------------------------------------
# Fetch


def hub_fetch(
    asset: dict[str, Any],
    cand: dict[str, str],
    *,
    threads: int = 8,
    log: Log = stderr_log,
    progress: hf_hub.Progress | None = None,
) -> dict[str, Any]:
    """The asset from the Hub into its cache directory, every file checked against the Hub's
    listing (LFS sha256, git blob id) and, for pinned files, against the recipe's sha256."""
    token = hf_hub.token_from_env()
    dest = Path(asset["path"])
    want = identity(asset)
    other = cache_occupant(dest, want)
    if other is not None:
        raise Failed(f"asset {asset['name']}: {dest} holds {other}; nothing was overwritten")
    try:
        info = hf_hub.repo_info(cand["repo"], cand["revision"], cand["repo_type"], token)
    except hf_hub.HubError as err:
        raise Failed(f"asset {asset['name']}: {err}", infra=err.infra) from None
    if asset["kind"] == "hf-files":
        listed = {f.path: f for f in info.files}
        chosen = [listed[n] for n in asset["files"] if n in listed]
        if len(chosen) != len(asset["files"]):
            raise Failed(f"asset {asset['name']}: the Hub no longer lists every pinned file")
    else:
        chosen = info.select(asset.get("include"))
    safe_io.make_dirs(dest, base=dest.parent)
    safe_io.write_atomic(dest / PENDING, (json.dumps(want, sort_keys=True) + "\n").encode())
    progress = progress or Throttled(asset["name"], log, total=sum(max(f.size, 0) for f in chosen))
    known: dict[str, str] = {}

    def one(remote: hf_hub.RemoteFile) -> str:
        target = dest / remote.path
        if os.path.lexists(str(target)) and hf_hub.verify_remote(target, remote) is None:
            state = "kept"
            progress(remote.path, max(remote.size, 0), max(remote.size, 0))  # already here
        else:
            hf_hub.download(info, remote, target, token, progress=progress, log=log, base=dest)
            state = "downloaded"
        if remote.sha256:
            known[remote.path] = remote.sha256
        return state

    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            states = list(pool.map(one, chosen))
    except hf_hub.HubError as err:
        raise Failed(f"asset {asset['name']}: {err}", infra=err.infra) from None
    manifest = asset_store.make_manifest(
        dest,
        want,
        files=[f.path for f in chosen],
        known=known,
        origin=f"{hf_hub.endpoint()} {cand['repo_type']} {cand['repo']}@{info.commit}",
        threads=threads,
    )
    # the Hub's listing at this commit (every file's LFS sha256 or git blob id): a node that later
    # takes this asset from the store checks the store's files against it when it cannot reach
    # the Hub (hub_pins.py); the LFS-only record is kept for an older reproduce reading the store
    manifest.update(hub_pins.records(info.commit, chosen))
    if asset["kind"] == "hf-files":
        got = {e["path"]: e["sha256"] for e in manifest["files"]}
        wrong = [
            f"{n}: sha256 {got[n]}, pinned {h}" for n, h in asset["files"].items() if got[n] != h
        ]
        if wrong:
            raise Failed(
                f"asset {asset['name']} from {manifest['origin']}: {'; '.join(wrong)} "
                f"(pinned by {asset.get('field', 'the recipe')})"
            )
    asset_store.write_local_manifest(dest, manifest)
    os.unlink(str(dest / PENDING))
    log(
        f"{asset['name']}: {states.count('downloaded')} file(s) downloaded, "
        f"{states.count('kept')} already there, from {manifest['origin']}; every file checked"
    )
    return manifest


def fetch_asset(
    spec: dict[str, Any],
    plan: dict[str, Any],
    name: str,
    *,
    threads: int = 8,
    log: Log = stderr_log,
    progress: hf_hub.Progress | None = None,
) -> str:
    """Carry out the plan for one asset (rows: what the rows need). Returns what was done."""
    by_name = asset_spec.assets_by_name(spec)
    asset = by_name[name]
    step = plan["assets"].get(name) or {}
    source = step.get("source")
    if source is None:
        raise Failed(f"asset {name}: the plan has no source for it; run resolve first")
    if name == "rows" and source == "build":
        for sub in ("tokenizer", "dataset"):
            fetch_asset(spec, plan, sub, threads=threads, log=log, progress=progress)
        return "inputs fetched"
    if source in ("not-needed", "build", "convert"):
        log(f"{name}: {source}; nothing to fetch")
        return source
    if source == "cache":
        return _use_cache(asset, step, threads, log)
    if source == "hub":
        hub_fetch(asset, step["hub"], threads=threads, log=log, progress=progress)
        return "hub"
    store = open_spec_store(spec)
    if source != "store" or store is None:
        raise Failed(f"asset {name}: unknown source {source!r} in the plan")
    progress = progress or Throttled(name, log)
    try:
        if asset["kind"] == "rows":
            tmp = Path(asset["path"]).with_name(f".{Path(asset['path']).name}.fetch")
            asset_store.fetch(
                store, step["key"], tmp, identity(asset), threads=1, progress=progress, log=log
            )
            _check_rows_pin(tmp / ROWS_STORE_FILE, asset, store.where(step["key"]))
            os.replace(tmp / ROWS_STORE_FILE, asset["path"])
            shutil.rmtree(tmp, ignore_errors=True)
        elif asset["kind"] == "hf-files":
            dest = Path(asset["path"])
            asset_store.fetch(
                store,
                step["key"],
                dest,
                step["asset_identity"],
                only=list(asset["files"]),
                threads=threads,
                progress=progress,
                log=log,
            )
            _seal_files(asset, origin=store.where(step["key"]))
        else:
            dest = Path(asset["path"])
            other = cache_occupant(dest, identity(asset))
            if other is not None:
                raise Failed(f"asset {name}: {dest} holds {other}; nothing was overwritten")
            pins = None
            if asset["kind"] == "hf-snapshot":
                pins = check_against_hub(asset, store, step["key"], log)
            asset_store.fetch(
                store,
                step["key"],
                dest,
                identity(asset),
                pins=pins,
                threads=threads,
                progress=progress,
                log=log,
            )
            (dest / PENDING).unlink(missing_ok=True)
    except StoreError as err:
        raise Failed(f"asset {name}: {err}", infra=not err.mismatch) from None
    return "store"


def _use_cache(asset: dict[str, Any], step: dict[str, Any], threads: int, log: Log) -> str:
    if step.get("copy_from"):  # tokenizer files found in the checkpoint's cache: copy them
        dest = Path(asset["path"])
        safe_io.make_dirs(dest, base=dest.parent)
        for n in asset["files"]:
            data = safe_io.read_bytes(Path(step["copy_from"]) / n, owned=True, limit=1 << 30)
            safe_io.write_atomic(dest / n, data)
        _seal_files(asset, origin=f"cache {step['copy_from']}")
        return "cache"
    if asset["kind"] in ("hf-snapshot", "converted") and step.get("verified") != "full":
        path = Path(asset["path"])
        manifest = asset_store.read_local_manifest(path)
        bad = (
            ["no manifest"]
            if manifest is None
            else asset_store.verify_tree(path, manifest, threads=threads)
        )
        if bad:
            raise Failed(f"asset {asset['name']}: {path} changed since resolve ({bad[0]})")
    log(f"{asset['name']}: cache {asset['path']} (verified)")
    return "cache"


def _seal_files(asset: dict[str, Any], origin: str) -> None:
    dest = Path(asset["path"])
    manifest = asset_store.make_manifest(
        dest, identity(asset), files=list(asset["files"]), origin=origin
    )
    got = {e["path"]: e["sha256"] for e in manifest["files"]}
    wrong = [n for n, h in asset["files"].items() if got[n] != h]
    if wrong:
        raise Failed(
            f"asset {asset['name']}: {', '.join(wrong)} from {origin}: sha256 differs from the pin"
        )
    asset_store.write_local_manifest(dest, manifest)


# ------------------------------------------------------------------------------------------------
# Rows, seal, push


def build_rows(
    spec: dict[str, Any],
    plan: dict[str, Any],
    *,
    encoder: str | None = None,
    log: Log = stderr_log,
    out_dir: Path | None = None,
) -> dict[str, Any] | None:
    """Build the rows from the cached tokenizer and dataset (no network), checked against the
    recipe's hashes before they take $SFT_DATA's name. None when the plan does not build them.
    OUT_DIR (a container's build): the rows and their summary go there, into an empty directory
    of the build's own, for the host to `adopt`; the cache is read-only to it."""
    by_name = asset_spec.assets_by_name(spec)
    rows = by_name["rows"]
    if (plan["assets"].get("rows") or {}).get("source") != "build":
        log(f"rows: {(plan['assets'].get('rows') or {}).get('source')}; nothing to build")
        return None
    tok, data = by_name["tokenizer"], by_name["dataset"]
    origins = {}
    for a in (tok, data):
        manifest = asset_store.read_local_manifest(Path(a["path"]))
        if manifest is None or manifest.get("asset") != identity(a):
            raise Failed(f"asset {a['name']}: {a['path']} is not fetched (run fetch rows first)")
        if a is tok:
            bad = asset_store.verify_tree(Path(a["path"]), manifest)
            if bad:
                raise Failed(f"asset tokenizer: {bad[0]}")
        origins[a["name"]] = manifest.get("origin") or "?"
    import build_sft_rows as b

    out = Path(rows["path"])
    summary_path = Path(str(out) + ".build.json")
    if out_dir is not None:
        out, summary_path = out_dir / ROWS_STORE_FILE, out_dir / BUILD_SUMMARY
    building = out.with_name(f".{out.name}.building")
    try:
        enc = b.make_encoder(encoder or tok["path"], rows.get("loss_mask") or "qwen3")
        source = b.open_source(Path(data["path"]), rows.get("messages_column") or "messages")
        summary = b.build(
            source,
            enc,
            building,
            row_tokens=int(rows["row_tokens"]),
            rows=rows.get("rows"),
            seed=int(rows.get("seed", 42)),
            log=log,
        )
    except b.BuildError as err:
        raise Failed(f"asset rows: the build failed: {err}") from None
    made_of = (
        f"built on this node from dataset {describe(data)} ({origins['dataset']}) and tokenizer "
        f"{describe(tok)} ({origins['tokenizer']}), seed {summary['seed']}, {summary['rows']} rows "
        f"of {summary['row_tokens']} tokens, loss mask {rows.get('loss_mask')}"
        + (f", encoder {encoder}" if encoder else "")
    )
    wrong = []
    for key in ("parquet_sha256", "rows_sha256"):
        want = rows.get(key)
        if want and summary[key] != want:
            field = (rows.get("hash_fields") or {}).get(key, key)
            wrong.append(f"{key}: built {summary[key]} ({made_of}); the recipe's {field} is {want}")
    summary["made_of"] = made_of
    summary_path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    if wrong:
        os.replace(building, str(out) + ".mismatch")
        raise Failed(
            "asset rows: MISMATCH " + " | ".join(wrong) + f"; the file was kept as {out}.mismatch"
        )
    os.replace(building, out)
    log(
        f"rows: {out}: {summary['rows']} rows, parquet sha256 {summary['parquet_sha256']} (checked)"
    )
    return summary


def seal(
    spec: dict[str, Any], name: str, *, threads: int = 8, log: Log = stderr_log
) -> dict[str, Any]:
    """Record the manifest of what this node made (the converted checkpoint) so a later run can
    trust its cache and `push` can upload it."""
    asset = asset_spec.assets_by_name(spec)[name]
    path = Path(asset["path"])
    if asset["kind"] == "rows" or not path.is_dir() or path.is_symlink():
        raise Failed(f"asset {name}: {path} is not a directory to seal")
    current = asset_store.read_local_manifest(path)
    if current is not None and current.get("asset") != identity(asset):
        raise Failed(f"asset {name}: {path} is sealed as {json.dumps(current.get('asset'))}")
    try:
        manifest = asset_store.make_manifest(
            path, identity(asset), origin=f"made on {os.uname().nodename}", threads=threads
        )
    except safe_io.UnsafeFile as err:  # a link, a FIFO, a part it cannot read: never left out
        raise Failed(f"asset {name}: {path} is not sealed: {err}") from None
    if not manifest["files"]:
        raise Failed(f"asset {name}: {path} is empty")
    asset_store.write_local_manifest(path, manifest)
    (path / PENDING).unlink(missing_ok=True)
    log(f"{name}: sealed {path} ({len(manifest['files'])} files, {manifest['total_bytes']} bytes)")
    return manifest


def push_asset(
    spec: dict[str, Any],
    name: str,
    *,
    threads: int = 8,
    log: Log = stderr_log,
    progress: hf_hub.Progress | None = None,
) -> dict[str, Any]:
    """Upload a cached asset to the spec's store (rows: the parquet and its build summary)."""
    store = open_spec_store(spec)
    if store is None:
        raise Failed(f"asset {name}: the spec names no store")
    asset = asset_spec.assets_by_name(spec)[name]
    path = Path(asset["path"])
    progress = progress or Throttled(name, log)
    try:
        if asset["kind"] == "rows":
            if (
                not asset.get("parquet_sha256")
                or asset_store.file_sha256(path) != asset["parquet_sha256"]
            ):
                raise Failed(f"asset rows: {path} is not the recipe's rows; not uploaded")
            stage = path.with_name(f".{path.name}.push")
            stage.mkdir(exist_ok=True)
            link = stage / ROWS_STORE_FILE
            if not link.exists():
                os.link(path, link)
            manifest = asset_store.make_manifest(
                stage,
                identity(asset),
                known={ROWS_STORE_FILE: asset["parquet_sha256"]},
                origin=str(path),
            )
            return asset_store.push(
                store, store_key(asset), stage, manifest, threads=1, progress=progress, log=log
            )
        sealed = asset_store.read_local_manifest(path)
        if sealed is None or sealed.get("asset") != identity(asset):
            raise Failed(f"asset {name}: {path} has no manifest of this asset (seal it first)")
        bad = asset_store.verify_tree(path, sealed, full=False)
        if bad:
            raise Failed(f"asset {name}: {path} differs from its manifest ({bad[0]}); not uploaded")
        return asset_store.push(
            store, store_key(asset), path, sealed, threads=threads, progress=progress, log=log
        )
    except StoreError as err:
        raise Failed(f"asset {name}: {err}", infra=not err.mismatch) from None


# ------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    r = sub.add_parser("resolve", help="where each asset will come from (JSON plan on stdout)")
    r.add_argument("--spec", type=Path, required=True)
    r.add_argument("--out", type=Path, help="also write the plan here")
    r.add_argument(
        "--verify",
        choices=("full", "sizes"),
        default="full",
        help="cache check: every sha256 (default) or sizes only",
    )
    f = sub.add_parser("fetch", help="carry out the plan: cache check, store or Hub download")
    f.add_argument("--spec", type=Path, required=True)
    f.add_argument("--plan", type=Path, required=True)
    f.add_argument("names", nargs="+", choices=asset_spec.NAMES, metavar="NAME")
    b = sub.add_parser("build-rows", help="build the rows from the fetched tokenizer and dataset")
    b.add_argument("--spec", type=Path, required=True)
    b.add_argument("--plan", type=Path, required=True)
    b.add_argument("--encoder", help="builtin:whitespace-test (tests ONLY: no real model's ids)")
    b.add_argument(
        "--out",
        type=Path,
        help="an empty directory of this build's own for the rows (a container's build: the "
        "host adopts them from there)",
    )
    a = sub.add_parser("adopt", help="check what a container made and move it into the cache")
    a.add_argument("--spec", type=Path, required=True)
    a.add_argument("name", choices=asset_spec.NAMES, metavar="NAME")
    a.add_argument("--from", dest="src", type=Path, required=True, help="the container's dir")
    s = sub.add_parser("source", help="print the planned source of NAME")
    s.add_argument("--plan", type=Path, required=True)
    s.add_argument("name", choices=asset_spec.NAMES, metavar="NAME")
    for cmd, text in (
        ("seal", "record the manifest of what this node made"),
        ("push", "upload a cached asset to the store"),
        ("verify", "check a cached asset against its manifest"),
    ):
        c = sub.add_parser(cmd, help=text)
        c.add_argument("--spec", type=Path, required=True)
        c.add_argument("name", choices=asset_spec.NAMES, metavar="NAME")
    for c in sub.choices.values():
        c.add_argument("--threads", type=int, default=8, help="files in parallel (default 8)")
    return p


def _load_plan(path: Path) -> dict[str, Any]:
    plan = read_json(path)
    if plan is None or plan.get("format") != PLAN_FORMAT:
        raise SpecError(f"--plan {path}: not a {PLAN_FORMAT} document (run resolve)")
    return plan


def run(args: argparse.Namespace) -> int:
    if args.command == "source":
        print((_load_plan(args.plan)["assets"].get(args.name) or {}).get("source") or "none")
        return 0
    spec = asset_spec.load_spec(args.spec)
    if args.command == "resolve":
        plan = resolve(spec, full=args.verify == "full", threads=args.threads)
        text = json.dumps(plan, indent=1, sort_keys=True)
        if args.out:
            args.out.write_text(text + "\n")
        print(text)
        for name, step in plan["assets"].items():
            said = step.get("detail") or "; ".join(step["tried"])
            first, *rest = said.splitlines() or [""]
            stderr_log(f"resolve: {name}: {step['source'] or 'NONE'}: {first}")
            for line in rest:  # a reason's facts, one per line (asset_resolve.reason)
                stderr_log(f"resolve:   {line}")
        for line in plan["problems"]:
            stderr_log(f"resolve: {line}")
        return 0 if plan["ok"] else (3 if plan["infra"] else 1)
    if args.command == "fetch":
        plan = _load_plan(args.plan)
        for name in args.names:
            fetch_asset(spec, plan, name, threads=args.threads)
        return 0
    if args.command == "build-rows":
        summary = build_rows(spec, _load_plan(args.plan), encoder=args.encoder, out_dir=args.out)
        print(json.dumps(summary or {"status": "not built"}, sort_keys=True))
        return 0
    if args.command == "adopt":
        adopt(spec, args.name, args.src, threads=args.threads)
        return 0
    if args.command == "seal":
        seal(spec, args.name, threads=args.threads)
        return 0
    if args.command == "push":
        print(json.dumps(push_asset(spec, args.name, threads=args.threads), sort_keys=True))
        return 0
    asset = asset_spec.assets_by_name(spec)[args.name]
    manifest = asset_store.read_local_manifest(Path(asset["path"]))
    bad = (
        ["no manifest"]
        if manifest is None
        else asset_store.verify_tree(Path(asset["path"]), manifest, threads=args.threads)
    )
    for line in bad:
        stderr_log(f"verify: {args.name}: {line}")
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except SpecError as err:
        stderr_log(f"node_assets: {err}")
        return 2
    except Failed as err:
        stderr_log(f"node_assets: {err}")
        return 3 if err.infra else 1
    except StoreError as err:
        stderr_log(f"node_assets: {err}")
        return 1 if err.mismatch else 3
    except KeyError as err:
        stderr_log(f"node_assets: the spec has no asset {err}")
        return 2
    except OSError as err:
        stderr_log(f"node_assets: {getattr(err, 'filename', '') or ''}: {err.strerror or err}")
        return 3


if __name__ == "__main__":
    sys.exit(main())
