"""A real local registry (Debian's docker-registry) and a tiny test image pushed to it by digest.

The image is `docker import` of a root filesystem assembled here: the stand-in miles tree at
/root/miles, /etc/passwd, /tmp, and merged-/usr symlinks. It carries no programs: containers
bind-mount this host's /usr, the venv and the venv's base Python read-only (`run_args()`), which
keeps the image a few kilobytes while bash, python3 and the Ray CLI work inside it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .ports import free_port, wait_for_port

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDIN_MILES = REPO_ROOT / "tests" / "standin_miles"
REGISTRY_BIN = "/usr/bin/docker-registry"


def docker(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=check, timeout=timeout
    )


def dockerd_running() -> bool:
    try:
        return (
            docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=20).returncode
            == 0
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


@dataclass
class Registry:
    root: Path
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Registry:
        self.port = self.port or free_port()
        storage = self.root / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        config = self.root / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n"
        )
        log = open(self.root / "registry.log", "ab")
        self.proc = subprocess.Popen(
            [REGISTRY_BIN, "serve", str(config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL
        )
        wait_for_port(self.port)
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.address}/v2/", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    tar.addfile(info)


def _add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def build_rootfs(target: Path, miles_tree: Path = STANDIN_MILES, marker: str = "") -> Path:
    """A root filesystem tarball holding the stand-in miles tree at /root/miles."""
    with tarfile.open(target, "w") as tar:
        for d in (
            "root",
            "etc",
            "usr",
            "dev",
            "proc",
            "sys",
            "run",
            "var",
            "var/tmp",
            "root/miles",
        ):
            _add_dir(tar, d)
        _add_dir(tar, "tmp", 0o1777)
        for link, dest in (
            ("bin", "usr/bin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
            ("sbin", "usr/sbin"),
        ):
            _add_link(tar, link, dest)
        _add_file(
            tar,
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        )
        _add_file(tar, "etc/group", b"root:x:0:\nnogroup:x:65534:\n")
        _add_file(tar, "etc/hosts", b"127.0.0.1 localhost\n")
        _add_file(tar, "etc/reproduce-test-image", (marker or "standin").encode() + b"\n")
        for path in sorted(miles_tree.rglob("*")):
            if "__pycache__" in path.parts:
                continue
            rel = "root/miles/" + path.relative_to(miles_tree).as_posix()
            if path.is_dir():
                _add_dir(tar, rel)
            else:
                _add_file(tar, rel, path.read_bytes(), path.stat().st_mode & 0o777)
    return target


def run_args() -> list[str]:
    """docker run options that lend the container this host's programs, read-only."""
    venv = Path(sys.prefix)
    mounts = [Path("/usr"), venv]
    base = Path(sys.base_prefix).resolve()
    if not str(base).startswith("/usr/") and base != Path("/usr"):
        mounts.append(base)
    args: list[str] = []
    for m in mounts:
        args += ["-v", f"{m}:{m}:ro"]
    args += ["-e", f"PATH={venv}/bin:/usr/local/bin:/usr/bin:/bin"]
    return args


@dataclass(frozen=True)
class TestImage:
    repo: str  # 127.0.0.1:PORT/reproduce-test/standin
    digest: str  # sha256:...

    @property
    def ref(self) -> str:
        return f"{self.repo}@{self.digest}"


def push_test_image(
    registry: Registry, workdir: Path, tag: str = "v1", marker: str = ""
) -> TestImage:
    """Import the rootfs, push it, and drop the local copy so that tests really pull by digest."""
    tarball = build_rootfs(workdir / f"rootfs-{tag}.tar", marker=marker or tag)
    repo = f"{registry.address}/reproduce-test/standin"
    docker("import", str(tarball), f"{repo}:{tag}")
    docker("push", f"{repo}:{tag}")
    digests = json.loads(
        docker("image", "inspect", "--format", "{{json .RepoDigests}}", f"{repo}:{tag}").stdout
    )
    digest = next(d.split("@", 1)[1] for d in digests if d.startswith(repo + "@"))
    docker("rmi", "-f", f"{repo}:{tag}", check=False)
    return TestImage(repo, digest)


def containers_named(name: str) -> list[str]:
    return docker("ps", "-aq", "--filter", f"name=^{name}$").stdout.split()


def have_registry_binary() -> bool:
    return os.path.exists(REGISTRY_BIN) and shutil.which("docker") is not None
