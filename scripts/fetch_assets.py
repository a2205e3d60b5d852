#!/usr/bin/env python3
r"""Fetch a recipe's assets onto the node: a Hugging Face snapshot at exactly the pinned revision.

Runs ON the node, inside the training image (standard library plus huggingface_hub, imported only
when a download is needed; never the `launcher` package).

    python3 fetch_assets.py hf-checkpoint --repo Qwen/Qwen3-30B-A3B --revision ad44e777... \
        --dest DIR
    python3 fetch_assets.py hf-dataset --repo allenai/tulu-3-sft-mixture --revision b14afda6... \
        --dest DIR

A finished download leaves DIR/.reproduce-complete (JSON: repo, repo type, revision, every file
with its size). A later call with the same repo@revision finds the marker, checks that every listed
file is still there with its size, and skips the download: the step costs seconds on a warm cache.
The marker is written only after the download returned without error; while a download runs,
DIR/.reproduce-pending names what is being fetched, so that an interrupted download is resumed,
never mixed with another revision. A DIR whose marker (or pending file) names another repo or
revision is refused: choose another --dest or remove it.

HF_TOKEN is read from the environment when set (gated or private repos) and never printed.
Exit 0 when the snapshot is complete (downloaded or skipped), 2 on bad arguments or a DIR that
holds something else, 3 when the download fails or huggingface_hub is missing. One JSON line on
stdout says what happened; progress and errors go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # siblings import by name, also when loaded by path

import safe_io  # noqa: E402 (after the sys.path line above): markers never through a symlink

MARKER = ".reproduce-complete"
PENDING = ".reproduce-pending"
HF_METADATA_DIR = (
    ".cache"  # huggingface_hub keeps its local_dir bookkeeping under DEST/.cache/huggingface
)
REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
COMMIT_RE = re.compile(r"[0-9a-f]{40}")

# downloader(repo, revision, dest, token, repo_type, allow_patterns) -> None; raises on failure
Downloader = Callable[[str, str, Path, "str | None", str, "list[str] | None"], None]


class FetchError(Exception):
    """The download failed (exit 3)."""


class RefusedDest(Exception):
    """DEST holds another snapshot or bad arguments (exit 2)."""


def hf_snapshot_download(
    repo: str,
    revision: str,
    dest: Path,
    token: str | None,
    repo_type: str,
    allow_patterns: list[str] | None,
) -> None:
    """The real downloader: huggingface_hub.snapshot_download into DEST (resumes partial files)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no \r-bars in the node log
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FetchError(
            "huggingface_hub is not installed in this image (pip install huggingface_hub)"
        ) from None
    snapshot_download(
        repo_id=repo,
        revision=revision,
        repo_type=repo_type,
        local_dir=str(dest),
        token=token,
        allow_patterns=allow_patterns,
    )


def list_files(dest: Path) -> list[dict[str, Any]]:
    """Every file of the snapshot under DEST, sorted, with its size (our and hf's bookkeeping
    excluded)."""
    out = []
    for e in safe_io.walk(dest):  # a real directory, nothing followed, nothing unread skipped
        if e.rel.split("/")[0] in (MARKER, PENDING, HF_METADATA_DIR) or not _regular(e.st):
            continue
        out.append({"path": e.rel, "bytes": e.st.st_size})
    return sorted(out, key=lambda f: f["path"])


def _regular(st: os.stat_result) -> bool:
    import stat

    return stat.S_ISREG(st.st_mode)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(safe_io.read_text(path, owned=True))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    safe_io.write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def missing_or_changed(dest: Path, marker: dict[str, Any]) -> list[str]:
    """Files the marker lists that are gone or have another size now."""
    bad = []
    for entry in marker.get("files") or []:
        path = dest / str(entry.get("path", ""))
        try:
            st = safe_io.lstat_regular(path, owned=True)
            if st is None:
                raise FileNotFoundError(str(path))
            if st.st_size != entry.get("bytes"):
                bad.append(f"{entry['path']} (size changed)")
        except OSError:
            bad.append(f"{entry.get('path')} (missing)")
    if not marker.get("files"):
        bad.append("(the marker lists no files)")
    return bad


def _same(
    record: dict[str, Any], repo: str, revision: str, repo_type: str, allow: list[str] | None
) -> bool:
    return (
        record.get("repo"),
        record.get("revision"),
        record.get("repo_type", "model"),
        record.get("allow_patterns"),
    ) == (repo, revision, repo_type, allow)


def _describe(record: dict[str, Any]) -> str:
    only = record.get("allow_patterns")
    return f"{record.get('repo_type', 'model')} {record.get('repo')}@{record.get('revision')}" + (
        f" (only {', '.join(map(str, only))})" if only else ""
    )


