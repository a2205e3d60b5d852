"""Every answer the Hub can give, fed to every caller of the Hub (docs/assets.md, "Errors are
not absence").

A fake Hub on loopback answers each kind of scripts/hf_hub.py's KINDS table (and the ways of not
answering at all: a refused connection, a timeout, an answer cut short). The promise: only the
"unreachable" kind lets a snapshot from the store be checked against the listing the store
itself recorded; every other answer (a missing revision, a 401 or 403, a 429 or 5xx after the
bounded retries, a 200 that is not a listing) refuses it, and no caller reads any of them as
success. Whether a refusal is the infrastructure's (exit 3) or the Hub's "no" (exit 1) follows
the table. The walk is over the table itself: a kind added to it without an answer here fails.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.node_scripts import load_script

hf_hub = load_script("hf_hub")
hub_pins = load_script("hub_pins")
resolve_mod = load_script("asset_resolve")
node_assets = load_script("node_assets")

REV = "c" * 40
BLOB = "b" * 40
LISTING = {"sha": REV, "siblings": [{"rfilename": "config.json", "size": 2, "blobId": BLOB}]}
RECORDED = {
    "files": [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}],
    hub_pins.RECORD: {"commit": REV, "files": {"config.json": {"bytes": 2, "blob_id": BLOB}}},
}


def http(code: int, error_code: str = "", body: bytes = b"{}") -> Callable[[Any], None]:
    def answer(h: BaseHTTPRequestHandler) -> None:
        h.send_response(code)
        if error_code:
            h.send_header("X-Error-Code", error_code)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return answer


def cut(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Length", "4096")
    h.end_headers()
    h.wfile.write(b'{"sha": ')
    h.wfile.flush()
    h.close_connection = True


def stall(h: BaseHTTPRequestHandler) -> None:
    threading.Event().wait(3.0)  # longer than the client's timeout below


# Each kind of the table, and the answers that must be read as it. "refused" is no server at all.
ANSWERS: dict[str, list[tuple[str, Any]]] = {
    "network": [("refused", None), ("timeout", stall), ("cut-short", cut)],
    "busy": [("429", http(429)), ("500", http(500)), ("503", http(503))],
    "repo-not-found": [("404 RepoNotFound", http(404, "RepoNotFound"))],
    "revision-not-found": [("404 RevisionNotFound", http(404, "RevisionNotFound"))],
    "entry-not-found": [("404 EntryNotFound", http(404, "EntryNotFound"))],
    "gated": [("403 GatedRepo", http(403, "GatedRepo"))],
    "unauthorized": [("401", http(401))],
    "forbidden": [("403", http(403))],
    "malformed": [
        ("200 html", http(200, body=b"<html>hi</html>")),
        ("200 list", http(200, body=b"[]")),
        ("200 no commit", http(200, body=b'{"siblings": []}')),
        ("200 bad entry", http(200, body=json.dumps({"sha": REV, "siblings": [7]}).encode())),
    ],
    "http": [("404 plain", http(404)), ("400", http(400))],
}
# Not an answer to a listing: the bytes of a download against it (tests/scripts/test_assets_hub.py).
ONLY_IN_DOWNLOADS = {"mismatch"}
CASES = [(kind, name, fn) for kind, answers in ANSWERS.items() for name, fn in answers]


class Hub:
    """Answers every request with ANSWER (counting them); a listing after `then_ok` requests."""

    def __init__(self) -> None:
        self.answer: Any = http(200, body=json.dumps(LISTING).encode())
        self.ok_after: int | None = None
        self.requests = 0
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                hub.requests += 1
                if hub.ok_after is not None and hub.requests > hub.ok_after:
                    http(200, body=json.dumps(LISTING).encode())(self)
                else:
                    hub.answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def hub(monkeypatch) -> Iterator[Hub]:
    server = Hub()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("REPRODUCE_RETRY_BASE_S", "0")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(hf_hub, "TIMEOUT_S", 0.5)
    yield server
    server.stop()


def _answering(hub: Hub, monkeypatch, name: str, fn: Any) -> None:
    if name == "refused":
        monkeypatch.setenv("HF_ENDPOINT", _closed_port())
    else:
        hub.answer = fn


def asset() -> dict[str, Any]:
    return {"name": "hf_ckpt", "repo": "o/m", "revision": REV, "repo_type": "model"}


def test_the_table_has_an_answer_for_every_kind():
    assert set(ANSWERS) | ONLY_IN_DOWNLOADS == set(hf_hub.KINDS)
    assert {k for k, (_, infra) in hf_hub.KINDS.items() if infra} == {"network", "busy"}


# ---- every caller -------------------------------------------------------------------------------


def call_for_snapshot(tmp: Path) -> Any:
    return hub_pins.for_snapshot(asset(), RECORDED, log=lambda _: None)


def call_resolve(tmp: Path) -> Any:
    cand = {"repo": "o/m", "revision": REV, "repo_type": "model"}
    ok, reason, _ = resolve_mod._hub_check(asset() | {"kind": "hf-snapshot"}, cand, None)
    if ok:
        return reason
    infra = reason.endswith(("[network]", "[hub]"))
    raise resolve_mod.Failed(reason, infra=infra)


def call_hub_fetch(tmp: Path) -> Any:
    a = asset() | {"kind": "hf-snapshot", "path": str(tmp / "cache" / "m"), "include": None}
    cand = {"repo": "o/m", "revision": REV, "repo_type": "model"}
    return node_assets.hub_fetch(a, cand, log=lambda _: None)


def call_check_access(tmp: Path) -> Any:
    info = hf_hub.RepoInfo(
        "o/m", "model", REV, False, [hf_hub.RemoteFile("config.json", 2, None, BLOB)]
    )
    try:
        hf_hub.check_access(info, "config.json")
    except hf_hub.HubError as err:
        raise resolve_mod.Failed(str(err), infra=err.infra) from None
    return "ok"


CALLERS = {
    "hub_pins.for_snapshot": call_for_snapshot,
    "asset_resolve._hub_check": call_resolve,
    "node_assets.hub_fetch": call_hub_fetch,
    "hf_hub.check_access": call_check_access,
}


@pytest.mark.parametrize("caller", sorted(CALLERS))
@pytest.mark.parametrize(("kind", "name", "fn"), CASES, ids=[f"{k}:{n}" for k, n, _ in CASES])
def test_every_answer_to_every_caller_fails_closed(
    hub, monkeypatch, tmp_path, caller, kind, name, fn
):
    _answering(hub, monkeypatch, name, fn)
    if caller == "hub_pins.for_snapshot" and kind == "network":
        pins = CALLERS[caller](tmp_path)  # the one case a recorded listing stands in
        assert "not reachable" in pins.how and set(pins.files) == {"config.json"}
        return
    if caller == "hf_hub.check_access" and name in (
        "cut-short",
        *[n for n, _ in ANSWERS["malformed"]],
    ):
        return  # its one byte did come: a file's first byte has no shape; downloads check bytes
    with pytest.raises(resolve_mod.Failed) as err:
        CALLERS[caller](tmp_path)
    assert err.value.infra is hf_hub.KINDS[kind][1], str(err.value)
    if kind == "busy":
        assert hub.requests == hf_hub.RETRIES + 1  # retried, bounded, then refused
    if kind in ("unauthorized", "forbidden", "gated"):
        assert "HF_TOKEN" in str(err.value)  # the refusal names the token


def test_a_store_writer_cannot_pass_its_record_off_when_the_revision_is_missing(hub):
    hub.answer = http(404, "RevisionNotFound")
    with pytest.raises(resolve_mod.Failed) as err:
        hub_pins.for_snapshot(asset(), RECORDED, log=lambda _: None)
    text = str(err.value)
    assert "the revision does not exist" in text and "not taken" in text
    assert "not reachable" not in text and err.value.infra is False


def test_a_busy_hub_that_recovers_within_the_retries_gives_its_live_listing(hub):
    hub.answer, hub.ok_after = http(503), hf_hub.RETRIES
    pins = hub_pins.for_snapshot(asset(), RECORDED, log=lambda _: None)
    assert "recorded" not in pins.how and hub.requests == hf_hub.RETRIES + 1


def test_a_401_names_a_token_that_was_refused(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    hub.answer = http(401)
    with pytest.raises(resolve_mod.Failed) as err:
        hub_pins.for_snapshot(asset(), RECORDED, log=lambda _: None)
    assert "HF_TOKEN is set but was refused" in str(err.value)
    assert "hf_secret_value" not in str(err.value)
