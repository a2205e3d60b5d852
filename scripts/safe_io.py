#!/usr/bin/env python3
"""Opening files in the cache, the store and shared directories: never through a symlink, never
into a file someone else made. The one place of the node's trust-boundary promise
(docs/architecture.md, "The trust boundary").

Why: the training container (the recipe's code, as root) and the other writers of a shared store
can leave a symlink or a hard link where the host is about to write (`FILE.partial ->
~/.ssh/authorized_keys`), or swap a file for a link to one they want read. So every host-side
program here:

- reads with O_NOFOLLOW|O_NONBLOCK and refuses what is not a regular file (and, in our own cache,
  what is not ours);
- writes only into a file it has just created (O_CREAT|O_EXCL|O_NOFOLLOW, a fresh random name),
  then renames it into place (rename replaces a link, never writes through it);
- continues a partial download only when the partial file is a regular file of ours with one
  link, else removes the name (unlink never follows) and starts again;
- creates directories one component at a time, refusing a component that is a symlink;
- walks a tree (`walk`, the one walk of every host-side program over a tree a container could
  have written) from a real directory (lstat'ed, never followed: a root that is a symlink is
  refused), descending only into what lstat says is a directory, opened without following it,
  and fails closed on any entry it cannot read or does not understand (a directory it may not
  list, a name that is not printable UTF-8, another file system mounted below the root).

Standard library only; python 3.8 (the node's host python3).
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, NamedTuple, Union

CHUNK = 1 << 20
PathLike = Union[str, Path]
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
MAX_DEPTH = 64  # directories below a walked root; one open descriptor each while walked


class UnsafeFile(OSError):
    """A path the host will not read or write: a symlink, not a regular file, not ours, or a
    file with other names (hard links). An OSError, so a caller's disk-error path reports it."""

    def __init__(self, path: PathLike, why: str):
        super().__init__(errno.EPERM, f"refusing {path}: {why}", str(path))
        self.why = why

    def __str__(self) -> str:
        return str(self.strerror)


def _why(st: os.stat_result, *, owned: bool, single: bool) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "it is a symlink"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if owned and st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if single and st.st_nlink != 1:
        return f"it has {st.st_nlink} names (hard links)"
    return None


def open_read(path: PathLike, *, owned: bool = True) -> BinaryIO:
    """PATH for reading, only when it is a regular file (ours when OWNED); never a symlink."""
    try:
        fd = os.open(str(path), _READ)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK):
            raise UnsafeFile(path, "it is a symlink") from None
        raise
    try:
        why = _why(os.fstat(fd), owned=owned, single=False)
        if why:
            raise UnsafeFile(path, why)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: PathLike, *, owned: bool = True, limit: int = 64 << 20) -> bytes:
    with open_read(path, owned=owned) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(path, f"larger than {limit} bytes")
    return data


def read_text(path: PathLike, *, owned: bool = True) -> str:
    return read_bytes(path, owned=owned).decode("utf-8")


def sha256_of(path: PathLike, *, owned: bool = True) -> str:
    h = hashlib.sha256()
    with open_read(path, owned=owned) as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def lstat_regular(path: PathLike, *, owned: bool = True) -> os.stat_result | None:
    """The file's lstat when it is a regular file (ours when OWNED), None when absent;
    UnsafeFile when it is anything else."""
    try:
        st = os.lstat(str(path))
    except FileNotFoundError:
        return None
    why = _why(st, owned=owned, single=False)
    if why:
        raise UnsafeFile(path, why)
    return st


def make_dirs(path: PathLike, *, base: PathLike | None = None, mode: int = 0o755) -> Path:
    """mkdir -p that never follows a symlink below BASE (default: PATH's parent): each component
    under BASE is lstat'ed, and one that is a symlink (or not a directory) is refused. BASE and
    what is above it are the caller's trusted root (node.sh checks the cache's and the run dir's
    owners and modes; a store's root is the operator's)."""
    p = Path(os.path.abspath(str(path)))
    b = Path(os.path.abspath(str(base))) if base is not None else p.parent
    if b != p and b not in p.parents:
        b = p.parent
    os.makedirs(str(b), exist_ok=True)
    for part in p.relative_to(b).parts:
        b = b / part
        try:
            st = os.lstat(str(b))
        except FileNotFoundError:
            try:
                os.mkdir(str(b), mode)
            except FileExistsError:
                pass
            st = os.lstat(str(b))
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeFile(b, "a directory was expected (a symlink or file is in its place)")
    return p


