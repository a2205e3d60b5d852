"""Run the real `reproduce` command as a user would: a fresh process, its exit code and output."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support.paths import REPO
from support.paths import SEED as SEED  # re-exported: the tests import it from here

FIXTURES = REPO / "tests" / "data" / "recipes"
FOUR_NODES = FIXTURES / "qwen3-30b-a3b-h200-4node.yaml"  # the multi-node fixture recipe


@dataclass
class Result:
    code: int
    out: str
    err: str


def reproduce(
    *args: str | Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
) -> Result:
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", *map(str, args)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or REPO,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)
