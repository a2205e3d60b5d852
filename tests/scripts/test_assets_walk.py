"""Every walk of a tree a container could have written starts at a real directory (lstat'ed, never
followed) and fails closed on any entry it cannot read or does not understand
(docs/architecture.md, "The trust boundary": `safe_io.walk`).

Hostile trees, as a conversion or a rows build running as root could leave them in its
`$REPRODUCE_NEW_DIR`, handed to the real program (`node_assets.py adopt`, `seal`) as node.sh does:
the directory to adopt replaced by a symlink to the host user's files; a subdirectory the host
cannot read, holding a link, a FIFO and a file; a link nested deep whose name carries a forged
log line; a link and a FIFO deep in a tree to be sealed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.assets import tiny_recipe_raw
from support.node_assets import fake_conversion, make_spec
from support.node_scripts import SCRIPTS, load_script

store_mod = load_script("asset_store")
CANARY = "ssh-ed25519 AAAAC3Nza canary@outside\n"
# what root needs to read a directory of mode 000: without them it is as unreadable to the
# program as to the node's (non-root) host user
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def run(*args: str | Path, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(prefix or []), sys.executable, str(SCRIPTS / "node_assets.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def asset_path(spec: Path, name: str) -> Path:
    assets = json.loads(spec.read_text())["assets"]
    return Path(next(a for a in assets if a["name"] == name)["path"])


def snapshot(root: Path) -> dict[str, tuple[int, str | bytes | None]]:
    """Every entry under ROOT: its kind and a symlink's target or a file's bytes."""
    out: dict[str, tuple[int, str | bytes | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            what: str | bytes | None = None
            if stat.S_ISLNK(st.st_mode):
                what = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                what = p.read_bytes()
            out[str(p.relative_to(root))] = (stat.S_IFMT(st.st_mode), what)
    return out


def plant(directory: Path, canary: Path) -> None:
    """A symlink to the canary, a symlink to a directory, a FIFO and a socket in DIRECTORY."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "authorized_keys").symlink_to(canary)
    (directory / "dir-link").symlink_to(canary.parent, target_is_directory=True)
    os.mkfifo(directory / "fifo")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:  # through the directory's descriptor: a socket's path is at most 107 bytes
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(f"/proc/self/fd/{fd}/s")
    finally:
        os.close(fd)


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    path = tmp_path / "home" / ".ssh" / "authorized_keys"
    path.parent.mkdir(parents=True)
    path.write_text(CANARY)
    return path


@pytest.fixture
def spec(tiny, tmp_path: Path) -> Path:
    return make_spec(tmp_path, tiny_recipe_raw(*tiny))


# ---- the directory to adopt is a symlink: nothing behind it is walked, pruned, hashed or moved


@pytest.mark.parametrize("name", ["torch_dist", "rows"])
def test_adopt_from_a_symlink_to_the_hosts_files_touches_none_of_them(
    tiny, spec, tmp_path, canary, name
):
    victim = tmp_path / "home" / "ubuntu"  # the host user's home, as the container named it
    (victim / "work" / "deep").mkdir(parents=True)
    (victim / "notes.txt").write_text("mine\n")
    plant(victim / "work" / "deep", canary)
    # what a build with the recipe's rows would leave: bytes the old adopt took for the cache
    shutil.copy(tiny[1]["parquet"], victim / "rows.parquet")
    (victim / "release").mkdir()
    (victim / "release" / "__0_0.distcp").write_bytes(b"w" * 100)
    before = snapshot(victim)
    new_dir = tmp_path / "cache" / ".incoming" / "R-0"
    new_dir.mkdir(parents=True)
    src = new_dir / name
    src.symlink_to(victim)  # rm -rf $REPRODUCE_NEW_DIR/torch_dist; ln -s /home/ubuntu ...
    proc = run("adopt", "--spec", spec, name, "--from", src)
    assert proc.returncode == 1, proc.stderr
    assert "must be a real directory" in proc.stderr and "symlink" in proc.stderr, proc.stderr
    assert snapshot(victim) == before  # its links, FIFO and socket are still there, unread
    assert canary.read_text() == CANARY
    assert not os.path.lexists(asset_path(spec, name))
    assert src.is_symlink()  # not even the link was moved


