"""What the recipe says its software stack is, as checkable expectations.

Recipes state versions in prose ("miles 0.1.0 (radixark/miles commit 78527b91, a slime fork)"), so
this reads the version or commit that each field leads with. The node's probe
(scripts/stack_probe.py) reads the real ones inside the image and compares; both sides agree on
the keys below.
"""

from __future__ import annotations

import re
from collections.abc import Callable
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


# probe key -> (recipe stack field, how its expectation is read, what the text must hold)
READERS: dict[str, tuple[str, Callable[[str], str | None], str]] = {
    "miles_commit": ("framework", _commit, "'commit <7 to 40 hex digits>'"),
    "megatron_commit": ("megatron_lm", _commit, "'commit <7 to 40 hex digits>'"),
    "transformer_engine": ("transformer_engine", _version, "a version first ('2.17.0')"),
    "torch": ("pytorch", _version, "a version first ('2.11.0')"),
    "cuda": ("cuda", _version, "a version first ('13.0')"),
    "nccl": ("nccl", _version, "a version first ('2.28.9')"),
    "deepep": ("deepep", _version, "a version first ('1.2.1')"),
    "python": ("python", _version, "a version first ('3.12.3')"),
}


def expected_versions(stack: dict[str, Any]) -> dict[str, str]:
    """Probe key -> expected value (a version prefix, or a commit prefix for source trees)."""
    out: dict[str, str] = {}
    for key, (field, reader, _) in READERS.items():
        text = stack.get(field)
        value = reader(str(text)) if text is not None else None
        if value:
            out[key] = value
    return out


def stack_version(stack: dict[str, Any], field: str) -> str | None:
    """The version a stack field leads with ('13.0' of "13.0 (driver 580)"), or None: what the
    node is given, never the field's prose (the preflight read every number of
    "13.0 (driver 580)" as the version 13.0.580 and refused a node whose driver runs 13.0)."""
    text = stack.get(field)
    return _version(str(text)) if text is not None else None


def stack_problems(stack: dict[str, Any]) -> list[tuple[str, str]]:
    """A version field that is stated but leads with no version: the probe would pass over it
    without a word, so a claim about the stack would go unchecked. Refused at validate instead
    (null says "not stated"). framework and megatron_lm are required prose: their commit is
    checked when they name one."""
    problems = []
    for field, reader, wanted in READERS.values():
        text = stack.get(field)
        if reader is _version and text is not None and not reader(str(text)):
            problems.append(
                (
                    f"stack.{field}",
                    f"{str(text)[:80]!r} states no version the probe can check; "
                    f"expected {wanted}, or null when not stated",
                )
            )
    return problems
