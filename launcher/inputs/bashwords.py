"""What one word of a bash script becomes when bash runs it: quote removal, parameter expansion
and word splitting, as far as the script itself tells.

Why apart from bashread.py: splitting a script into commands and expanding a command's words are
two steps in bash too, and the expansion needs the variables the script set before the command
(bashread knows nothing of values). A value only the running shell knows (a variable filled by
`read`, a command substitution, the environment) is OPAQUE when it stays one word (it was
quoted) and OPAQUE_WORDS when it may be any number of words (unquoted, `"$@"`, an array filled at
run time): such a word may hold any option, and runargs.py reads it so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from launcher.inputs.bashread import Word

# A word whose value is only known when the script runs ...
OPAQUE: Any = type("Opaque", (), {"__repr__": lambda self: "<only known at run time>"})()
# ... and words whose number too is only known then: they may hold any option.
OPAQUE_WORDS: Any = type(
    "OpaqueWords", (), {"__repr__": lambda self: "<words known at run time>"}
)()

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?")
_ANSI = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b",
         "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}  # fmt: skip
_BLANKS_RE = re.compile(r"[ \t\n]+")
_SPECIAL_RE = re.compile(r"[\\'\"`$~{]")


@dataclass
class Vars:
    """The variables the script has set so far, as far as the script tells their values."""

    scalars: dict[str, Any] = field(default_factory=dict)  # name -> text or OPAQUE
    arrays: dict[str, list[Any]] = field(default_factory=dict)  # name -> values or [OPAQUE_WORDS]
    unknown: bool = False  # after `eval`, `source`: any variable may hold anything
    split_unknown: bool = False  # IFS was set: how unquoted values split is not known

    def scalar(self, name: str) -> Any:
        if self.unknown:
            return OPAQUE
        if name in self.scalars:
            return self.scalars[name]
        if name in self.arrays:  # $ARR is ${ARR[0]}
            values = self.arrays[name]
            return values[0] if values and isinstance(values[0], str) else OPAQUE
        return OPAQUE  # the environment's, or unset: not the script's to tell

    def array(self, name: str) -> list[Any]:
        if self.unknown or name not in self.arrays:
            value = None if self.unknown else self.scalars.get(name)
            return [value] if isinstance(value, str) else [OPAQUE_WORDS]
        return self.arrays[name]

    def set_scalar(self, name: str, value: object) -> None:
        self.scalars[name] = value
        self.arrays.pop(name, None)
        if name == "IFS":
            self.split_unknown = True

    def set_array(self, name: str, values: list[Any]) -> None:
        self.arrays[name] = values
        self.scalars.pop(name, None)

    def forget(self, name: str) -> None:
        self.set_scalar(name, OPAQUE)
        self.arrays[name] = [OPAQUE_WORDS]


class _Fields:
    def __init__(self) -> None:
        self.fields: list[Any] = []
        self.cur: list[Any] = []
        self.started = False
        self.many = False  # an unquoted word known only at run time: any number of words

    def add(self, piece: object) -> None:
        self.cur.append(piece)
        self.started = True

    def split(self, value: str) -> None:
        for k, part in enumerate(_BLANKS_RE.split(value)):
            if k:
                self.close()
            if part:
                self.add(part)

    def close(self) -> None:
        if self.started:
            joined = OPAQUE if any(p is OPAQUE for p in self.cur) else "".join(self.cur)
            self.fields.append(joined)
        self.cur, self.started = [], False


def _closing(raw: str, i: int, opener: str, closer: str) -> int:
    """The index after the closer matching the opener at raw[i] (quotes respected)."""
    depth, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == "\\":
            i += 2
            continue
        if c in "'\"" and opener == "(":
            end = raw.find(c, i + 1)
            i = n if end < 0 else end + 1
            continue
        if c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def _ansi(body: str) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in _ANSI:
                out.append(_ANSI[nxt])
                i += 2
                continue
            hexa = re.match(r"x([0-9A-Fa-f]{1,2})", body[i + 1 :])
            octal = re.match(r"([0-7]{1,3})", body[i + 1 :])
            if hexa:
                out.append(chr(int(hexa.group(1), 16)))
                i += 1 + len(hexa.group(0))
                continue
            if octal:
                out.append(chr(int(octal.group(1), 8)))
                i += 1 + len(octal.group(0))
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _dollar(raw: str, i: int, vs: Vars) -> tuple[int, str, Any]:
    """The expansion at raw[i] == "$": (end, kind, value). kind: "text" (a lone $), "scalar"
    (value: text or OPAQUE), "array" (value: the values), "dynamic" (only known at run time)."""
    nxt = raw[i + 1 : i + 2]
    if nxt == "(":
        return _closing(raw, i + 1, "(", ")"), "dynamic", None
    if nxt == "{":
        end = _closing(raw, i + 1, "{", "}")
        m = _BRACED_RE.fullmatch(raw[i + 2 : end - 1])
        if m is None:
            return end, "dynamic", None
        if m.group(2):
            return end, "array", vs.array(m.group(1))
        return end, "scalar", vs.scalar(m.group(1))
    m = _NAME_RE.match(raw, i + 1)
    if m:
        return m.end(), "scalar", vs.scalar(m.group())
    if nxt and (nxt.isdigit() or nxt in "@*#?$!-"):
        return i + 2, "dynamic", None
    return i + 1, "text", "$"


def expand(word: Word, vs: Vars, *, split: bool = True) -> list[Any]:
    """The fields bash makes of WORD (split=False: an assignment's value, one field)."""
    raw, out, i, n = word.raw, _Fields(), 0, len(word.raw)
    if not _SPECIAL_RE.search(raw):  # a plain word, most of them: itself
        return [raw] if raw or not split else []
    if split and raw[:1] == "~":
        return [OPAQUE]
    if split and re.search(r"(?<![\\$]){[^}'\"]*(,|\.\.)[^}'\"]*}", raw):
        return [OPAQUE_WORDS]  # brace expansion: several words
    while i < n:
        c = raw[i]
        if c == "\\":
            if i + 1 < n and raw[i + 1] != "\n":  # a backslash-newline is no character
                out.add(raw[i + 1])
            i += 2
        elif c == "$" and raw[i + 1 : i + 2] == '"':  # $"...": a translated string, as "..."
            i += 1
        elif c == "'":
            end = raw.find("'", i + 1)
            end = n if end < 0 else end
            out.add(raw[i + 1 : end])
            i = end + 1
        elif c == "$" and raw[i + 1 : i + 2] == "'":
            end = i + 2
            while end < n and raw[end] != "'":
                end += 2 if raw[end] == "\\" else 1
            out.add(_ansi(raw[i + 2 : end]))
            i = end + 1
        elif c == '"':
            i = _double(raw, i + 1, vs, out, whole=raw)
        elif c == "`":
            end = raw.find("`", i + 1)
            i = n if end < 0 else end + 1
            out.many = True
        elif c == "$":
            i, kind, value = _dollar(raw, i, vs)
            if kind == "text":
                out.add(value)
            elif kind == "scalar" and isinstance(value, str):
                if split and not vs.split_unknown:
                    out.split(value)
                else:
                    out.add(value)
            elif kind == "array" and all(isinstance(v, str) for v in value):
                if split and not vs.split_unknown:
                    out.split(" ".join(value))
                else:
                    out.add(" ".join(value))
            elif split:
                out.many = True
            else:
                out.add(OPAQUE)
        else:
            out.add(c)
            i += 1
    out.close()
    if out.many:
        return [OPAQUE_WORDS]
    return out.fields if split else [out.fields[0] if out.fields else ""]


def _double(raw: str, i: int, vs: Vars, out: _Fields, whole: str) -> int:
    """A double-quoted part from raw[i] (after the quote) to its closing quote."""
    n = len(raw)
    out.add("")
    while i < n and raw[i] != '"':
        c = raw[i]
        if c == "\\" and i + 1 < n:
            nxt = raw[i + 1]
            out.add("" if nxt == "\n" else nxt if nxt in '$`"\\' else raw[i : i + 2])
            i += 2
        elif c == "`":
            end = raw.find("`", i + 1)
            i = n if end < 0 else end + 1
            out.add(OPAQUE)
        elif c == "$":
            start = i
            i, kind, value = _dollar(raw, i, vs)
            if kind == "text" or (kind == "scalar" and isinstance(value, str)):
                out.add(value)
            elif kind == "array":
                if whole == f'"{raw[start:i]}"' and all(isinstance(v, str) for v in value):
                    out.fields.extend(value)  # "${ARR[@]}": one field per element
                    out.cur, out.started = [], False
                    return i + 1
                out.many = True
            elif raw[start : start + 2] in ("$@", "$*") or raw[start : start + 4] == "${@}":
                out.many = True
            else:
                out.add(OPAQUE)
        else:
            out.add(c)
            i += 1
    return i + 1


def literal(word: Word) -> str | None:
    """The word's text after quote removal when nothing in it is expanded, else None."""
    fields = expand(word, Vars(unknown=True), split=False)
    return fields[0] if len(fields) == 1 and isinstance(fields[0], str) else None
