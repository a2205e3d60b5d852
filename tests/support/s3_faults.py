"""An HTTP proxy on 127.0.0.1 in front of the loopback moto S3 server that damages the answers to
ranged GETs, so the store's ranged fetch meets a misbehaving S3 for real (over sockets, through
botocore), not a mock of its client.

A fault applies to GETs with a Range header whose path ends with `match`, `times` times (-1:
always), optionally only to the range starting at `offset`:

- `short`: the body is cut to half (Content-Length says so: a well-formed short answer);
- `shifted`: the bytes of the next range, with an honest Content-Range for them;
- `lying`: the bytes of another offset under the Content-Range that was asked for;
- `flip`: one byte of the body flipped;
- `drop`: the headers promise the whole range, half of it is sent, the connection is closed.

Every ranged request's Range header is recorded in `ranges` (what a resumed fetch asked for).
"""

from __future__ import annotations

import http.client
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Fault:
    kind: str  # short | shifted | lying | flip | drop
    match: str  # the object key's end
    times: int = 1  # -1: always
    offset: int | None = None  # only the range starting here


@dataclass
class FaultyS3:
    upstream: str  # http://127.0.0.1:PORT of the moto server
    faults: list[Fault] = field(default_factory=list)
    ranges: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FaultyS3:
        parsed = urllib.parse.urlsplit(self.upstream)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = parsed.netloc
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                out_headers = [
                    (k, v)
                    for k, v in resp.getheaders()
                    if k.lower() not in ("content-length", "transfer-encoding", "connection")
                ]
                status = resp.status
                conn.close()
                asked = self.headers.get("Range")
                fault = owner._take(self.command, self.path, asked) if asked else None
                drop = False
                if fault is not None:
                    data, out_headers, drop = owner._damage(
                        fault, data, out_headers, asked or "", self.path, parsed.netloc
                    )
                self.send_response(status)
                for k, v in out_headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if drop:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward  # noqa: N815 (http.server calls these names)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def _take(self, method: str, path: str, asked: str) -> Fault | None:
        with self.lock:
            self.ranges.append(asked)
            start = int(re.match(r"bytes=(\d+)-", asked).group(1))  # type: ignore[union-attr] (botocore's Range)
            for f in self.faults:
                if method != "GET" or not path.split("?")[0].endswith(f.match) or f.times == 0:
                    continue
                if f.offset is not None and f.offset != start:
                    continue
                if f.times > 0:
                    f.times -= 1
                self.applied.append(f"{f.kind}@{start}")
                return f
        return None

    def _damage(
        self,
        fault: Fault,
        data: bytes,
        headers: list[tuple[str, str]],
        asked: str,
        path: str,
        netloc: str,
    ) -> tuple[bytes, list[tuple[str, str]], bool]:
        if fault.kind == "short":
            return data[: len(data) // 2], headers, False
        if fault.kind == "flip":
            return data[:1] + bytes([data[1] ^ 0x01]) + data[2:], headers, False
        if fault.kind == "drop":
            return data, headers, True
        # shifted / lying: the bytes one range further on, fetched from upstream
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", asked)
        assert m
        start, end = int(m.group(1)), int(m.group(2))
        n = end - start + 1
        conn = http.client.HTTPConnection(netloc, timeout=60)
        conn.request("GET", path, headers={"Range": f"bytes={start + n}-{end + n}"})
        other = conn.getresponse()
        moved = other.read()
        moved_range = other.getheader("Content-Range") or ""
        conn.close()
        if not moved:
            moved = bytes(b ^ 0xFF for b in data)  # the last range: other bytes all the same
        if fault.kind == "shifted":
            headers = [(k, moved_range if k.lower() == "content-range" else v) for k, v in headers]
        return moved, headers, False
