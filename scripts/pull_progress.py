#!/usr/bin/env python3
"""`docker pull IMAGE` with the bytes it has pulled printed as the launcher's progress lines.

Why: an image of 15 GB takes minutes to pull, and `docker pull` without a terminal prints only
"Pulling fs layer" / "Pull complete" per layer, no bytes. Run under a pseudo-terminal, docker
prints each layer's "Downloading [==>  ] 12.3MB/1.2GB"; this program reads those, adds them up
over the layers, and prints

    ##reproduce progress stage=image done=N total=M unit=bytes item='3/12 layers'

at most once a second and once at the end (the format: launcher/plan/protocol.py, Progress).
The image's total comes from its manifest (`docker manifest inspect -v`, the compressed layer
sizes docker downloads) when the registry answers; otherwise from the layers' own totals once
docker has shown every one. docker's own status lines are passed on once per change, without the
redrawn bars, so the stage log reads like a plain pull. The exit status is docker's.

Usage: pull_progress.py IMAGE [--stage NAME]   (python 3.8+, the standard library only)
"""

from __future__ import annotations

import codecs
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time

INTERVAL_S = 1.0
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_LAYER = re.compile(r"^([0-9a-f]{12}): (.*)$")
_AMOUNT = re.compile(r"(\d+(?:\.\d+)?)\s*([kMGTP]?B)\s*/\s*(\d+(?:\.\d+)?)\s*([kMGTP]?B)")
_SCALE = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15}
# A layer in one of these states has all its bytes on the node.
_HAVE_ALL = (
    "Download complete",
    "Verifying Checksum",
    "Extracting",
    "Pull complete",
    "Already exists",
)


def size_of(number: str, unit: str) -> int:
    return int(float(number) * _SCALE[unit])


def _arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def manifest_sizes(inspected: object, arch: str = "") -> dict:
    """{short layer id: compressed size} from `docker manifest inspect -v` output (one
    manifest, or a list of them for a multi-platform image: linux/<this machine's arch>)."""
    arch = arch or _arch()
    entries = inspected if isinstance(inspected, list) else [inspected]
    chosen = None
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        platform_ = (entry.get("Descriptor") or {}).get("platform") or {}
        if len(entries) == 1 or (
            platform_.get("os") == "linux" and platform_.get("architecture") == arch
        ):
            chosen = entry
            break
    if chosen is None:
        return {}
    manifest = chosen.get("SchemaV2Manifest") or chosen.get("OCIManifest") or {}
    sizes = {}
    for layer in manifest.get("layers") or []:
        digest, size = str(layer.get("digest", "")), layer.get("size")
        if ":" in digest and isinstance(size, int) and size >= 0:
            sizes[digest.split(":", 1)[1][:12]] = size
    return sizes


def image_sizes(image: str, docker: str = "docker") -> dict:
    """The layer sizes from the registry, or {} when it does not say (old docker, no access)."""
    for extra in ([], ["--insecure"]):
        try:
            out = subprocess.run(
                [docker, "manifest", "inspect", "-v", *extra, image],
                capture_output=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if out.returncode == 0:
            try:
                return manifest_sizes(json.loads(out.stdout.decode(errors="replace")))
            except ValueError:
                return {}
    return {}


class Pull:
    """The layers seen so far, what each has pulled, and the lines to pass on."""

    def __init__(self, stage: str, sizes: dict) -> None:
        self.stage = stage
        self.sizes = dict(sizes)  # from the manifest: exact
        self.totals: dict[str, int] = {}  # from docker's "x/y": rounded, only without a manifest
        self.done: dict[str, int] = {}
        self.status: dict[str, str] = {}

    def feed(self, text: str) -> list:
        """Screen text from docker -> the status lines worth passing on (changes only)."""
        out = []
        for raw in re.split(r"[\r\n]+", _ANSI.sub("", text)):
            line = raw.strip()
            if not line:
                continue
            match = _LAYER.match(line)
            if match is None:
                out.append(line)
                continue
            layer, state = match.groups()
            word = state.split(" [")[0].split("  ")[0].strip()
            amount = _AMOUNT.search(state)
            if word == "Downloading" and amount:
                self.done[layer] = size_of(*amount.group(1, 2))
                self.totals[layer] = size_of(*amount.group(3, 4))
            elif word.startswith(_HAVE_ALL):
                self.done[layer] = self._size(layer)
            else:
                self.done.setdefault(layer, 0)
            if self.status.get(layer) != word:  # a redrawn bar keeps its word: said once
                self.status[layer] = word
                out.append(f"{layer}: {word}")
        return out

    def _size(self, layer: str) -> int:
        return self.sizes.get(layer, self.totals.get(layer, self.done.get(layer, 0)))

    def total(self):
        if self.sizes:
            return sum(self.sizes.values())
        if self.done and all(k in self.totals or self._complete(k) for k in self.done):
            return sum(self._size(k) for k in self.done)
        return None

    def _complete(self, layer: str) -> bool:
        return str(self.status.get(layer, "")).startswith(_HAVE_ALL)

    def line(self, final: bool = False) -> str:
        total = self.total()
        done = sum(self.done.values())
        if total is not None:
            done = min(done, total)
            if final:
                done = total
        layers = len(self.sizes) or len(self.done)
        complete = sum(1 for k in self.done if self._complete(k))
        words = ["stage=" + shlex.quote(self.stage), f"done={done}"]
        if total is not None:
            words.append(f"total={total}")
        words.append("unit=bytes")
        if layers:
            words.append("item=" + shlex.quote(f"{complete}/{layers} layers"))
        return "##reproduce progress " + " ".join(words)


def emit(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def pull(image: str, stage: str = "image", docker: str = "docker") -> int:
    """Run docker pull under a pseudo-terminal, printing its status and the progress lines."""
    import pty

    state = Pull(stage, image_sizes(image, docker))
    master, slave = pty.openpty()
    try:
        import fcntl
        import struct
        import termios

        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    except (ImportError, OSError):
        pass  # a narrower screen: docker drops the bar, not the numbers
    proc = subprocess.Popen(
        [docker, "pull", image], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave
    )
    os.close(slave)
    last = None  # the last progress line's time; None: none yet (the first is shown at once)
    pending = ""
    # a read may end inside a multi-byte character: its bytes wait for the rest of it
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: docker closed the terminal (it exited)
            data = b""
        if not data:
            break
        text = pending + decoder.decode(data)
        cut = max(text.rfind("\n"), text.rfind("\r"))
        pending, text = text[cut + 1 :], text[: cut + 1]
        for line in state.feed(text):
            emit(line)
        now = time.monotonic()
        if (last is None or now - last >= INTERVAL_S) and state.done:
            emit(state.line())
            last = now
    for line in state.feed(pending + decoder.decode(b"", final=True)):
        emit(line)
    os.close(master)
    code = proc.wait()
    if code == 0:
        emit(state.line(final=True))
    return code


def main(argv: list) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    stage = "image"
    if len(argv) >= 3 and argv[1] == "--stage":
        stage = argv[2]
    return pull(argv[0], stage)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
