"""Writing a file the way every file the launcher writes is written: atomically.

The promise (docs/architecture.md, "Run directory"): a reader sees the previous file or the new
one, never half of one; two writers of the same file at the same time (two `history --html`, a
nightly beside a `reproduce measure`) never share a temporary file, so neither fails and the last
rename wins; the bytes are on disk before the rename; the temporary file is never opened through
a symlink (O_EXCL|O_NOFOLLOW: a name someone planted is refused, not followed), and it is removed
when the write fails. Every page, report, record and run-directory file goes through
`write_atomic`; callers turn the OSError into their own error (RunDirUnwritable, BadInput).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def temp_name(path: Path) -> Path:
    """A temporary name beside PATH that no other writer (process or thread) will pick."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")


def write_atomic(
    path: Path, data: bytes | str, *, mode: int = 0o666, chmod: int | None = None
) -> None:
    """Write DATA to PATH through a unique temporary file, fsync, rename. The file is created
    with MODE less the umask, then set to exactly CHMOD (when given) before any byte is written.
    Raises OSError (the temporary file removed)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path = Path(path)
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            if chmod is not None:
                os.fchmod(fh.fileno(), chmod)
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
