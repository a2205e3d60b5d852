"""Helpers for the operator tests: an AWS endpoint that records every request, and a terminal.

`RecordingEndpoint` stands where AWS would be (AWS_ENDPOINT_URL): every request boto3 sends
reaches it and is kept; each is answered with an AWS error, so a launch that does start fails at
its first call. "Nothing was sent" is then a fact the test can assert, whatever the call was.
`run_in_terminal` runs `reproduce` with a pseudo-terminal as stdin, stdout and stderr (a person
at a terminal), answering the cost gate's question with the given text.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from support.aws import FAKE_ENV
from support.paths import REPO
from support.paths import SEED as SEED  # re-exported: the tests import it from here

ERROR_XML = (
    b'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error>'
    b"<Code>UnauthorizedOperation</Code><Message>the test's recording endpoint</Message>"
    b"</Error></Errors><RequestID>x</RequestID></Response>"
)


@dataclass
class RecordingEndpoint:
    requests: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def start(self) -> RecordingEndpoint:
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode(errors="replace")
                target = self.headers.get("X-Amz-Target") or ""
                seen.append(f"{self.path} {target} {body[:200]}")
                self.send_response(403)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(ERROR_XML)))
                self.end_headers()
                self.wfile.write(ERROR_XML)

            do_GET = do_POST  # noqa: N815

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def aws_env(endpoint: RecordingEndpoint | None, tmp_path: Path, *, credentials: bool = True):
    """The CLI's environment: this endpoint as AWS, fake (or no) credentials, nothing else."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    if credentials:
        env.update(FAKE_ENV)
    env.update(
        {
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
            "REPRODUCE_STATE_DIR": str(tmp_path / "state"),
            "PYTHONPATH": str(REPO),
        }
    )
    if endpoint is not None:
        env["AWS_ENDPOINT_URL"] = endpoint.url
    return env


def run_piped(args: list[str], env: dict[str, str], timeout: float = 120):
    """`reproduce ARGS` with no terminal anywhere (a pipe, cron, CI)."""
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def run_in_terminal(
    args: list[str],
    env: dict[str, str],
    *,
    answer: str | None = None,
    prompt: bytes = b"[y/N]",
    timeout: float = 120,
    on_prompt: Callable[[str], None] | None = None,
) -> tuple[int, str]:
    """`reproduce ARGS` on a pseudo-terminal; `answer` is typed once `prompt` shows (and
    `on_prompt` gets what was on the screen then)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**env, "COLUMNS": "160", "TERM": "xterm"},
        cwd=REPO,
        start_new_session=True,
    )
    os.close(slave)
    out = b""
    answered = answer is None
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    chunk = b""
                if not chunk:
                    break
                out += chunk
                if not answered and prompt in out:
                    if on_prompt is not None:
                        on_prompt(out.decode(errors="replace"))
                    os.write(master, answer.encode())  # type: ignore[union-attr]
                    answered = True
            elif proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"reproduce did not end; it printed:\n{out.decode()}")
    finally:
        os.close(master)
    return proc.wait(timeout=30), out.decode(errors="replace")


def no_runs(runs: Path) -> bool:
    """Nothing at all under the runs root: no run directory, no history."""
    return not runs.exists() or not any(runs.iterdir())