def create_new(
    dest: PathLike, *, mode: int = 0o644, base: PathLike | None = None
) -> tuple[BinaryIO, Path]:
    """A fresh, empty file beside DEST (O_CREAT|O_EXCL|O_NOFOLLOW, a random name), for writing;
    `commit` renames it to DEST. Nothing that was at DEST is opened."""
    dest = Path(dest)
    make_dirs(dest.parent, base=base)
    for _ in range(8):
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(str(tmp), _NEW, mode)
        except FileExistsError:
            continue
        return os.fdopen(fd, "wb"), tmp
    raise UnsafeFile(dest, "could not create a fresh temporary file beside it")


def commit(f: BinaryIO, tmp: Path, dest: PathLike) -> None:
    """fsync and close F, rename TMP to DEST (replacing a link there, never following it)."""
    f.flush()
    os.fsync(f.fileno())
    ino = os.fstat(f.fileno()).st_ino
    f.close()
    os.replace(str(tmp), str(dest))
    if os.lstat(str(dest)).st_ino != ino:  # someone swapped the name between rename and now
        raise UnsafeFile(dest, "it changed while it was being written")


def write_atomic(
    dest: PathLike, data: bytes, *, mode: int = 0o644, base: PathLike | None = None
) -> None:
    f, tmp = create_new(dest, mode=mode, base=base)
    try:
        f.write(data)
        commit(f, tmp, dest)
    except BaseException:
        f.close()
        _unlink(tmp)
        raise


def open_resume(
    path: PathLike,
    *,
    log: Callable[[str], None] | None = None,
    base: PathLike | None = None,
) -> tuple[BinaryIO, int]:
    """PATH opened to continue writing it (a partial download or copy) and its current size.
    Only a regular file of ours with one name is continued; anything else at PATH (a symlink, a
    FIFO, another user's file, a hard link) is removed and a fresh file created in its place."""
    path = Path(path)
    make_dirs(path.parent, base=base)
    try:
        fd = os.open(str(path), os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_APPEND)
    except FileNotFoundError:
        fd = -1
    except OSError as err:
        fd = -1
        why = "it is a symlink" if err.errno == errno.ELOOP else f"unusable ({err.strerror})"
        if not _remove_unsafe(path, why, log):
            raise
    if fd >= 0:
        unsafe = _why(os.fstat(fd), owned=True, single=True)
        if unsafe is None:
            os.set_blocking(fd, True)
            return os.fdopen(fd, "r+b"), os.fstat(fd).st_size
        os.close(fd)
        _remove_unsafe(path, unsafe, log)
    fd = os.open(str(path), (_NEW & ~os.O_WRONLY) | os.O_RDWR, 0o644)
    return os.fdopen(fd, "r+b"), 0


def _remove_unsafe(path: Path, why: str, log: Callable[[str], None] | None) -> bool:
    try:
        st = os.lstat(str(path))
    except FileNotFoundError:
        return True
    if stat.S_ISDIR(st.st_mode):
        raise UnsafeFile(path, "a directory is in its place")
    os.unlink(str(path))  # removes the name itself: a symlink's target is never touched
    if log:
        log(f"{path}: {why}; removed it and started again (nothing was written through it)")
    return True


def _unlink(path: PathLike) -> None:
    try:
        os.unlink(str(path))
    except FileNotFoundError:
        pass


# ------------------------------------------------------------------------------------------------
# Walking a tree: the one walk of every host-side program over what a container could have written


class TreeEntry(NamedTuple):
    """One entry below a walked root: REL ('/'-separated, relative to the root), NAME, ST (its
    lstat: never followed) and DIR_FD, the open directory that holds it, valid only until the
    walk moves on (for a readlink or an unlink by name, which never go through a path the tree
    could have changed)."""

    rel: str
    name: str
    st: os.stat_result
    dir_fd: int


_KINDS = frozenset(  # Linux's seven kinds of file; any other is one the walk does not understand
    [
        stat.S_IFDIR,
        stat.S_IFREG,
        stat.S_IFLNK,
        stat.S_IFIFO,
        stat.S_IFSOCK,
        stat.S_IFCHR,
        stat.S_IFBLK,
    ]
)


