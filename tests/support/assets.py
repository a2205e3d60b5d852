"""Real parts on loopback for the asset tests: a Hugging Face Hub stand-in, moto's S3, tiny assets.

- FakeHub: the Hub's file listing (/api/{models,datasets}/REPO/revision/REV?blobs=true) and file
  downloads (/REPO/resolve/REV/PATH, /datasets/REPO/resolve/...), on 127.0.0.1. LFS files are
  redirected (302) to a second server on another port, as the Hub redirects to its CDN, so a
  test sees whether the token followed. Errors carry the Hub's X-Error-Code headers
  (RepoNotFound 401, RevisionNotFound 404, EntryNotFound 404, GatedRepo 401/403). Range requests
  are honoured; `cut_once[path] = n` closes the connection after n bytes of that file, once
  (`cut_always`: every time); `slow` paths trickle out in 4 KiB chunks.
  Every request is recorded.
- s3_server: moto's ThreadedMotoServer on 127.0.0.1, reached through AWS_ENDPOINT_URL.
- make_hub_repos: a tiny tokenizer, dataset (parquet conversations) and checkpoint.
No test reaches the Hub or AWS.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from support.paths import SEED

LFS_SUFFIXES = (".safetensors", ".parquet", ".bin")
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi".split()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    repo_type: str  # model | dataset
    name: str
    commits: dict[str, dict[str, bytes]]  # commit -> {path: bytes}
    refs: dict[str, str] = field(default_factory=dict)  # branch -> commit
    gated: Any = False  # False | "manual"


@dataclass
class Request:
    method: str
    path: str
    auth: str | None
    range: str | None
    server: str  # hub | cdn


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-file (a cut, a Ctrl-C) is part of the tests


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], Repo] = {}
        self.tokens: set[str] = set()  # tokens granted access to gated repos
        self.cut_once: dict[str, int] = {}
        self.cut_always: dict[str, int] = {}  # path -> bytes sent before every cut
        self.slow: set[str] = set()  # paths sent in small chunks with pauses
        self.requests: list[Request] = []
        self.blobs: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self._hub = _QuietServer(("127.0.0.1", 0), self._handler("hub"))
        self._cdn = _QuietServer(("127.0.0.1", 0), self._handler("cdn"))
        for server in (self._hub, self._cdn):
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def stop(self) -> None:
        for server in (self._hub, self._cdn):
            server.shutdown()
            server.server_close()

    def add(self, repo: Repo) -> Repo:
        self.repos[(repo.repo_type, repo.name)] = repo
        for files in repo.commits.values():
            for data in files.values():
                self.blobs[hashlib.sha256(data).hexdigest()] = data
        return repo

    def file_requests(self) -> list[Request]:
        return [r for r in self.requests if r.server == "cdn" or "/resolve/" in r.path]

    # ---- serving ---------------------------------------------------------------------------

    def _handler(self, which: str) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                self.do_GET(head=True)

            def do_GET(self, head: bool = False) -> None:
                with hub.lock:
                    hub.requests.append(
                        Request(
                            self.command,
                            self.path,
                            self.headers.get("Authorization"),
                            self.headers.get("Range"),
                            which,
                        )
                    )
                if which == "cdn":
                    return hub._serve_cdn(self, head)
                return hub._serve_hub(self, head)

        return Handler

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str) -> None:
        body = json.dumps({"error": code}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _lookup(self, h, repo_type: str, name: str, rev: str):
        repo = self.repos.get((repo_type, name))
        if repo is None:
            self._error(h, 401, "RepoNotFound")
            return None, None
        commit = repo.refs.get(rev, rev)
        if commit not in repo.commits:
            self._error(h, 404, "RevisionNotFound")
            return None, None
        return repo, commit

    def _serve_hub(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        url = urllib.parse.urlsplit(h.path)
        path = urllib.parse.unquote(url.path)
        m = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)/revision/([^/]+)", path)
        if m:
            repo, commit = self._lookup(h, m.group(1)[:-1], m.group(2), m.group(3))
            if repo is None:
                return
            siblings = []
            for p, data in sorted(repo.commits[commit].items()):
                entry: dict[str, Any] = {
                    "rfilename": p,
                    "size": len(data),
                    "blobId": git_blob_id(data),
                }
                if p.endswith(LFS_SUFFIXES):
                    sha = hashlib.sha256(data).hexdigest()
                    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n".encode()
                    entry["blobId"] = git_blob_id(pointer)
                    entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": len(pointer)}
                siblings.append(entry)
            body = json.dumps(
                {
                    "id": repo.name,
                    "sha": commit,
                    "gated": repo.gated,
                    "private": False,
                    "siblings": siblings,
                }
            ).encode()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return
        m = re.fullmatch(r"/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if not m:
            return self._error(h, 404, "NotFound")
        repo, commit = self._lookup(h, "dataset" if m.group(1) else "model", m.group(2), m.group(3))
        if repo is None:
            return
        if repo.gated:
            auth = h.headers.get("Authorization") or ""
            if not auth:
                return self._error(h, 401, "GatedRepo")
            if auth.removeprefix("Bearer ") not in self.tokens:
                return self._error(h, 403, "GatedRepo")
        file_path = m.group(4)
        data = repo.commits[commit].get(file_path)
        if data is None:
            return self._error(h, 404, "EntryNotFound")
        if file_path.endswith(LFS_SUFFIXES):
            h.send_response(302)
            h.send_header("Location", f"{self.cdn_url}/blob/{hashlib.sha256(data).hexdigest()}")
            h.send_header("X-Repo-Commit", commit)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        self._send_bytes(h, data, file_path, head)

    def _serve_cdn(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        m = re.fullmatch(r"/blob/([0-9a-f]{64})", h.path)
        data = self.blobs.get(m.group(1)) if m else None
        if data is None:
            return self._error(h, 404, "NoSuchBlob")
        path = next(
            (
                p
                for r in self.repos.values()
                for files in r.commits.values()
                for p, d in files.items()
                if d == data
            ),
            "",
        )
        self._send_bytes(h, data, path, head)

    def _send_bytes(self, h: BaseHTTPRequestHandler, data: bytes, path: str, head: bool) -> None:
        start = 0
        rng = h.headers.get("Range")
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
        end = len(data) - 1
        if m:
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else end
            if start >= len(data):
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{len(data)}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            end = min(end, len(data) - 1)
            h.send_response(206)
            h.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        else:
            h.send_response(200)
        body = data[start : end + 1]
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Accept-Ranges", "bytes")
        h.end_headers()
        if head:
            return
        with self.lock:
            cut = self.cut_once.pop(path, None)
            cut = self.cut_always.get(path, cut)
        if path in self.slow:
            for i in range(0, len(body), 4096):
                h.wfile.write(body[i : i + 4096])
                h.wfile.flush()
                time.sleep(0.05)
            return
        if cut is not None and cut < len(body):
            h.wfile.write(body[:cut])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return
        h.wfile.write(body)


# ---- tiny assets ---------------------------------------------------------------------------------

TOK_REV = "1" * 40
CKPT_REV = "2" * 40
DATA_REV = "3" * 40
OTHER_REV = "4" * 40


def plant_other_snapshot(path: Path) -> None:
    """A cache directory at PATH holding the tiny model at OTHER_REV, manifest and all: what a
    cache kept from another recipe's revision looks like to resolve."""
    from support.node_scripts import load_script

    store = load_script("asset_store")
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    other = {
        "kind": "hf-snapshot",
        "repo_type": "model",
        "repo": "test-org/tiny-model",
        "revision": OTHER_REV,
        "include": None,
    }
    store.write_local_manifest(path, store.make_manifest(path, other))


