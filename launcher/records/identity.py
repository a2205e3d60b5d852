"""Which launcher this is: its version and, from a git checkout, its commit.

Why a module: a run's record (run.json), a measurement's record (measure.json) and an attestation
all say which launcher made them, so that a reader can rebuild the exact code that judged a run
(docs/attestation.md). The commit is read only where the launcher runs from a git checkout; an
installed package has none, and then says so instead of guessing.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any


@functools.cache
def launcher_identity() -> dict[str, Any]:
    """{"version", "commit", "dirty", "commit_note"}: commit None (with the note) when unknown."""
    from launcher import __version__

    root = Path(__file__).resolve().parent.parent
    out: dict[str, Any] = {"version": __version__, "commit": None, "dirty": None}
    if not (root / ".git").exists():
        out["commit_note"] = "not a git checkout (an installed package): no commit recorded"
        return out
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError) as err:
        out["commit_note"] = f"git could not be asked: {err}"
        return out
    if head.returncode != 0:
        out["commit_note"] = f"git rev-parse failed: {head.stderr.strip()[:200]}"
        return out
    out["commit"] = head.stdout.strip()
    out["dirty"] = bool(status.stdout.strip()) if status.returncode == 0 else None
    return out
