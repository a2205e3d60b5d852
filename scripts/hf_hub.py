#!/usr/bin/env python3
"""A small Hugging Face Hub client in the standard library: file listings and verified downloads.

Runs on the node's host python3 (the asset resolve, before the image pull) and inside the training
image; never imports `launcher`, needs neither huggingface_hub nor requests. HF_ENDPOINT is
honoured (mirrors, and the tests' loopback Hub); HF_TOKEN is sent only to that endpoint, never
to the CDN a download is redirected to, and never appears in a message.

Every file is checked after download: an LFS file against the sha256 the Hub's listing gives, a
small git-stored file against its git blob id (sha1 of "blob <size>\\0" + content). A download
resumes from DEST.partial with an HTTP Range request, and only when DEST.partial is a regular file
of ours: a symlink or anything else planted there is removed, never written through (safe_io.py).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, BinaryIO, Callable, Sequence

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # siblings import by name, also when loaded by path

import safe_io  # noqa: E402 (after the sys.path line above)

DEFAULT_ENDPOINT = "https://huggingface.co"
USER_AGENT = "reproduce-assets/1"
REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
CHUNK = 1 << 20
TIMEOUT_S = 60.0

Progress = Callable[[str, int, int], None]  # (file path, bytes done, bytes total)
# Set by the launcher's Ctrl-C handler: every transfer loop (here, asset_store, s3_store) stops at
# its next chunk, so worker threads end promptly and what was written so far is kept for a resume.
CANCEL = threading.Event()


class Cancelled(Exception):
    """A transfer stopped because CANCEL was set."""


# How each answer of the Hub is read, for every caller (docs/assets.md, "Errors are not
# absence"): kind -> (what it means, whether it is the infrastructure's failure: exit 3).
# Only UNREACHABLE means the Hub gave no answer at all; every other kind is the Hub's "no", and
# no caller may read it as "the Hub is away" (a store's recorded listing stands in only then).
KINDS: dict[str, tuple[str, bool]] = {
    "network": ("unreachable: refused, DNS, timeout, a connection cut mid-answer", True),
    "busy": ("429 or 5xx on every one of the bounded retries: refused", True),
    "repo-not-found": ("no: the repository does not exist (or is private without a token)", False),
    "revision-not-found": ("no: the pinned revision does not exist", False),
    "entry-not-found": ("no: no such file at this revision", False),
    "gated": ("no: a gated repository this token may not read", False),
    "unauthorized": ("no: 401, the token is missing or refused", False),
    "forbidden": ("no: 403, the token may not read it", False),
    "malformed": ("no: a 200 that is not the listing asked for", False),
    "http": ("no: any other HTTP answer", False),
    "mismatch": ("no: the bytes are not the listed ones", False),
}
UNREACHABLE = "network"
RETRIES = 3  # a 429 or 5xx is asked again this many times, with doubling pauses, then refused


class HubError(Exception):
    """A Hub answer that means this asset cannot come from the Hub. `kind` is one of KINDS."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind if kind in KINDS else "http"

    @property
    def unreachable(self) -> bool:
        """The Hub gave no answer at all (the only kind a recorded listing may stand in for)."""
        return self.kind == UNREACHABLE

    @property
    def infra(self) -> bool:
        """The network or the Hub failed (exit 3), rather than the Hub saying no (exit 1)."""
        return KINDS[self.kind][1]


class RemoteFile:
    """One file of a repo at a commit, as the Hub lists it."""

    def __init__(self, path: str, size: int, sha256: str | None, blob_id: str | None):
        self.path = path
        self.size = size
        self.sha256 = sha256  # LFS files: the content's sha256
        self.blob_id = blob_id  # every file: the git blob id (sha1), LFS files' is the pointer's

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "bytes": self.size,
            "sha256": self.sha256,
            "blob_id": self.blob_id,
        }


