"""Reading YAML files and explaining schema violations, shared by recipes and cluster profiles.

Why its own module: a recipe and a profile are both a YAML mapping checked against a JSON Schema
(schema/*.schema.yaml), and an author should get the same kind of message from both: the file,
the field path, what was expected. Nothing here knows what a recipe or a profile means.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from launcher.errors import BadInput
from launcher.inputs.yamlbudget import has_aliases, unshared, within_budget

if TYPE_CHECKING:
    from jsonschema import TypeChecker, ValidationError
    from jsonschema.protocols import Validator

# libyaml's loader when present (faster), else PyYAML's; safe either way.
FastSafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _TextDateLoader(FastSafeLoader):  # type: ignore[misc,valid-type]
    """SafeLoader that keeps dates as text: a recipe's `measured: 2026-10-21` is a string field."""


_TextDateLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


# A recipe or profile is a page of text; a file far larger than that is not one (and reading it
# whole would cost memory for nothing).
MAX_FILE_BYTES = 1 << 20
# Bump when the validator's semantics change, so a pass remembered by an older one is not reused.
# 3: non-finite numbers refused; 4: keys that are not text, numbers beyond MAX_MAGNITUDE, control
# characters and line breaks outside multi-line fields refused (document_problems)
_VALIDATOR_VERSION = 4
# No field of a recipe or a profile means anything by a number this large (the largest are byte
# counts and FLOP/s, under 1e16); past it a product of two fields can overflow to infinity (a
# claimed 1e308 GPU-hours priced to "$inf") or an integer not fit a float at all (10**400).
MAX_MAGNITUDE = 1e18
# C0 controls but tab and line feed, DEL, and C1 controls: a terminal acts on them (ESC erases a
# line and rewrites it: a cost question's price), bash drops NUL, and none is text a field means.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class Unreadable(Exception):  # noqa: N818 - a reason, mapped to each caller's own error
    """Why `read_regular` read nothing: REASON is "directory", "not regular", "too big" (SIZE
    bytes, or -1: it grew past the limit while read), "open" or "os" (STRERROR: it could not
    be opened, or not read)."""

    def __init__(self, reason: str, size: int = -1, strerror: str = ""):
        super().__init__(reason)
        self.reason, self.size, self.strerror = reason, size, strerror