def _redact(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def fetch_snapshot(
    repo: str,
    revision: str,
    dest: Path,
    *,
    repo_type: str = "model",
    allow_patterns: list[str] | None = None,
    downloader: Downloader = hf_snapshot_download,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Make DEST hold the complete snapshot repo@revision; return the marker plus a `status`.

    Raises RefusedDest when DEST already belongs to another repo@revision, FetchError when the
    download fails. `downloader` is the seam tests use instead of Hugging Face.
    """
    if not REPO_RE.fullmatch(repo):
        raise RefusedDest(f"--repo {repo!r}: expected OWNER/NAME")
    if not revision or any(c.isspace() for c in revision):
        raise RefusedDest(f"--revision {revision!r}: expected a commit (or a branch or tag name)")
    dest = Path(dest)
    want = _describe(
        {
            "repo": repo,
            "revision": revision,
            "repo_type": repo_type,
            "allow_patterns": allow_patterns,
        }
    )
    marker = read_json(dest / MARKER)
    if marker is not None:
        if not _same(marker, repo, revision, repo_type, allow_patterns):
            raise RefusedDest(
                f"{dest} holds {_describe(marker)} (its {MARKER}), not {want}; "
                "choose another --dest or remove that directory"
            )
        bad = missing_or_changed(dest, marker)
        if not bad:
            log(
                f"{want}: complete in {dest} ({len(marker['files'])} files, "
                f"{marker.get('total_bytes', 0)} bytes); "
                "download skipped"
            )
            return {**marker, "status": "skipped"}
        log(f"{want}: {dest} is incomplete now ({', '.join(bad[:5])}); downloading again")
        (dest / MARKER).unlink()
    pending = read_json(dest / PENDING)
    if pending is not None and not _same(pending, repo, revision, repo_type, allow_patterns):
        raise RefusedDest(
            f"{dest} holds an unfinished download of {_describe(pending)} ({PENDING}), not {want}; "
            "choose another --dest or remove that directory"
        )
    if not COMMIT_RE.fullmatch(revision):
        log(
            f"warning: --revision {revision!r} is not a 40-hex commit; "
            "what it names can change over time"
        )

    dest.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        dest / PENDING,
        {
            "repo": repo,
            "revision": revision,
            "repo_type": repo_type,
            "allow_patterns": allow_patterns,
            "started_at": _now(),
        },
    )
    token = os.environ.get("HF_TOKEN") or None
    log(f"{want}: downloading into {dest}" + (" (with HF_TOKEN)" if token else ""))
    started = time.monotonic()
    try:
        downloader(repo, revision, dest, token, repo_type, allow_patterns)
    except FetchError:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001 (hub errors are many; each becomes one clear line)
        first = (str(err).strip().splitlines() or [""])[0][:400]
        raise FetchError(
            _redact(f"download of {want} failed: {type(err).__name__}: {first}", token)
        ) from None
    files = list_files(dest)
    if not files:
        raise FetchError(f"download of {want} returned, but {dest} holds no files")
    record = {
        "repo": repo,
        "revision": revision,
        "repo_type": repo_type,
        "allow_patterns": allow_patterns,
        "completed_at": _now(),
        "files": files,
        "total_bytes": sum(f["bytes"] for f in files),
    }
    write_json_atomic(dest / MARKER, record)
    (dest / PENDING).unlink(missing_ok=True)
    log(
        f"{want}: complete ({len(files)} files, {record['total_bytes']} bytes, "
        f"{time.monotonic() - started:.0f} s)"
    )
    return {**record, "status": "downloaded"}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in (
        ("hf-checkpoint", "a model snapshot (weights, config, tokenizer)"),
        ("hf-dataset", "a dataset snapshot"),
    ):
        s = sub.add_parser(name, help=help_text, description=help_text)
        s.add_argument("--repo", required=True, help="OWNER/NAME on the Hugging Face Hub")
        s.add_argument(
            "--revision", required=True, help="the commit to fetch (40 hex digits recommended)"
        )
        s.add_argument(
            "--dest", required=True, type=Path, help="directory to fill (created when missing)"
        )
        s.add_argument(
            "--include",
            action="append",
            metavar="GLOB",
            help="fetch only files matching GLOB (repeatable; default: every file)",
        )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    repo_type = "dataset" if args.command == "hf-dataset" else "model"
    try:
        result = fetch_snapshot(
            args.repo, args.revision, args.dest, repo_type=repo_type, allow_patterns=args.include
        )
    except RefusedDest as err:
        print(f"fetch_assets: {err}", file=sys.stderr)
        return 2
    except FetchError as err:
        print(f"fetch_assets: {err}", file=sys.stderr)
        return 3
    except OSError as err:
        print(f"fetch_assets: {args.dest}: {err.strerror or err}", file=sys.stderr)
        return 3
    print(
        json.dumps(
            {
                "status": result["status"],
                "repo": result["repo"],
                "revision": result["revision"],
                "repo_type": result["repo_type"],
                "dest": str(args.dest),
                "files": len(result["files"]),
                "total_bytes": result["total_bytes"],
            },
            sort_keys=True,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