def real_dir(path: PathLike) -> os.stat_result:
    """PATH's lstat when it is a real directory; UnsafeFile when it is a symlink (to a directory
    or not: never followed), anything else, or absent."""
    try:
        st = os.lstat(str(path))
    except FileNotFoundError:
        raise UnsafeFile(path, "no such directory") from None
    if stat.S_ISLNK(st.st_mode):
        target = link_target(str(path))
        raise UnsafeFile(path, f"it is a symlink (to {target}), not a real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFile(path, "not a directory")
    return st


def link_target(name: str, dir_fd: int | None = None) -> str:
    """What the symlink NAME says (never followed), printable: for a message only."""
    try:
        text = os.readlink(name, dir_fd=dir_fd)
    except OSError as err:
        return f"? ({err.strerror})"
    return ascii(text)[1:-1]


def walk(root: PathLike) -> Iterator[TreeEntry]:
    """Every entry below ROOT (ROOT itself excluded; a directory before what it holds; names
    sorted). ROOT must be a real directory (`real_dir`): a symlink there is refused, never
    followed. Only what lstat says is a directory is entered, opened with O_NOFOLLOW relative to
    its parent and checked to be the directory lstat saw. UnsafeFile, never a silent skip, for
    an entry it cannot read (a directory it may not open or list, an entry it cannot lstat) or
    does not understand (a name that is not printable UTF-8, a file type it does not know,
    another file system mounted below ROOT, more than MAX_DEPTH directories deep): a caller
    that checks a tree never passes what it did not see. Entries may be unlinked by name
    (`os.unlink(e.name, dir_fd=e.dir_fd)`) while the walk is at them."""
    root = Path(root)
    top = real_dir(root)
    stack = [_open_dir(root, str(root), None, top, "")]
    try:
        while stack:
            fd, prefix, names = stack[-1]
            name = next(names, None)
            if name is None:
                stack.pop()
                os.close(fd)
                continue
            rel = prefix + name
            bad = _bad_name(name)
            if bad:
                raise UnsafeFile(root / ascii(rel)[1:-1], bad)
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as err:
                raise UnsafeFile(root / rel, f"cannot lstat it ({err.strerror})") from None
            if stat.S_IFMT(st.st_mode) not in _KINDS:
                raise UnsafeFile(root / rel, f"a file of a type not known here ({st.st_mode:o})")
            yield TreeEntry(rel, name, st, fd)
            if not stat.S_ISDIR(st.st_mode):
                continue
            if st.st_dev != top.st_dev:
                raise UnsafeFile(root / rel, "another file system is mounted there")
            if len(stack) >= MAX_DEPTH:
                raise UnsafeFile(root / rel, f"more than {MAX_DEPTH} directories deep")
            stack.append(_open_dir(root / rel, name, fd, st, rel + "/"))
    finally:
        while stack:
            os.close(stack.pop()[0])


def _open_dir(
    shown: Path, name: str, dir_fd: int | None, st: os.stat_result, prefix: str
) -> tuple[int, str, Iterator[str]]:
    """The directory NAME (in DIR_FD) opened without following it, when it still is the one ST
    describes, with its sorted names; UnsafeFile when it cannot be opened or listed."""
    try:
        fd = os.open(name, _DIR, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeFile(
                shown, "it changed while it was walked (no longer a directory)"
            ) from None
        raise UnsafeFile(shown, f"cannot read the directory ({err.strerror})") from None
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise UnsafeFile(shown, "it changed while it was walked (another directory)")
        try:
            names = sorted(os.listdir(fd))
        except OSError as err:
            raise UnsafeFile(shown, f"cannot list the directory ({err.strerror})") from None
    except BaseException:
        os.close(fd)
        raise
    return fd, prefix, iter(names)


def _bad_name(name: str) -> str | None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not UTF-8"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "its name holds a control character"
    return None


def check_tree(root: PathLike, *, owned: bool = True) -> list:
    """What under ROOT is neither a real directory nor a regular file of ours with one name
    (symlinks, devices, FIFOs, hard links, other users' files): empty when the tree is clean.
    Run on what a container produced before the host hashes it and moves it into the cache.
    UnsafeFile (from `walk`) when ROOT is no real directory or a part of it cannot be read."""
    bad = []
    for e in walk(root):
        if stat.S_ISDIR(e.st.st_mode):
            if owned and e.st.st_uid != os.geteuid():
                bad.append(f"{e.rel}: a directory owned by uid {e.st.st_uid}")
            continue
        why = _why(e.st, owned=owned, single=True)
        if stat.S_ISLNK(e.st.st_mode):
            why = f"a symlink to {link_target(e.name, e.dir_fd)}"
        if why:
            bad.append(f"{e.rel}: {why}")
    return bad


def prune_links(root: PathLike) -> list[str]:
    """Remove every symlink, FIFO, socket and device under ROOT (unlink by name in its open
    directory: never followed) and return what was removed. Run on what a container made before
    `check_tree`: such an entry is never part of a checkpoint, and a link named like the manifest
    the host writes next must not be there when it writes it. UnsafeFile (from `walk`) when ROOT
    is no real directory (then nothing is removed) or a part of it cannot be read."""
    removed = []
    for e in walk(root):
        if stat.S_ISDIR(e.st.st_mode) or stat.S_ISREG(e.st.st_mode):
            continue
        what = (
            f"a symlink to {link_target(e.name, e.dir_fd)}"
            if stat.S_ISLNK(e.st.st_mode)
            else "special"
        )
        os.unlink(e.name, dir_fd=e.dir_fd)
        removed.append(f"{e.rel} ({what})")
    return removed
