"""A bash file with named blocks, filled from Python: how templates/node.sh becomes node.sh.

The bash stays in one file a person reads top to bottom; Python only supplies values and picks
blocks. string.Template does the inline values (delimiter `@@`, so bash's own `$NAME` and
`${NAME}` pass untouched); a line that is only `@@NAME` is a slot of zero or more lines. A value
or a slot's text is inserted as it is and never scanned again, so text from a recipe can neither
fill a slot nor name a value. The format is written at the top of templates/node.sh.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

from launcher.resources import data_dir

_NOTE = "##@"
_BLOCK = re.compile(r"##@ block ([\w.-]+)(?::.*)?")
_SLOT = re.compile(r"@@([A-Za-z_]\w*)")

Lines = str | Sequence[str]


class _Line(string.Template):
    delimiter = "@@"


class BashTemplate:
    """The named blocks of one template file, each a list of lines (notes dropped)."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.blocks: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in text.split("\n"):
            block = _BLOCK.fullmatch(line)
            if block:
                if block.group(1) in self.blocks:
                    raise ValueError(f"{source}: block {block.group(1)!r} twice")
                current = self.blocks[block.group(1)] = []
            elif line.startswith(_NOTE):
                continue
            elif current is not None:
                current.append(line)
        for lines in self.blocks.values():  # a block ends at its last line of text
            while lines and not lines[-1]:
                lines.pop()

    def fill(
        self, name: str, values: Mapping[str, object], slots: Mapping[str, Lines]
    ) -> list[str]:
        """Block NAME's lines with every `@@{value}` and `@@slot` filled; a name the block uses
        and the caller did not give, or one given and not used, is a KeyError (the template and
        its filler drifted apart)."""
        out: list[str] = []
        used: set[str] = set()
        for line in self.blocks[name]:
            slot = _SLOT.fullmatch(line)
            if slot:
                key = slot.group(1)
                if key not in slots:
                    raise KeyError(f"{self.source}: block {name!r} has slot @@{key}, not filled")
                used.add(key)
                text = slots[key]
                out.extend([text] if isinstance(text, str) else text)
                continue
            template = _Line(line)
            for match in template.pattern.finditer(line):
                used.add(match.group("named") or match.group("braced") or "")
            out.append(template.substitute({k: str(v) for k, v in values.items()}))
        extra = (set(values) | set(slots)) - used
        if extra:
            raise KeyError(f"{self.source}: block {name!r} has no place for {sorted(extra)}")
        return out


@cache
def template(name: str) -> BashTemplate:
    """templates/NAME, read once per process (package data, like schema/)."""
    path: Path = data_dir("templates") / name
    return BashTemplate(path.read_text(encoding="utf-8"), str(path))
