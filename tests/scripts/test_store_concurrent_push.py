"""Two pushes into one key of a directory store at once, by two processes.

The promise (docs/assets.md, "Who may write the cache and the store"): whatever the interleaving,
the store never ends with a manifest over bytes that are not the ones it lists. Each writer copies
into a temporary file of its own, hashes what it renames, and holds the key while it pushes: the
push that finds the key held fails with one clear StoreError, never a traceback, and writes
nothing. The two writers push the same asset with different bytes (a converted checkpoint is not
bit-for-bit repeatable, and a store may have other writers), started together on a barrier, and
the race is run several times.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

from support.node_scripts import SCRIPTS

ASSET = {"kind": "rows", "parquet_sha256": "a" * 64}
FILES = [f"part-{i}.bin" for i in range(6)]
SIZE = 1 << 20
TRIES = 5

WRITER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import asset_store
from store_base import StoreError
store_dir, src, go = sys.argv[2], sys.argv[3], sys.argv[4]
manifest = asset_store.make_manifest(__import__("pathlib").Path(src), json.loads(sys.argv[5]))
while not os.path.exists(go):
    time.sleep(0.001)
try:
    asset_store.push(asset_store.LocalStore(store_dir), "k", __import__("pathlib").Path(src),
                     manifest, threads=2, log=lambda _: None)
except StoreError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(3)
"""


def _source(root: Path, fill: int) -> Path:
    root.mkdir(parents=True)
    for name in FILES:
        (root / name).write_bytes(bytes([fill]) * SIZE)
    return root


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_concurrent_pushes_never_leave_a_manifest_over_others_bytes(tmp_path):
    for attempt in range(TRIES):
        here = tmp_path / str(attempt)
        store = here / "store"
        go = here / "go"
        sources = [_source(here / f"src{w}", 0x41 + w) for w in range(2)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WRITER,
                    str(SCRIPTS),
                    str(store),
                    str(src),
                    str(go),
                    json.dumps(ASSET),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for src in sources
        ]
        time.sleep(0.3)  # both interpreters up and waiting on the barrier
        go.write_text("go")
        results = [(p.wait(timeout=60), p.stderr.read() if p.stderr else "") for p in procs]
        for code, err in results:
            assert "Traceback" not in err, err
            assert code in (0, 3), err
            if code == 3:
                assert "another push" in err and "under way" in err, err
        assert any(code == 0 for code, _ in results), results
        manifest = json.loads((store / "k" / ".reproduce-manifest.json").read_text())
        for entry in manifest["files"]:
            assert _sha(store / "k" / entry["path"]) == entry["sha256"], (attempt, entry["path"])
        writers = {_sha(src / FILES[0]) for src in sources}
        listed = {e["sha256"] for e in manifest["files"]}
        assert len(listed) == 1 and listed <= writers  # one writer's bytes, whole
        leftovers = [
            p.name for p in (store / "k").iterdir() if p.name.endswith((".partial", ".tmp"))
        ]
        assert leftovers == [], leftovers
