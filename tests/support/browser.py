"""A real headless Chromium driven over the DevTools protocol, for the HTML page tests.

Why a pipe and not a port or a library: `--remote-debugging-pipe` makes Chromium read protocol
messages (JSON, each ended by a NUL byte) on its fd 3 and write them on its fd 4. That needs no
websocket client, no free port, no browser download (Debian's `chromium` package is used as is),
and nothing can connect to it from outside. Playwright talks to Chromium the same way.

What a test gets from `Browser.open(url)`: the page's console messages, uncaught exceptions and
log entries (errors and warnings), every URL the page asked for (a self-contained page asks only
for itself and data: URIs), values read from the DOM by a JavaScript expression, and a PNG
screenshot of the whole page.

Chromium always starts with a fresh profile and every background service off; the tests only load
file:// or 127.0.0.1 URLs.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",  # a chroot or container may have a small or no /dev/shm
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--hide-scrollbars",
    "--force-color-profile=srgb",
    "--remote-debugging-pipe",
)
# Where the page tests keep their screenshots: $REPRODUCE_TEST_ARTIFACTS, else next to the logs
# tests/run.sh keeps ($REPRODUCE_TEST_LOG_DIR, default /var/log/reproduce-tests).
ARTIFACTS_ENV = "REPRODUCE_TEST_ARTIFACTS"


def chromium_path() -> str | None:
    """Debian's chromium (or another Chromium named by $REPRODUCE_CHROMIUM)."""
    named = os.environ.get("REPRODUCE_CHROMIUM")
    if named:
        return named
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def artifacts_dir(fallback: Path) -> Path:
    """The directory screenshots go to (created); `fallback` when the usual one is not writable."""
    env = os.environ.get(ARTIFACTS_ENV)
    if env:
        candidates = [Path(env)]
    else:
        log_dir = os.environ.get("REPRODUCE_TEST_LOG_DIR", "/var/log/reproduce-tests")
        candidates = [Path(log_dir) / "artifacts"]
    candidates.append(fallback)
    for path in candidates:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(path, os.W_OK):
            return path
    raise OSError(f"no writable artifacts directory among {candidates}")


class BrowserError(RuntimeError):
    pass


@dataclass
class PageLoad:
    """What one page load produced."""

    url: str
    console: list[dict[str, Any]] = field(default_factory=list)  # {type, text}
    exceptions: list[str] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)  # {level, source, text, url}
    requests: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions, log errors and warnings."""
        out = [f"console.{m['type']}: {m['text']}" for m in self.console if m["type"] in _BAD]
        out += [f"exception: {e}" for e in self.exceptions]
        out += [
            f"log {e.get('level')} ({e.get('source')}): {e.get('text')} {e.get('url') or ''}"
            for e in self.log
            if e.get("level") in ("error", "warning")
        ]
        return out

    def foreign_requests(self) -> list[str]:
        """Requests for anything but the page itself and data: URIs (a self-contained page has
        none)."""
        return [u for u in self.requests if u != self.url and not u.startswith("data:")]


_BAD = ("error", "warning", "assert")
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Chromium's helper processes (same process group) end shortly after it; the stragglers are
    killed so a test leaves nothing running."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        if time.monotonic() > deadline:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        time.sleep(0.05)


class Browser:
    """One headless Chromium process; `with Browser() as b: load = b.open(url)`."""

    def __init__(self, executable: str | None = None, *, timeout_s: float = 30.0) -> None:
        exe = executable or chromium_path()
        if not exe:
            raise BrowserError("no chromium found (Debian: apt-get install chromium)")
        self.timeout_s = timeout_s
        self.profile = Path(tempfile.mkdtemp(prefix="reproduce-chromium-"))
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium reads fd 3 and writes fd 4. The child's ends are first moved above 9 (so that
        # neither can be one of 3 and 4 when the two are set), then set by posix_spawn.
        high_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
        high_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.stderr_path = self.profile.parent / (self.profile.name + ".stderr")
        argv = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"]
        try:
            self.pid = os.posix_spawn(
                exe,
                argv,
                dict(os.environ),
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, str(self.stderr_path), _WRITE, 0o600),
                    (os.POSIX_SPAWN_DUP2, 1, 2),
                    (os.POSIX_SPAWN_DUP2, high_r, 3),
                    (os.POSIX_SPAWN_DUP2, high_w, 4),
                ],
                setsid=True,
            )
        finally:
            os.close(high_r)
            os.close(high_w)
        self._exit: int | None = None
        self._buf = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self._session: str | None = None

    # --- the protocol ---

    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            n = os.write(self._to_chrome, data)
            data = data[n:]
        return self._next_id

    def _read_one(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no answer from chromium within {self.timeout_s} s")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium closed its pipe; its output:\n{self.output()}")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, *, session: str | None = None) -> Any:
        """Send one command and wait for its answer; events read meanwhile are kept."""
        msg_id = self._send(method, params, session if session is not None else self._session)
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg = self._read_one(deadline)
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self._events.append(msg)

    def wait_event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout_s
        for i, ev in enumerate(self._events):
            if ev["method"] == method:
                return self._events.pop(i)
        while True:
            msg = self._read_one(deadline)
            if msg.get("method") == method:
                return msg
            if "method" in msg:
                self._events.append(msg)

    # --- pages ---

    def open(self, url: str, *, width: int = 1280, height: int = 900) -> PageLoad:
        """Load `url` in a new tab, wait for its load event and a settled frame."""
        if not (url.startswith("file://") or url.startswith("http://127.0.0.1")):
            raise BrowserError(f"only file:// and 127.0.0.1 URLs are loaded in tests, not {url}")
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}, session=""
        )["sessionId"]
        self._events.clear()
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.call("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")
        # One evaluation round trip after load: late console messages are read by then.
        self.call("Runtime.evaluate", {"expression": "document.readyState", "returnByValue": True})
        load = PageLoad(url)
        for ev in self._events:
            p = ev.get("params", {})
            if ev["method"] == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
                load.console.append({"type": p["type"], "text": text})
            elif ev["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                load.exceptions.append(
                    (d.get("exception") or {}).get("description") or d.get("text", "")
                )
            elif ev["method"] == "Log.entryAdded":
                load.log.append(p["entry"])
            elif ev["method"] == "Network.requestWillBeSent":
                load.requests.append(p["request"]["url"])
        return load

    def evaluate(self, expression: str) -> Any:
        """A JavaScript expression's value (JSON-able) in the open page."""
        out = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in out:
            raise BrowserError(f"{expression!r} threw: {out['exceptionDetails']}")
        return out["result"].get("value")

    def screenshot(self, path: Path, *, full_page: bool = True) -> Path:
        """A PNG of the open page (the whole page by default) written to `path`."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params["captureBeyondViewport"] = True
            params["clip"] = {
                "x": 0,
                "y": 0,
                "width": size["width"],
                "height": size["height"],
                "scale": 1,
            }
        data = self.call("Page.captureScreenshot", params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    # --- life ---

    def output(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def _reap(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for chromium to exit; True when it has."""
        deadline = time.monotonic() + timeout_s
        while self._exit is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._exit = status
                break
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def close(self) -> None:
        try:
            if self._exit is None:
                try:
                    self._session = None
                    self._send("Browser.close")
                except OSError:
                    pass
                if not self._reap(10):
                    os.killpg(self.pid, signal.SIGKILL)  # its own session: chromium's helpers too
                    self._reap(10)
            _wait_group_gone(self.pid, 5.0)
        finally:
            for fd in (self._to_chrome, self._from_chrome):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self.profile, ignore_errors=True)
            self.stderr_path.unlink(missing_ok=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