def conversations(n: int, seed: int = 5, words: int = 30) -> list[list[dict[str, str]]]:
    r = random.Random(seed)
    out = []
    for i in range(n):
        msgs = [
            {
                "role": "user",
                "content": " ".join(r.choice(WORDS) for _ in range(r.randint(5, words))),
            }
        ]
        if i % 7:
            msgs.append(
                {
                    "role": "assistant",
                    "content": " ".join(r.choice(WORDS) for _ in range(r.randint(5, words))),
                }
            )
        out.append(msgs)
    return out


def parquet_bytes(convs: list[list[dict[str, str]]], tmp: Path) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    msg_type = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
    path = tmp / f"p-{len(convs)}-{random.random()}.parquet"
    pq.write_table(pa.table({"messages": pa.array(convs, type=msg_type)}), path)
    data = path.read_bytes()
    path.unlink()
    return data


@dataclass
class Assets:
    tokenizer: dict[str, bytes]
    dataset: dict[str, bytes]
    checkpoint: dict[str, bytes]

    def tokenizer_sha256(self) -> dict[str, str]:
        return {n: hashlib.sha256(d).hexdigest() for n, d in self.tokenizer.items()}


def make_assets(tmp: Path, *, conversations_n: int = 3000, shard_bytes: int = 300_000) -> Assets:
    tokenizer = make_tokenizer()
    convs = conversations(conversations_n)
    half = len(convs) // 2
    dataset = {
        "README.md": b"# tiny sft\n",
        "data/train-00000-of-00002.parquet": parquet_bytes(convs[:half], tmp),
        "data/train-00001-of-00002.parquet": parquet_bytes(convs[half:], tmp),
    }
    return Assets(tokenizer, dataset, make_checkpoint(tokenizer, shard_bytes))


