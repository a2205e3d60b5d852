#!/usr/bin/env python3
"""What a recipe leaves on its node for the next one: found, removed, or named.

Why: a nightly lends one node to several recipes in turn, and the training container runs the
recipe's code as root with `--ipc host`: the System V shared memory segments, semaphores and
message queues it makes, and its files in /dev/shm, are the host's and outlive the container
(gigabytes of GPU-sized segments in the next recipe's memory); and what it writes to its out/ is
root's, which the host's user cannot remove, so the next recipe's preflight finds a full disk.

Three commands:

- `snapshot --out FILE` (in the training container, first): the System V ids and /dev/shm names
  that exist now, so the container's end removes only what came after.
- `clean --before FILE [--out-dir DIR --owner UID:GID] [--exclusive]` (in the training
  container, its EXIT trap, as root in the host's IPC namespace): removes every shared memory
  segment new since the snapshot whose creator is of this container (a segment still attached
  goes when its last process detaches); with `--exclusive` (a node launched for this run alone)
  every new System V object and /dev/shm entry; names the rest (on a shared host another
  user's cannot be told from the recipe's). Then gives DIR (the run's out/) to the host's
  user (`--owner`, else DIR's own owner: the host made it), so the host can remove it. Prints
  one line, `reproduce: leftovers removed=N kept=M ...`, naming what it did not remove.
- `between --runs DIR --self RUN_DIR` (on the host, node.sh's start): every finished run
  directory beside this one (its `exit_code` written) gets its out/ emptied; one whose out/
  cannot be emptied (root's files: its container was killed before its end) is named and the
  run refused (exit 3): the disk the next recipe's preflight checks is not the run's to judge.

Exit codes: 0 done (also with nothing to do), 2 bad arguments, 3 leftovers that could not be
removed (`between`). The standard library only; python 3.8+.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import sys
from pathlib import Path

IPC_RMID = 0
SYSVIPC = {"shm": "/proc/sysvipc/shm", "sem": "/proc/sysvipc/sem", "msg": "/proc/sysvipc/msg"}
DEV_SHM = Path("/dev/shm")
MAX_NAMES = 100_000  # a snapshot holds at most this many names of each kind


def sysv_objects() -> dict[str, dict[int, int]]:
    """kind -> {id: its creator's pid as this PID namespace sees it (0: a process outside it;
    sem and msg say none, 0)}, as /proc/sysvipc has them."""
    found: dict[str, dict[int, int]] = {}
    for kind, path in SYSVIPC.items():
        objects: dict[int, int] = {}
        try:
            with open(path, encoding="ascii", errors="replace") as fh:
                header = fh.readline().split()
                for line in fh:
                    words = line.split()
                    if len(words) != len(header) or len(objects) >= MAX_NAMES:
                        continue
                    row = dict(zip(header, words))
                    ident = row.get("shmid") or row.get("semid") or row.get("msqid")
                    if ident is not None and ident.isdigit():
                        cpid = row.get("cpid", "0")
                        objects[int(ident)] = int(cpid) if cpid.isdigit() else 0
        except OSError:
            pass
        found[kind] = objects
    return found


def shm_names() -> list[str]:
    try:
        with os.scandir(DEV_SHM) as entries:
            return sorted(e.name for _, e in zip(range(MAX_NAMES), entries))
    except OSError:
        return []


def snapshot(out: Path) -> int:
    state = {
        "sysv": {k: sorted(v) for k, v in sysv_objects().items()},
        "dev_shm": shm_names(),
    }
    out.write_text(json.dumps(state))
    return 0


def _rmid(kind: str, ident: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    if kind == "shm":
        return libc.shmctl(ident, IPC_RMID, None) == 0
    if kind == "sem":
        return libc.semctl(ident, 0, IPC_RMID) == 0
    return libc.msgctl(ident, IPC_RMID, None) == 0


def _remove(path: Path) -> bool:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        return True
    except OSError:
        return False


def clean(before: Path, out_dir: Path | None, owner: str | None, exclusive: bool) -> int:
    """Remove what is new since the snapshot and this container's: a shared memory segment
    whose creator is in this container's PID namespace (the kernel keeps the creator's pid);
    with `exclusive` (a node launched for this run alone) every new object and /dev/shm entry.
    On a shared host the rest cannot be told from another user's: named, not removed."""
    try:
        state = json.loads(before.read_text())
    except (OSError, ValueError):
        print("reproduce: leftovers: no snapshot to compare with; nothing removed")
        return 0
    old = {k: set(v) for k, v in (state.get("sysv") or {}).items()}
    removed: list[str] = []
    kept: list[str] = []
    for kind, objects in sysv_objects().items():
        for ident, cpid in objects.items():
            if ident in old.get(kind, set()):
                continue
            ours = exclusive or (kind == "shm" and cpid != 0)
            # a segment still attached (Ray's, NCCL's, ending with the container) is marked:
            # the kernel removes it when its last process detaches
            (removed if ours and _rmid(kind, ident) else kept).append(f"{kind}:{ident}")
    known = set(state.get("dev_shm") or [])
    for name in shm_names():
        if name not in known:
            ours = exclusive and _remove(DEV_SHM / name)
            (removed if ours else kept).append(f"/dev/shm/{name}")
    if out_dir is not None and out_dir.is_dir() and not out_dir.is_symlink():
        ids = owner or f"{out_dir.stat().st_uid}:{out_dir.stat().st_gid}"  # the host's mkdir
        uid, _, gid = ids.partition(":")
        for root, dirs, files in os.walk(out_dir):
            for name in [*dirs, *files, "."]:
                try:
                    os.lchown(os.path.join(root, name), int(uid), int(gid or uid))
                except (OSError, ValueError):
                    pass
    shown = " ".join(kept[:20])
    print(f"reproduce: leftovers removed={len(removed)} kept={len(kept)} {shown}".rstrip())
    return 0


