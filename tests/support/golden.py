"""Golden files: rendered text compared byte for byte with a file kept under tests/golden/.

A golden file is the reviewed, committed form of a text the launcher renders (a node script, a dry
run, a node-side command). A change to the renderer then shows up in review as a diff of the golden
file, never silently. Regenerate every golden file with one command (see docs/architecture.md,
"Golden files"):

    REPRODUCE_UPDATE_GOLDEN=1 .venv/bin/pytest -q tests/ -k golden -p no:cacheprovider

Use from any test module (tests/ is on sys.path under pytest):

    from support.golden import assert_golden
    assert_golden("node-script-local.sh", plan.node_script)
    assert_golden("protocol/wrapper.sh", wrapper_text, normalize={str(tmp_path): "<tmp>"})
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from support.paths import TESTS

GOLDEN_DIR = TESTS / "golden"
REPO_ROOT = GOLDEN_DIR.parent.parent
UPDATE_ENV = "REPRODUCE_UPDATE_GOLDEN"
UPDATE_COMMAND = f"{UPDATE_ENV}=1 .venv/bin/pytest -q tests/ -k golden -p no:cacheprovider"


def updating() -> bool:
    """True when this test session rewrites golden files instead of comparing with them."""
    return os.environ.get(UPDATE_ENV, "") not in ("", "0")


def normalized(text: str, normalize: Mapping[str, str] | None = None) -> str:
    """`text` with each key of `normalize` replaced by its value (longest key first).

    For what legitimately differs between machines (the checkout's path, a temporary directory),
    never for what the renderer decides: that is what the golden file is for.
    """
    for old in sorted(normalize or {}, key=len, reverse=True):
        if old:
            text = text.replace(old, (normalize or {})[old])
    return text


def golden_path(name: str) -> Path:
    path = (GOLDEN_DIR / name).resolve()
    if GOLDEN_DIR not in path.parents:
        raise ValueError(f"golden file name {name!r} leaves tests/golden/")
    return path


def check_golden(name: str, text: str, normalize: Mapping[str, str] | None = None) -> str | None:
    """Compare (or, when updating, write) one golden file. Returns the failure message, or None."""
    path = golden_path(name)
    actual = normalized(text, normalize)
    if updating():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != actual:
            path.write_text(actual, encoding="utf-8")
        return None
    shown = path.relative_to(REPO_ROOT) if REPO_ROOT in path.parents else path
    if not path.exists():
        return f"{shown} does not exist; create it with:\n  {UPDATE_COMMAND}"
    expected = path.read_text(encoding="utf-8")
    if expected == actual:
        return None
    diff = difflib.unified_diff(
        expected.splitlines(keepends=True),
        actual.splitlines(keepends=True),
        fromfile=f"{shown} (golden)",
        tofile=f"{shown} (rendered now)",
    )
    body = "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff
    )
    return (
        f"the rendered text differs from {shown}.\n"
        f"If the change is intended, regenerate the golden files and commit them:\n"
        f"  {UPDATE_COMMAND}\n\n{body}"
    )


def assert_golden(name: str, text: str, normalize: Mapping[str, str] | None = None) -> None:
    """Fail (with a unified diff) when `text` differs from tests/golden/`name`.

    With REPRODUCE_UPDATE_GOLDEN=1 the file is written instead and the check passes. The failure
    has no traceback: the diff is the message.
    """
    message = check_golden(name, text, normalize)
    if message is not None:
        pytest.fail(message, pytrace=False)