def make_checkpoint(tokenizer: dict[str, bytes], shard_bytes: int = 300_000) -> dict[str, bytes]:
    """The test checkpoint's files: git-stored (config, tokenizer) and LFS (the shards). Its own
    function, cheap, so that a test can parametrize over its file names at collection time."""
    rnd = random.Random(11)
    return {
        "config.json": b'{"model_type": "tiny"}',
        "model-00001-of-00002.safetensors": rnd.randbytes(shard_bytes),
        "model-00002-of-00002.safetensors": rnd.randbytes(shard_bytes // 2),
        **tokenizer,  # byte-identical tokenizer files, as the seed says of its checkpoint
    }


def make_tokenizer() -> dict[str, bytes]:
    return {
        "tokenizer.json": json.dumps({"model": "whitespace-test", "version": 1}).encode(),
        "tokenizer_config.json": json.dumps({"tokenizer_class": "WhitespaceTest"}).encode(),
    }


def install(hub: FakeHub, assets: Assets) -> None:
    hub.add(Repo("model", "test-org/tiny-tokenizer", {TOK_REV: assets.tokenizer}))
    hub.add(
        Repo(
            "model",
            "test-org/tiny-model",
            {CKPT_REV: assets.checkpoint, OTHER_REV: {"config.json": b"{}"}},
            refs={"main": CKPT_REV},
        )
    )
    hub.add(Repo("dataset", "test-org/tiny-sft", {DATA_REV: assets.dataset}))


# ---- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def hub(monkeypatch, tiny):
    server = FakeHub()
    install(server, tiny[0])
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("REPRODUCE_RETRY_BASE_S", "0")
    yield server
    server.stop()


def fake_aws_env(monkeypatch) -> None:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)


@pytest.fixture(scope="session")
def moto_s3_server():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(monkeypatch, moto_s3_server):
    """A fresh bucket on the loopback moto server; yields its s3:// store URL."""
    import boto3

    fake_aws_env(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_s3_server)
    bucket = f"assets-{os.urandom(4).hex()}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/store"


def aws_cli() -> str:
    """The aws CLI the test extra installs (awscli, in this Python's bin dir), else one on PATH.
    Missing is a failure, not a skip: tests/run.sh installs it, and the node's S3 path needs it."""
    beside = Path(sys.executable).parent / "aws"
    path = str(beside) if beside.is_file() else shutil.which("aws")
    if not path:
        pytest.fail(
            "no aws CLI: install the test extra (`pip install -e '.[test]'`, as tests/run.sh does)"
        )
    return path


# ---- a recipe for the tiny assets ----------------------------------------------------------------

ROWS = 12


def build_expected(assets: Assets, tmp: Path) -> dict[str, Any]:
    """What build_sft_rows makes of the tiny dataset with the test encoder: the hashes a recipe
    for these assets pins."""
    from support.node_scripts import load_script

    b = load_script("build_sft_rows")
    src = tmp / "expected-src"
    for name, data in assets.dataset.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    return b.build(
        b.open_source(src, "messages"),
        b.WhitespaceTestTokenizer(),
        tmp / "expected.parquet",
        row_tokens=8192,
        rows=ROWS,
        seed=42,
        log=lambda m: None,
    )


def tiny_recipe_raw(assets: Assets, expected: dict[str, Any]) -> dict[str, Any]:
    import yaml

    raw = yaml.safe_load(SEED.read_text())
    sha = assets.tokenizer_sha256()
    ds = raw["workload"]["dataset"]
    ds["source"] = "test-org/tiny-sft"
    ds["revision"] = DATA_REV
    ds["rows_sha256"] = expected["rows_sha256"]
    build = ds["build"]
    build["tokenizer"] = (
        f"tiny-tokenizer (revision {TOK_REV}; tokenizer.json sha256 {sha['tokenizer.json']}; "
        f"tokenizer_config.json sha256 {sha['tokenizer_config.json']}), byte-identical to "
        f"tiny-model's at revision {CKPT_REV}"
    )
    build["rows"] = ROWS
    build["parquet_sha256"] = expected["parquet_sha256"]
    build["parquet_bytes"] = expected["parquet_bytes"]
    build["supervised_token_ratio"] = expected["supervised_token_ratio"]
    params = raw["result"]["active_params"]
    params["source"] = "https://huggingface.co/test-org/tiny-model"
    params["revision"] = CKPT_REV
    return raw


def write_recipe(path: Path, raw: dict[str, Any]) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False, width=100))
    return path


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(assets, expected build summary), made once per session."""
    tmp = tmp_path_factory.mktemp("tiny")
    assets = make_assets(tmp)
    return assets, build_expected(assets, tmp)
