"""A real terminal for the tests that care what stays on a person's screen: tmux.

Why tmux and not a pty read by hand: what a user sees is the terminal's screen after every
cursor move, erase and redraw of the live line, not the bytes written to it. tmux is a real
terminal emulator; `capture-pane` returns the screen as it is (with `-S -` the scrollback too),
so a line erased by a redraw is absent from it and a line drawn onto another is garbled there,
as on the user's screen. Each Screen has its own tmux server (its own socket under the test's
tmp_path), so tests never see each other's, nor a user's, sessions.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from pathlib import Path

EXIT_MARK = "[reproduce exited "


class Screen:
    def __init__(self, root: Path, *, width: int = 160, height: int = 48) -> None:
        if shutil.which("tmux") is None:
            raise RuntimeError("tmux is not installed (tests/run.sh installs it)")
        root.mkdir(parents=True, exist_ok=True)
        self.socket = root / "tmux.sock"
        self.config = root / "tmux.conf"
        self.config.write_text("set -g history-limit 50000\n")
        self.width, self.height = width, height

    def _tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["tmux", "-u", "-S", str(self.socket), *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=30,
        )

    def start(self, argv: list[str], env: dict[str, str], cwd: Path) -> Screen:
        """Run argv in a new terminal; when it ends, its exit code is printed and the pane
        stays, so the screen can be read after the end."""
        command = (
            f"cd {shlex.quote(str(cwd))} && {shlex.join(argv)}; echo '{EXIT_MARK}'$?']'; sleep 3600"
        )
        subprocess.run(
            ["tmux", "-u", "-S", str(self.socket), "-f", str(self.config), "new-session", "-d",
             "-x", str(self.width), "-y", str(self.height), "-s", "t", command],
            check=True, env={**env, "TERM": "xterm-256color", "LC_ALL": "C.UTF-8"}, timeout=30,
        )  # fmt: skip
        return self

    def screen(self) -> str:
        """The screen and its scrollback, as the user would scroll back through it."""
        return self._tmux("capture-pane", "-p", "-J", "-t", "t", "-S", "-").stdout

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "t", *keys)

    def wait_for(self, text: str, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            shown = self.screen()
            if text in shown:
                return shown
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never showed; the screen:\n{shown[-4000:]}")
            time.sleep(0.2)

    def exit_code(self, timeout: float = 300.0) -> int:
        shown = self.wait_for(EXIT_MARK, timeout)
        return int(shown.split(EXIT_MARK, 1)[1].split("]", 1)[0])

    def stop(self) -> None:
        self._tmux("kill-server", check=False)