def read_regular(path: Path, limit: int, *, follow: bool = True) -> bytes | None:
    """At most LIMIT bytes of the regular file PATH; None when there is no such file; Unreadable
    for anything else. The one capped read of a file someone else wrote or named: opened without
    blocking and checked on the open descriptor, so a FIFO or a device (which would block or
    never end) is refused at once and a path swapped after a check cannot slip through;
    FOLLOW=False never goes through a symlink (a file in a directory the node wrote)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | (0 if follow else os.O_NOFOLLOW))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:
        raise Unreadable("directory") from None
    except OSError as err:  # a symlink with follow=False (ELOOP), a permission
        raise Unreadable("open", strerror=err.strerror or str(err)) from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise Unreadable("directory")
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable("not regular")
        if info.st_size > limit:
            raise Unreadable("too big", info.st_size)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise Unreadable("os", strerror=err.strerror or str(err)) from None
    finally:
        os.close(fd)
    if size > limit:
        raise Unreadable("too big")  # it grew while being read
    return b"".join(chunks)


def read_text_capped(path: Path, what: str, limit: int = MAX_FILE_BYTES) -> str:
    """A regular file's text, at most `limit` bytes (`read_regular`); BadInput for anything
    else, naming the file and what was expected."""
    try:
        data = read_regular(path, limit)
    except Unreadable as err:
        if err.reason == "directory":
            raise BadInput(f"{path}: is a directory; expected a {what} file.") from None
        if err.reason == "not regular":
            raise BadInput(
                f"{path}: not a regular file (a FIFO, socket or device); expected a {what} file."
            ) from None
        if err.reason == "too big" and err.size >= 0:
            raise BadInput(
                f"{path}: {err.size} bytes; a {what} file is at most {limit} bytes."
            ) from None
        if err.reason == "too big":
            raise BadInput(
                f"{path}: more than {limit} bytes; a {what} file is at most {limit} bytes."
            ) from None
        raise BadInput(f"{path}: cannot read the {what} file: {err.strerror}.") from None
    if data is None:
        raise BadInput(f"{path}: no such {what} file.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadInput(
            f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); expected {what} text."
        ) from None


def duplicate_keys(node: object, path: tuple[Any, ...] = ()) -> list[tuple[str, int, int]]:
    """Every key written twice in one mapping of a composed YAML document: (key path, first line,
    second line), lines 1-based, in document order.

    Why: YAML loaders keep the last of two equal keys without a word, so a reader who sees the
    first `tokens_per_s_per_gpu` (or the first `gpu:` block) is judged against the hidden second
    one. A recipe or profile is a document people read: each key is written once."""
    found: list[tuple[str, int, int]] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            line = key.start_mark.line + 1
            if name is not None:
                ident = (key.tag, name)
                if ident in seen:
                    found.append((field_path([*path, name]), seen[ident], line))
                else:
                    seen[ident] = line
            found += duplicate_keys(value, (*path, name if name is not None else "?"))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += duplicate_keys(item, (*path, i))
    return found


def _load_checked(path: Path, text: str, what: str) -> Any:
    """The document, composed once: its duplicate keys refused (both lines named), then built."""
    loader = _TextDateLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        aliased = has_aliases(text)
        if aliased:
            within_budget(node, path, what)  # before anything walks it, duplicate_keys included
        dups = sorted(duplicate_keys(node), key=lambda d: (d[2], d[1]))
        if dups:
            listed = "; ".join(f"{key} at lines {a} and {b}" for key, a, b in dups)
            raise BadInput(
                f"{path}: {len(dups)} duplicate key{'s' if len(dups) != 1 else ''} in the {what}: "
                f"{listed}. YAML would keep the later value silently, so the value a reader sees "
                "may not be the one used; expected each key once in its mapping."
            )
        data = loader.construct_document(node)
        return unshared(data) if aliased else data
    finally:
        loader.dispose()


def read_yaml_mapping(path: Path, what: str) -> tuple[dict[str, Any], str]:
    """Read a YAML file that must hold a mapping; every failure is a BadInput naming the file."""
    text = read_text_capped(path, what)
    try:
        data = _load_checked(path, text, what)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise BadInput(
            f"{path}:{where} not valid YAML ({problem}); expected a {what} mapping."
        ) from None
    if data is None:
        raise BadInput(f"{path}: the file is empty; expected a {what}: a YAML mapping of fields.")
    if not isinstance(data, dict):
        raise BadInput(
            f"{path}: the document is a {_yaml_type(data)}; "
            f"expected a {what}: a YAML mapping of fields."
        )
    return data, text


def format_problems(path: Path, what: str, problems: list[tuple[str, str]]) -> str:
    lines = [f"{path}: invalid {what}, {len(problems)} problem{'s' if len(problems) != 1 else ''}:"]
    lines += [f"  - {field or '(top level)'}: {message}" for field, message in problems]
    return "\n".join(lines)


def _cache_dir() -> Path | None:
    if os.environ.get("REPRODUCE_NO_CACHE"):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "reproduce" / "schema-valid"


def _validity_key(
    raw: dict[str, Any], schema: dict[str, Any], multiline: tuple[tuple[str, ...], ...]
) -> str:
    """The document's identity with its types: repr tells 1 from 1.0, True and "1", a date from
    its text and a mapping from a list (a key built with json's `default=str` did not, and a
    refused document passed once a valid one with the same text had been cached)."""
    from launcher import __version__

    blob = repr(
        (__version__, _VALIDATOR_VERSION, json.dumps(schema, sort_keys=True), multiline, raw)
    )
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def schema_problems(
    raw: dict[str, Any], schema: dict[str, Any], multiline: tuple[tuple[str, ...], ...] = ()
) -> list[tuple[str, str]]:
    """jsonschema errors turned into (field path, what was expected) pairs, after
    document_problems (what JSON Schema cannot say). `multiline`: the fields that may hold line
    breaks, as paths whose "*" is any key or index: ("patches", "*", "diff").

    A document that once passed (same content, same schema, same launcher version) is remembered
    in the user's cache, so a repeated command skips importing jsonschema (~70 ms of a dry run's
    start). Only passes are cached: every failure is computed and reported afresh.
    """
    cache = _cache_dir()
    key = _validity_key(raw, schema, multiline) if cache else ""
    if cache and (cache / key).exists():
        return []
    odd = document_problems(raw, frozenset(multiline))
    named = {where for where, _ in odd}  # not named again for a bound it then misses
    problems = odd + [p for p in _jsonschema_problems(raw, schema) if p[0] not in named]
    if cache and not problems:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            (cache / key).touch()
        except OSError:
            pass  # a read-only home only costs the speed-up
    return problems


def non_finite_problems(node: object, path: tuple[Any, ...] = ()) -> list[tuple[str, str]]:
    """Every number of the document that is not finite (YAML's `.nan`, `.inf`, `-.inf`).

    Why here, for every field at once: NaN compares false with everything, so a claim, a bound or
    a price that is NaN passes every check written as "refuse when below/above" (a recipe that
    claimed `.nan` tokens/s was judged reproduced by any run), and an infinite one makes any
    measured figure "within" it. JSON Schema cannot say "finite" (JSON has no such numbers), so
    the schemas' `minimum`s and `maximum`s let them through; no field of a recipe or a profile
    means anything by them, so none may hold one.
    """
    if isinstance(node, float) and not math.isfinite(node):
        shown = ".nan" if math.isnan(node) else (".inf" if node > 0 else "-.inf")
        return [(field_path(path), f"got {shown}, not a finite number; expected a finite number")]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in non_finite_problems(v, (*path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in non_finite_problems(v, (*path, i))]
    return []


def document_problems(
    node: object, multiline: frozenset[tuple[str, ...]], path: tuple[Any, ...] = ()
) -> list[tuple[str, str]]:
    """What no field of a recipe or a profile may hold, checked over every field at once (JSON
    Schema cannot say it, or sees it only after YAML turned it into something else):

    - a key that is not text: YAML reads `on:`, `yes:`, `1:` and `~:` as a boolean, a number
      and null, so `env: {on: "1"}` exported `True=1` (and made the key sort raise);
    - a number that is not finite, or beyond MAX_MAGNITUDE (non_finite_problems says why);
    - a control character in text (a terminal acts on ESC; bash drops NUL), and a line break
      outside the fields that are text blocks (`multiline`): a one-line field is printed inside
      a comment of the dry run and in headers, where a second line would stand on its own.
    """
    here = field_path(path)
    if isinstance(node, dict):
        out: list[tuple[str, str]] = []
        for key, value in node.items():
            if not isinstance(key, str):
                out.append(
                    (
                        field_path((*path, str(key))),
                        f"a key YAML reads as a {_yaml_type(key)} ({key!r}: on, off, yes, no, "
                        "true and false are booleans to YAML, digits a number, ~ null); expected "
                        "text: quote the key as you wrote it",
                    )
                )
                continue
            out += document_problems(value, multiline, (*path, key))
        return out
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in document_problems(v, multiline, (*path, i))]
    if isinstance(node, bool):
        return []
    if isinstance(node, float) and not math.isfinite(node):
        return non_finite_problems(node, path)
    if isinstance(node, (int, float)) and abs(node) > MAX_MAGNITUDE:
        shown = (
            f"{node:.3g}"
            if isinstance(node, float)
            else f"an integer of {len(str(abs(node)))} digits"
        )
        return [(here, f"got {shown}; expected a number of magnitude at most {MAX_MAGNITUDE:g}")]
    if isinstance(node, str):
        bad = _CONTROL_RE.search(node)
        if bad is not None:
            return [
                (
                    here,
                    f"holds the control character {bad.group()!r} at position {bad.start()}; "
                    "expected text without control characters",
                )
            ]
        if "\n" in node and not any(_matches(path, block) for block in multiline):
            return [(here, "holds a line break; expected one line of text")]
    return []


def _matches(path: tuple[Any, ...], pattern: tuple[str, ...]) -> bool:
    """A field path against a pattern whose "*" stands for any one key or list index."""
    return len(path) == len(pattern) and all(
        p == "*" or p == x for x, p in zip(path, pattern, strict=True)
    )


def _strict_validator(schema: dict[str, Any]) -> Validator:
    """Draft 2020-12, read as strictly as the files are meant:

    - an integer is an integer: JSON Schema counts 8.0 as one, but `--num-gpus 8.0` is not a
      count a program accepts;
    - a pattern's final `$` is the end of the text, as in the ECMA-262 regular expressions JSON
      Schema specifies; Python's `$` also matches before a final newline, which let an env key
      "NCCL_DEBUG\\n" through.
    """
    from jsonschema import Draft202012Validator, validators

    stock_pattern = Draft202012Validator.VALIDATORS["pattern"]  # the stock keyword, reused

    def is_integer(_checker: TypeChecker, instance: object) -> bool:
        return isinstance(instance, int) and not isinstance(instance, bool)

    def pattern(
        validator: Validator, patrn: str, instance: object, schema: Mapping[str, Any]
    ) -> Iterator[ValidationError]:
        strict = patrn[:-1] + r"\Z" if patrn.endswith("$") and not patrn.endswith(r"\$") else patrn
        yield from stock_pattern(validator, strict, instance, schema)

    checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", is_integer)
    extend: Callable[..., type[Validator]] = validators.extend  # unannotated in its stubs
    cls = extend(Draft202012Validator, validators={"pattern": pattern}, type_checker=checker)
    return cls(schema)


def _jsonschema_problems(raw: dict[str, Any], schema: dict[str, Any]) -> list[tuple[str, str]]:
    validator = _strict_validator(schema)
    out: list[tuple[str, str]] = []
    for err in sorted(
        validator.iter_errors(raw), key=lambda e: (list(map(str, e.absolute_path)), e.message)
    ):
        out.extend(_explain(err))
    return out


def field_path(parts: Iterable[object]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _explain(err: ValidationError) -> list[tuple[str, str]]:
    schema: Mapping[str, Any] = err.schema if isinstance(err.schema, Mapping) else {}
    path = field_path(err.absolute_path)
    kind = err.validator
    if "propertyNames" in err.absolute_schema_path:  # the schema says what a name must be
        said = schema.get("x-message") or "not an allowed name"
        return [(field_path([*err.absolute_path, str(err.instance)]), " ".join(str(said).split()))]
    if kind == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted((schema.get("properties") or {}).keys())
        extra = [k for k in err.instance if k not in allowed]
        hint = f"; expected one of: {', '.join(allowed)}" if allowed else ""
        return [(field_path([*err.absolute_path, k]), f"unknown field{hint}") for k in extra]
    if kind == "required":
        missing = re.findall(r"'([^']+)' is a required property", err.message)
        name = missing[0] if missing else "?"
        desc = ((schema.get("properties") or {}).get(name) or {}).get("description", "")
        return [
            (
                field_path([*err.absolute_path, name]),
                "missing required field" + (f" ({_short(desc)})" if desc else ""),
            )
        ]
    if kind == "type":
        return [
            (
                path,
                f"expected {_type_words(err.validator_value)}, "
                f"got {_yaml_type(err.instance)} {_show(err.instance)}",
            )
        ]
    if kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[
            kind
        ]
        return [(path, f"expected a number {op} {err.validator_value}, got {_show(err.instance)}")]
    if kind == "pattern":
        desc = schema.get("description") or f"text matching {err.validator_value}"
        return [(path, f"got {_show(err.instance)}; expected {_short(desc)}")]
    if kind == "enum":
        return [
            (
                path,
                f"got {_show(err.instance)}; "
                f"expected one of {', '.join(map(str, _listed(err.validator_value)))}",
            )
        ]
    if kind == "const":
        return [(path, f"got {_show(err.instance)}; expected {err.validator_value!r}")]
    if kind in ("minLength",):
        return [(path, "expected non-empty text")]
    if kind in ("minItems", "maxItems", "items", "prefixItems"):
        return [
            (
                path,
                f"got {_show(err.instance)}; "
                f"expected {_short(schema.get('description', err.message))}",
            )
        ]
    if kind in ("oneOf", "anyOf") and err.context:
        # The branch the value was meant for is the one of its type: "host: {..., colour: x}"
        # is a mapping with an unknown field, not "not text" (the other branch's complaint).
        # jsonschema's relative_schema_path starts with the branch's index.
        branches: dict[Any, list[Any]] = {}
        for sub in err.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        own_type = [
            subs
            for subs in branches.values()
            if not any(e.validator == "type" and not list(e.relative_path) for e in subs)
        ]
        if len(own_type) == 1:
            return [found for sub in own_type[0] for found in _explain(sub)]
        types = [
            e.validator_value
            for subs in branches.values()
            for e in subs
            if e.validator == "type" and not list(e.relative_path)
        ]
        if types and len(types) == len(branches):
            words = " or ".join(_type_words(t) for t in types)
            return [
                (path, f"expected {words}, got {_yaml_type(err.instance)} {_show(err.instance)}")
            ]
        best = min(err.context, key=lambda e: len(list(e.absolute_path)))
        return [(path, best.message)]
    return [(path, err.message)]


def _listed(value: object) -> list[object]:
    """An enum's values (a list in every schema here)."""
    return list(value) if isinstance(value, list | tuple) else [value]


def _type_words(value: object) -> str:
    names = {
        "object": "a mapping",
        "array": "a list",
        "string": "text",
        "integer": "an integer",
        "number": "a number",
        "boolean": "true or false",
        "null": "null",
    }
    if isinstance(value, list):
        return " or ".join(names.get(str(v)) or str(v) for v in value)
    return names.get(str(value), str(value))


def _yaml_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    if value is None:
        return "null"
    return type(value).__name__


# A URL's user:password@ part: never shown back in a message (it is a secret the user mistyped into
# a field; the message would print it on screen and into CI logs).
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


def _show(value: object) -> str:
    text = _URL_CREDENTIALS.sub("***@", repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 160 else text[:157] + "..."