def between(runs: Path, own: Path) -> int:
    """Empty the out/ of every finished run beside `own`; 3 naming those that cannot be."""
    stuck: list[str] = []
    try:
        siblings = sorted(p for p in runs.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError as err:  # the runs of this work_dir are this user's: not listing them is news
        print(f"reproduce: refusing to start: cannot list {runs}: {err.strerror}", file=sys.stderr)
        return 3
    for run in siblings:
        if run.resolve() == own.resolve() or not (run / "exit_code").is_file():
            continue
        out = run / "out"
        if out.is_symlink() or not out.is_dir():
            continue
        try:
            entries = sorted(out.iterdir())
        except OSError:
            stuck.append(str(out))
            continue
        left = [str(e) for e in entries if not _remove(e)]
        stuck += left
        if entries and not left:
            print(f"reproduce: emptied the out/ of the finished run {run.name}")
    if stuck:
        print(
            "reproduce: refusing to start: a finished run on this node left files that are not "
            f"this user's to remove (its container did not reach its end): {', '.join(stuck[:8])}"
            "; remove them as root (sudo rm -rf), then run again",
            file=sys.stderr,
        )
        return 3
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot")
    snap.add_argument("--out", type=Path, required=True)
    cl = sub.add_parser("clean")
    cl.add_argument("--before", type=Path, required=True)
    cl.add_argument("--out-dir", type=Path)
    cl.add_argument("--owner")
    cl.add_argument("--exclusive", action="store_true")
    bt = sub.add_parser("between")
    bt.add_argument("--runs", type=Path, required=True)
    bt.add_argument("--self", dest="own", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "snapshot":
        return snapshot(args.out)
    if args.command == "clean":
        return clean(args.before, args.out_dir, args.owner, args.exclusive)
    return between(args.runs, args.own)


if __name__ == "__main__":
    sys.exit(main())
