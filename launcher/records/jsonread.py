"""One reader for JSON the launcher did not just write: bounded, typed, and never a traceback.

Why: preflight.json, preflight-gpu.json, image.json, stack.json and assets-plan.json (rundir's
NODE_RESULT_FILES, node K's under logs/node-K/) are the stdout of programs that ran on the node,
the GPU preflight and the stack probe inside the recipe's image, whose code runs there as root
(docs/architecture.md, "The trust boundary"). Every byte of them is hostile input. Read with
json.loads and used as the shape they should have, they crashed the launcher: a list where a
mapping was read (AttributeError), `"gpus": 5` (TypeError), a 100,000-deep nesting
(RecursionError), a 5,000-digit integer (ValueError). Each was a traceback instead of the
documented exit code, a run left "collecting", a nightly stopped at its first such run.

The same holds for every other JSON file the launcher reads back rather than just wrote: the run
directory's own files (run.json, status.json, timeline.json, plan.json, verdict.json, aws.json,
measure.json, steps.jsonl; a run directory can be copied in from anyone, and `reproduce measure`
or `verify` is handed one), an attestation and every file of a bundle a stranger hands to
`reproduce verify`, the index and billing files under $REPRODUCE_HOME, an image record, the
docker CLI's answers. So every json.loads of the launcher is this module's (`loads`, `load_file`,
`read`); tests/records/test_json_readers.py fails on any other, and hands every reader the same
hostile documents. The module lives in records/, the lowest layer that reads files: every layer
that reads JSON sits at or above it (tests/test_layout.py). Callers turn NodeJSONError into
their own error class where the exit code differs (a damaged run directory is BadInput, a bundle
that does not verify CheckFailed).

- `read(path)` gives a NodeDoc and never raises: a missing file and an unreadable one are said in
  its `problem`, and its `fields` read as an empty mapping then.
- `load_file(path)` gives the document, None for a missing file, NodeJSONError otherwise.
- `loads(text)` and `decode_at(text, pos)` raise nothing but NodeJSONError (a ReproduceError).
- `Fields` is typed access to one JSON object: each getter returns its type or None (or an empty
  list or Fields), whatever the document holds at that key.

A document that is read holds at most MAX_BYTES of UTF-8 (a byte that is not is replaced; a
caller may allow more, as a page reading steps.jsonl does), nested at most MAX_DEPTH deep,
integers of at most MAX_INT_DIGITS digits (a longer one makes it unreadable: no node program and
no launcher record prints one), no NaN or infinity (read as null: a number that is not finite is
no number, principle 9; the launcher writes none, steps.jsonl spells them as text), and no lone
surrogate in any text (replaced: it cannot be written out as UTF-8 again).
tests/records/test_node_json.py holds these limits; tests/runner/test_outcome_node_json.py gives
every reader of the node's reports hostile documents, tests/records/test_json_readers.py every
other reader.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import InfraError
from launcher.inputs.yamlschema import Unreadable, read_regular

MAX_BYTES = 4 * 1024 * 1024  # what collection brings back of a result file (clusters/staging.py)
MAX_DEPTH = 64  # a node's report nests 4 deep
MAX_INT_DIGITS = 30
MISSING = "missing"

Scalar = str | int | float | bool | None


class NodeJSONError(InfraError):
    """A file the node wrote that cannot be read as a report (exit 3, where it is raised: the
    node, or the image's code, did not report)."""


def _int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits:,} digits")
    return int(text)


def _float(text: str) -> float | None:
    value = float(text)  # `1e999` reads as infinity
    return value if math.isfinite(value) else None


def _constant(_name: str) -> None:
    return None  # NaN, Infinity, -Infinity


def _refuse(name: str) -> None:
    raise ValueError(f"it holds {name}, not a number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"it holds {text}, past the largest number")
    return value


_DECODER = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant)
# The same rule, for a document where a number that is not finite is an error to name rather
# than a null to skip (a timeline a user hands to `measure`: a NaN time is a wrong file).
_STRICT = json.JSONDecoder(parse_int=_int, parse_float=_finite, parse_constant=_refuse)