class RepoInfo:
    def __init__(self, repo: str, repo_type: str, commit: str, gated: Any, files: list[RemoteFile]):
        self.repo = repo
        self.repo_type = repo_type
        self.commit = commit
        self.gated = gated  # False, "auto" or "manual"
        self.files = files

    def select(self, include: Sequence[str] | None) -> list[RemoteFile]:
        if not include:
            return list(self.files)
        return [f for f in self.files if any(fnmatch(f.path, pat) for pat in include)]


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def token_from_env() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def redact(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text


def _quote_path(path: str) -> str:
    return "/".join(urllib.parse.quote(part, safe="") for part in path.split("/"))


def api_url(repo: str, revision: str, repo_type: str) -> str:
    return (
        f"{endpoint()}/api/{repo_type}s/{repo}/revision/"
        f"{urllib.parse.quote(revision, safe='')}?blobs=true"
    )


def file_url(repo: str, revision: str, path: str, repo_type: str) -> str:
    prefix = "" if repo_type == "model" else f"{repo_type}s/"
    return (
        f"{endpoint()}/{prefix}{repo}/resolve/{urllib.parse.quote(revision, safe='')}/"
        f"{_quote_path(path)}"
    )


class _NoAuthAcrossHosts(urllib.request.HTTPRedirectHandler):
    """Follow redirects, dropping Authorization when the host changes (the token is the Hub's,
    not the CDN's)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            old_host = urllib.parse.urlsplit(req.full_url).netloc
            if urllib.parse.urlsplit(newurl).netloc != old_host:
                new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_NoAuthAcrossHosts())


def _request(
    url: str, token: str | None, *, method: str = "GET", headers: dict[str, str] | None = None
) -> Any:
    hdrs = {"User-Agent": USER_AGENT}
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    hdrs.update(headers or {})
    if not url.startswith(("https://", "http://")):
        raise HubError("http", f"HF_ENDPOINT must be an http(s) URL, not {endpoint()!r}")
    req = urllib.request.Request(url, headers=hdrs, method=method)  # noqa: S310 (scheme checked above)
    return _OPENER.open(req, timeout=TIMEOUT_S)


def _token_words(token: str | None) -> str:
    return "HF_TOKEN is set but was refused" if token else "no HF_TOKEN is set"


def _hub_error(err: urllib.error.HTTPError, what: str, token: str | None) -> HubError:
    code = err.headers.get("X-Error-Code") or ""
    server = err.headers.get("X-Error-Message") or ""
    detail = f"HTTP {err.code}" + (f" {code}" if code else "") + (f": {server}" if server else "")
    detail = redact(detail, token)
    if code == "RevisionNotFound":
        return HubError("revision-not-found", f"{what}: the revision does not exist ({detail})")
    if code == "EntryNotFound":
        return HubError("entry-not-found", f"{what}: no such file at this revision ({detail})")
    if code == "GatedRepo":
        hint = "set HF_TOKEN" if not token else "HF_TOKEN's account has not been granted access"
        return HubError("gated", f"{what}: gated repository ({hint}; {detail})")
    if code == "RepoNotFound":
        hint = " or private/gated without HF_TOKEN" if not token else ""
        return HubError("repo-not-found", f"{what}: repository not found{hint} ({detail})")
    if err.code == 401:
        return HubError(
            "unauthorized", f"{what}: the Hub refused the request ({_token_words(token)}; {detail})"
        )
    if err.code == 403:
        words = "HF_TOKEN's account may not read it" if token else "no HF_TOKEN is set"
        return HubError("forbidden", f"{what}: access refused ({words}; {detail})")
    if err.code == 429 or err.code >= 500:
        return HubError("busy", f"{what}: the Hub answered {detail}")
    return HubError("http", f"{what}: {detail}")


def _network_error(err: BaseException, what: str, token: str | None) -> HubError:
    reason = getattr(err, "reason", None) or err
    return HubError("network", redact(f"{what}: {endpoint()} unreachable ({reason})", token))


def repo_info(
    repo: str, revision: str, repo_type: str = "model", token: str | None = None
) -> RepoInfo:
    """The repo's files at REVISION (a commit, branch or tag) with sizes and hashes. A 429 or 5xx
    is asked again RETRIES times (doubling pauses), then refused ("busy"); an answer that is not
    a listing is "malformed", never read as no answer."""
    what = f"{repo_type} {repo}@{revision}"
    if not REPO_RE.fullmatch(repo):
        raise HubError("repo-not-found", f"{what}: expected OWNER/NAME")
    attempt = 0
    while True:
        try:
            with _request(api_url(repo, revision, repo_type), token) as resp:
                body = resp.read()
            break
        except urllib.error.HTTPError as err:
            failure = _hub_error(err, what, token)
            if failure.kind != "busy" or attempt >= RETRIES:
                raise failure from None
        except (urllib.error.URLError, socket.timeout, ConnectionError) as err:
            raise _network_error(err, what, token) from None
        except http.client.HTTPException as err:  # an answer cut short: no listing came
            raise _network_error(err, what, token) from None
        attempt += 1
        _pause(attempt)
    return _listing(body, repo, repo_type, what)


def _listing(body: bytes, repo: str, repo_type: str, what: str) -> RepoInfo:
    """The Hub's JSON answer as a RepoInfo; HubError("malformed") for anything else."""
    try:
        data = json.loads(body.decode("utf-8"))
    except ValueError:
        raise HubError("malformed", f"{what}: the Hub's answer is not JSON") from None
    if not isinstance(data, dict):
        raise HubError("malformed", f"{what}: the Hub's answer is not a listing")
    commit = str(data.get("sha") or "")
    if not COMMIT_RE.fullmatch(commit):
        raise HubError("malformed", f"{what}: the Hub's answer names no commit")
    files = []
    siblings = data.get("siblings") or []
    try:
        for s in siblings:
            lfs = s.get("lfs") or {}
            files.append(
                RemoteFile(
                    str(s["rfilename"]),
                    int(lfs.get("size", s.get("size", -1)) if lfs else s.get("size", -1)),
                    str(lfs["sha256"]).lower() if lfs.get("sha256") else None,
                    s.get("blobId"),
                )
            )
    except (AttributeError, KeyError, TypeError, ValueError):
        raise HubError(
            "malformed", f"{what}: the Hub's listing has an entry it cannot read"
        ) from None
    return RepoInfo(repo, repo_type, commit, data.get("gated", False), files)


def check_access(info: RepoInfo, path: str, token: str | None = None) -> None:
    """Raise HubError unless this token (or none) may download PATH (gated repos say no only
    here). A 429 or 5xx is asked again RETRIES times, as for the listing."""
    what = f"{info.repo_type} {info.repo}@{info.commit[:12]}: {path}"
    url = file_url(info.repo, info.commit, path, info.repo_type)
    attempt = 0
    while True:
        try:
            with _request(url, token, headers={"Range": "bytes=0-0"}) as resp:
                resp.read(1)
            return
        except urllib.error.HTTPError as err:
            if err.code == 416:  # an empty file: the range is unsatisfiable, the access is fine
                return
            failure = _hub_error(err, what, token)
            if failure.kind != "busy" or attempt >= RETRIES:
                raise failure from None
        except (
            urllib.error.URLError,
            socket.timeout,
            ConnectionError,
            http.client.HTTPException,
        ) as err:
            raise _network_error(err, what, token) from None
        attempt += 1
        _pause(attempt)


def git_blob_sha1(path: Path) -> str:
    with safe_io.open_read(path, owned=False) as f:
        return _hashes(f)[1]


def file_sha256(path: Path) -> str:
    return safe_io.sha256_of(path, owned=False)


def _hashes(f: BinaryIO) -> tuple[str, str]:
    """(sha256, git blob sha1) of an open file's bytes, read once from its start."""
    f.seek(0)
    size = os.fstat(f.fileno()).st_size
    sha = hashlib.sha256()
    # git names a blob by this sha1; it identifies the Hub's bytes, it is not a security check
    blob = hashlib.sha1(f"blob {size}\0".encode())  # noqa: S324
    for chunk in iter(lambda: f.read(CHUNK), b""):
        sha.update(chunk)
        blob.update(chunk)
    return sha.hexdigest(), blob.hexdigest()


def verify_open(f: BinaryIO, remote: RemoteFile) -> str | None:
    """None when the open file F holds the file the Hub listed, else what differs."""
    size = os.fstat(f.fileno()).st_size
    if remote.size >= 0 and size != remote.size:
        return f"{size} bytes, the Hub lists {remote.size}"
    if not remote.sha256 and not remote.blob_id:
        return None
    sha, blob = _hashes(f)
    if remote.sha256:
        return None if sha == remote.sha256 else f"sha256 {sha}, the Hub lists {remote.sha256}"
    return None if blob == remote.blob_id else f"git blob {blob}, the Hub lists {remote.blob_id}"


def verify_remote(path: Path, remote: RemoteFile, *, owned: bool = True) -> str | None:
    """None when PATH (a regular file, never a symlink; ours when OWNED) is the file the Hub
    listed, else what differs."""
    try:
        with safe_io.open_read(path, owned=owned) as f:
            return verify_open(f, remote)
    except OSError as err:
        return str(err)


def download(
    info: RepoInfo,
    remote: RemoteFile,
    dest: Path,
    token: str | None = None,
    *,
    progress: Progress | None = None,
    retries: int = 4,
    log: Callable[[str], None] | None = None,
    base: Path | None = None,
) -> Path:
    """REMOTE into DEST, resuming DEST.partial (only a regular file of ours: anything else there
    is removed first); verified against the listing through the same open file, then renamed.
    BASE: the asset's directory, below which no directory may be a symlink."""
    what = f"{info.repo_type} {info.repo}@{info.commit[:12]}: {remote.path}"
    partial = dest.with_name(dest.name + ".partial")
    url = file_url(info.repo, info.commit, remote.path, info.repo_type)
    out, _ = safe_io.open_resume(partial, log=log, base=base)
    with out:
        _download_into(out, url, remote, token, progress, retries, what)
        bad = verify_open(out, remote)
        if bad:
            out.close()
            os.unlink(str(partial))
            raise HubError("mismatch", f"{what}: the download has {bad}")
        out.flush()
        os.fsync(out.fileno())
        ino = os.fstat(out.fileno()).st_ino
    os.replace(str(partial), str(dest))
    if os.lstat(str(dest)).st_ino != ino:
        raise safe_io.UnsafeFile(dest, "it changed while it was being written")
    return dest


def _download_into(
    out: BinaryIO,
    url: str,
    remote: RemoteFile,
    token: str | None,
    progress: Progress | None,
    retries: int,
    what: str,
) -> None:
    attempt = 0
    while True:
        have = os.fstat(out.fileno()).st_size
        if remote.size >= 0 and have > remote.size:
            out.truncate(0)
            have = 0
        try:
            if remote.size < 0 or have < remote.size:
                _fetch_into(url, out, have, remote.size, token, progress, remote.path)
            return
        except urllib.error.HTTPError as err:
            if (err.code < 500 and err.code != 429) or attempt >= retries:
                raise _hub_error(err, what, token) from None
            attempt += 1  # the Hub's or the CDN's passing trouble: retry like a dropped line
            _pause(attempt)
            continue
        except (urllib.error.URLError, socket.timeout, ConnectionError, OSError) as err:
            if isinstance(err, OSError) and getattr(err, "errno", None) in (28, 122):
                raise  # no space left: retrying cannot help
            attempt += 1
            if attempt > retries:
                raise _network_error(err, what, token) from None
            _pause(attempt)


def _pause(attempt: int) -> None:
    """Seconds before a retry, doubling; REPRODUCE_RETRY_BASE_S=0 in the tests."""
    time.sleep(float(os.environ.get("REPRODUCE_RETRY_BASE_S") or 1.0) * 2**attempt)


def _fetch_into(
    url: str,
    out: BinaryIO,
    have: int,
    size: int,
    token: str | None,
    progress: Progress | None,
    name: str,
) -> None:
    headers = {"Range": f"bytes={have}-"} if have else {}
    with _request(url, token, headers=headers) as resp:
        if have and resp.status != 206:  # the server ignored the range: start over
            out.truncate(0)
            have = 0
        out.seek(0, os.SEEK_END)  # the file is open O_APPEND: writes go to its end
        done = have
        while True:
            if CANCEL.is_set():
                raise Cancelled(name)
            chunk = resp.read1(CHUNK)  # what has arrived: a cancel is seen between packets
            if not chunk:
                break
            out.write(chunk)
            done += len(chunk)
            if progress:
                progress(name, done, size)
        out.flush()
    got = os.fstat(out.fileno()).st_size
    if size >= 0 and got < size:
        raise ConnectionError(f"connection closed at {got} of {size} bytes")