# ---- a part of the tree the host cannot read: the check fails, it does not pass what it missed


@pytest.fixture
def no_dac() -> list[str]:
    """A prefix that runs the program without read access to a directory of mode 000."""
    if os.geteuid() != 0:
        return []  # the host user already cannot read it
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv to drop root's CAP_DAC_OVERRIDE")
    probe = subprocess.run([*NO_DAC, sys.executable, "-c", "pass"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"setpriv cannot drop CAP_DAC_OVERRIDE here: {probe.stderr!r}")
    return NO_DAC


@pytest.mark.parametrize("mode", [0o000, 0o300], ids=["mode-000", "write-search-only"])
def test_adopt_fails_on_a_directory_it_cannot_read(spec, tmp_path, canary, no_dac, mode):
    src = tmp_path / "cache" / ".incoming" / "R-0" / "torch_dist"
    (src / "release").mkdir(parents=True)
    (src / "release" / "__0_0.distcp").write_bytes(b"w" * 100)
    (src / "latest_checkpointed_iteration.txt").write_text("release")
    hidden = src / "release" / "a" / "b" / "hidden"
    plant(hidden, canary)
    (hidden / ".metadata").write_bytes(b"unhashed")
    hidden.chmod(mode)  # owned by the host's user, unreadable to it
    try:
        proc = run("adopt", "--spec", spec, "torch_dist", "--from", src, prefix=no_dac)
    finally:  # readable again, wherever it is now (an adopt that missed it moved it)
        moved = asset_path(spec, "torch_dist") / hidden.relative_to(src)
        for where in (hidden, moved):
            if where.is_dir():
                where.chmod(0o755)
    assert proc.returncode == 1, proc.stderr
    assert "cannot be checked whole" in proc.stderr and "hidden" in proc.stderr, proc.stderr
    assert "cannot read the directory" in proc.stderr, proc.stderr
    assert not os.path.lexists(asset_path(spec, "torch_dist"))  # nothing entered the cache
    assert sorted(os.listdir(hidden)) == [".metadata", "authorized_keys", "dir-link", "fifo", "s"]
    assert canary.read_text() == CANARY


# ---- a link nested deep whose name the walk does not understand: refused, never printed


def test_a_deep_link_whose_name_forges_a_log_line_is_refused_not_printed(spec, tmp_path, canary):
    src = tmp_path / "cache" / ".incoming" / "R-0" / "torch_dist"
    deep = src / "release" / "a" / "b" / "c" / "d" / "e" / "f"
    deep.mkdir(parents=True)
    (src / "release" / "__0_0.distcp").write_bytes(b"w" * 100)
    forged = "##reproduce stage=train event=end status=ok t=1"
    (deep / f"x\n{forged}\n").symlink_to(canary)  # the prune step used to print this name
    proc = run("adopt", "--spec", spec, "torch_dist", "--from", src)
    assert proc.returncode == 1, proc.stderr
    assert "control character" in proc.stderr, proc.stderr
    assert not any(line.startswith("##reproduce") for line in proc.stderr.splitlines())
    assert not os.path.lexists(asset_path(spec, "torch_dist"))
    assert canary.read_text() == CANARY


# ---- a link and a FIFO nested deep in a tree to be listed: refused, never left out in silence


def test_seal_refuses_a_tree_holding_a_deep_link_or_fifo(spec, canary):
    td = fake_conversion(spec)
    deep = td / "release" / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    os.mkfifo(deep / "fifo")
    proc = run("seal", "--spec", spec, "torch_dist")
    assert proc.returncode == 1, proc.stderr
    assert "fifo" in proc.stderr and "not a regular file" in proc.stderr, proc.stderr
    (deep / "fifo").unlink()
    (deep / "weights.distcp").symlink_to(canary)
    proc = run("seal", "--spec", spec, "torch_dist")
    assert proc.returncode == 1, proc.stderr
    assert "weights.distcp" in proc.stderr and "symlink" in proc.stderr, proc.stderr
    assert store_mod.read_local_manifest(td) is None  # no manifest vouches for the tree
    (deep / "weights.distcp").unlink()
    run_ok = run("seal", "--spec", spec, "torch_dist")
    assert run_ok.returncode == 0, run_ok.stderr  # and the clean tree seals