def _text(value: str) -> str:
    """Text that can be written out as UTF-8 again (a lone surrogate, `"\\ud800"`, cannot)."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "replace").decode("utf-8")
    return value


def _clean(doc: object) -> object:
    """The decoded document held to MAX_DEPTH and its texts to UTF-8, walked without recursion
    (the decoder's lists and dicts are fresh: they are fixed in place)."""
    if isinstance(doc, str):
        return _text(doc)
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise NodeJSONError(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            if not all(key.isascii() for key in node):
                items = [(_text(key), value) for key, value in node.items()]
                node.clear()
                node.update(items)
            for key, value in node.items():
                if isinstance(value, str):
                    node[key] = _text(value)
                elif isinstance(value, (dict, list)):
                    stack.append((value, depth + 1))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                if isinstance(value, str):
                    node[index] = _text(value)
                elif isinstance(value, (dict, list)):
                    stack.append((value, depth + 1))
    return doc


def decode_at(text: str, pos: int = 0, *, strict: bool = False) -> tuple[Any, int]:
    """(value, where it ends) of the JSON value that starts at `pos` (json's raw_decode, held to
    the limits above); NodeJSONError when there is none. `strict`: NaN, Infinity and a number
    past the largest float refuse the document instead of reading as null."""
    try:
        value, end = (_STRICT if strict else _DECODER).raw_decode(text, pos)
    except RecursionError:
        raise NodeJSONError(f"nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, MemoryError) as err:  # JSONDecodeError is a ValueError
        raise NodeJSONError(f"not JSON: {str(err)[:200]}") from None
    return _clean(value), end


def loads(text: str, *, strict: bool = False) -> Any:
    """The JSON document `text` is, whole (blanks around it allowed); NodeJSONError if none
    (`strict`: see decode_at)."""
    value, end = decode_at(text, len(text) - len(text.lstrip()), strict=strict)
    if text[end:].strip():
        raise NodeJSONError(f"not JSON: more after the document (character {end})")
    return value


def read_text(path: Path, max_bytes: int = MAX_BYTES) -> str | None:
    """The file as text (a byte that is not UTF-8 replaced), None when it does not exist;
    NodeJSONError when it is not a regular file (never followed through a link, never blocked
    on a FIFO) or is over `max_bytes` (inputs/yamlschema.read_regular, the one capped read)."""
    try:
        data = read_regular(Path(path), max_bytes, follow=False)
    except Unreadable as err:
        if err.reason in ("directory", "not regular"):
            raise NodeJSONError("not a regular file") from None
        if err.reason == "too big" and err.size >= 0:
            raise NodeJSONError(f"{err.size:,} bytes, more than the {max_bytes:,} read") from None
        if err.reason == "too big":
            raise NodeJSONError(f"more than the {max_bytes:,} bytes read") from None
        verb = "opened" if err.reason == "open" else "read"
        raise NodeJSONError(f"cannot be {verb}: {err.strerror}") from None
    return None if data is None else data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class NodeDoc:
    """One node-written file as read: its document, or why there is none."""

    path: Path
    value: Any = None
    problem: str | None = None  # None: read; MISSING; else why it is unreadable

    @property
    def fields(self) -> Fields:
        """The document's top-level object (empty when it is none: a list, a number, absent)."""
        return Fields(self.value)

    @property
    def missing(self) -> bool:
        return self.problem == MISSING

    def why_not(self) -> str:
        """Words for a document that is not there: absent, or unreadable and why."""
        if self.problem == MISSING:
            return f"no {self.path.name}"
        if self.problem is not None:
            return f"{self.path.name} is unreadable ({self.problem})"
        return f"{self.path.name} holds no JSON object"


def load_file(path: Path, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON document in the file at `path` (any JSON type: the caller checks its shape, or
    reads it through `Fields`); None when there is no such file; NodeJSONError saying why it
    cannot be read otherwise (the caller adds the file's name)."""
    text = read_text(Path(path), max_bytes)
    return None if text is None else loads(text)


def read(path: Path) -> NodeDoc:
    """The node-written JSON file at `path`; never raises."""
    path = Path(path)
    try:
        text = read_text(path)
        if text is None:
            return NodeDoc(path, problem=MISSING)
        return NodeDoc(path, loads(text))
    except NodeJSONError as err:
        return NodeDoc(path, problem=err.message)


class Fields:
    """Typed access to one JSON object of a node's document: each getter gives its type or
    None (or an empty list or Fields) whatever the key holds, so no reader meets a list where it
    reads a mapping, or a number where it iterates."""

    __slots__ = ("_data",)

    def __init__(self, value: object) -> None:
        self._data: dict[str, Any] = value if isinstance(value, dict) else {}

    def __bool__(self) -> bool:
        return bool(self._data)

    def has(self, key: str) -> bool:
        return key in self._data

    def mapping(self) -> dict[str, Any]:
        """The object itself (decoded, within the limits above): for a record that keeps it."""
        return self._data

    def raw(self, key: str) -> Any:
        """The value as decoded (any JSON type, within the limits above)."""
        return self._data.get(key)

    def text(self, key: str) -> str | None:
        value = self._data.get(key)
        return value if isinstance(value, str) else None

    def scalar(self, key: str) -> Scalar:
        """Text, a number or a bool; None for null, an absent key, a list or an object."""
        value = self._data.get(key)
        return value if isinstance(value, (str, int, float, bool)) else None

    def word(self, key: str, default: str = "") -> str:
        """The scalar as text (a number or bool written out), `default` for anything else."""
        value = self.scalar(key)
        return default if value is None else str(value)

    def number(self, key: str) -> int | float | None:
        value = self._data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return value

    def flag(self, key: str) -> bool | None:
        """A JSON true or false; None for anything else (never the truth of a text)."""
        value = self._data.get(key)
        return value if isinstance(value, bool) else None

    def obj(self, key: str) -> Fields:
        return Fields(self._data.get(key))

    def records(self, key: str) -> list[Fields]:
        """The objects of the list at `key` (other items skipped; no list: none)."""
        value = self._data.get(key)
        if not isinstance(value, list):
            return []
        return [Fields(item) for item in value if isinstance(item, dict)]

    def words(self, key: str) -> list[str]:
        """The scalars of the list at `key`, as text (other items skipped; no list: none)."""
        value = self._data.get(key)
        if not isinstance(value, list):
            return []
        return [str(item) for item in value if isinstance(item, (str, int, float, bool))]
