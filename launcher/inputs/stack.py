"""What the recipe says its software stack is, as checkable expectations.

Recipes state versions in prose ("miles 0.1.0 (radixark/miles commit 78527b91, a slime fork)"), so
this reads the version or commit that each field leads with. The node's probe
(scripts/stack_probe.py) reads the real ones inside the image and compares; both sides agree on
the keys below.
"""

from __future__ import annotations

import re
from typing import Any

# probe key -> (recipe stack field, how to read the expectation from its text)
_COMMIT = re.compile(r"\bcommit\s+([0-9a-f]{7,40})\b")
_VERSION = re.compile(r"^\s*(?:[A-Za-z][\w.-]*\s+)?v?(\d+(?:\.\d+){1,3}(?:[a-z]+\d*)?)")


def _version(text: str) -> str | None:
    m = _VERSION.match(text)
    return m.group(1) if m else None


def _commit(text: str) -> str | None:
    m = _COMMIT.search(text)
    return m.group(1) if m else None


def expected_versions(stack: dict[str, Any]) -> dict[str, str]:
    """Probe key -> expected value (a version prefix, or a commit prefix for source trees)."""
    out: dict[str, str] = {}
    readers = {
        "miles_commit": ("framework", _commit),
        "megatron_commit": ("megatron_lm", _commit),
        "transformer_engine": ("transformer_engine", _version),
        "torch": ("pytorch", _version),
        "cuda": ("cuda", _version),
        "nccl": ("nccl", _version),
        "deepep": ("deepep", _version),
        "python": ("python", _version),
    }
    for key, (field, reader) in readers.items():
        text = stack.get(field)
        if text is None:
            continue
        value = reader(str(text))
        if value:
            out[key] = value
    return out
