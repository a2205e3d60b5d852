"""One line of a miles log at a time: the metric marker, the payload dict, the logging stamp, the
arguments listing. The parser (launcher/judge/parse/miles.py) assembles steps from these.

Why a module of its own: these are the shapes miles and slime print across versions, each read
by one small function that the file reader and the line reader share, so both read a log the same
way (docs/miles-log.md, "What the parser reads").
"""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime
from typing import TypeAlias

from launcher.excerpt import printable
from launcher.judge.parse.frame import payload

# A metric line: `step 7: {`, `perf 7: {`, `rollout 7: {`, anywhere in the line, so any prefix
# (Ray, ANSI, the logging prefix, a fragment of another process's line) is allowed before it.
KINDS = ("step", "perf", "rollout")
# `{role}-step N: {...}` (slime 843c94e9 on, miles: log_utils.py `role_tag`): another model's
# optimizer step (PPO's critic), never the actor's.
ROLE_STEP = "role-step"
# The train actor's perf dict, its keys and its step time by version:
# launcher/judge/parse/shapes.py.
# A dict logged without a marker: `train.py:88 - {'perf/step_time': ...}` (the logging prefix's
# ` - ` followed directly by the dict).
BARE = " - {"
# Megatron's arguments listing: `---- arguments ----`, `  name ..... value` lines, `---- end of
# arguments ----` (megatron/training/arguments.py, _print_args; miles' parse_args calls it).
# The title is searched by its right half, as Megatron prints it (24 dashes): a long needle is
# what keeps the scan for it cheap on a log that has none.
ARGS_BEGIN, ARGS_END = "arguments ------------------------", "end of arguments"


def wanted(line: str) -> bool:
    """A line the parser reads: a metric dict (marked or not) or an arguments listing."""
    return ": {" in line or BARE in line or ARGS_BEGIN in line


_ARG_RE = re.compile(r"^ {2}([A-Za-z_][A-Za-z0-9_]*) (?:\.+ | )(.*)$")

# The logging prefix `[2026-10-21 10:00:00.123 actor_cell0_rank0]`; some versions print no
# fraction and no process name (`[2026-10-21 10:00:00]`).
_STAMP_RE = re.compile(
    r"\[(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))?(?: [^\]\s]+)?\]"
)
# Every line here is the training container's output, hostile input: no expression below may
# backtrack super-linearly on it (nested or adjacent quantifiers over characters both can take,
# an unanchored search that starts with a quantifier). `\s*(?:ESC[..)*\s*\[repeated` searched a
# line of 3,000 spaces for 27 s (cubic); tests/judge/test_parse_regex_linear.py runs every pattern
# of this package on pathological lines of two sizes and holds the growth linear.
# Numbers read from a line are at most MAX_DIGITS digits: int() refuses more than 4,300 (a
# ValueError out of the parser), and no step or count is larger.
MAX_DIGITS = 18

# Ray prints the suffix in colour, with a one-time hint after it (DedupState.formatted):
# `<line>\x1b[32m [repeated 3x across cluster] (Ray deduplicates logs ...)\x1b[0m`. Found by
# its literal first, then the blanks and colour codes before it are walked back (`repeated`).
REPEATED_TEXT_RE = re.compile(r"\[repeated (\d{1,18})x across cluster\]")
REPEATED_BYTES_RE = re.compile(rb"\[repeated ([0-9]{1,18})x across cluster\]")
_ANSI_FINAL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_ANSI_PARAM = frozenset("0123456789;?")

# Flat dict of string keys to numbers: the shape of every metric payload miles prints. The digits
# before a point are one run (`\d+(?:\.\d*)?`, never `\d+\.?\d*`, whose two runs split a long
# digit run every way before failing: quadratic).
_NUM = r"[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"
_VAL = (
    rf"(?:np\.float(?:64|32|16)\(({_NUM})\)|np\.int(?:64|32)\(({_NUM})\)|({_NUM})"
    r"|(True|False|None))"
)
# A pair must end at `,` or `}`: a value such as `2.3.4` then matches nothing, the pair count
# falls short of the `': ` count, and the payload goes to the strict reader (which rejects it).
_PAIR_RE = re.compile(rf"'([^'\\]*)': {_VAL}(?=\s*[,}}])")
# One metric dict as printed: miles' keys are text, but a payload read by `literal` is any Python
# literal, so neither its keys nor its values are assumed.
Metrics: TypeAlias = dict[object, object]
_CONSTS = {"True": 1.0, "False": 0.0, "None": None}
_NAMES: dict[str, float | bool | None] = {
    "nan": float("nan"),
    "NaN": float("nan"),
    "inf": float("inf"),
    "Infinity": float("inf"),
}
_NAMES.update({"true": True, "false": False, "null": None})  # a JSON-style dump


def literal(node: ast.AST | None) -> object:
    """ast.literal_eval, extended with nan / inf, JSON's true/false/null and numpy scalar
    wrappers such as np.float64(x)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        return {literal(k): literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [literal(e) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if (
        isinstance(node, ast.Call)
        and len(node.args) == 1
        and not node.keywords
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("np", "numpy")
    ):
        return literal(node.args[0])
    raise ValueError(f"not a literal: {ast.dump(node)[:80] if node is not None else node}")


def parse_payload(text: str) -> Metrics:
    """Read one metric dict as miles prints it (Python repr, one line or several). Raises
    ValueError when it cannot."""
    text = text.strip()
    if text.startswith("{") and text.endswith("}"):
        pairs = _PAIR_RE.findall(text)
        if (
            pairs
            and len(pairs) == text.count("': ")
            and "{" not in text[1:]
            and "[" not in text
            and '"' not in text
        ):
            out: Metrics = {}
            for key, f64, i64, num, const in pairs:
                raw = f64 or i64 or num
                out[key] = float(raw) if raw else _CONSTS[const]
            return out
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as err:
        raise ValueError(f"syntax: {err.msg}") from None
    value = literal(tree.body)
    if not isinstance(value, dict):
        raise ValueError("payload is not a dict")
    return value


def small_int(text: str) -> int | None:
    """The value of a run of ASCII digits of at most MAX_DIGITS, else None (int() would take
    other scripts' digits, and raise on more than 4,300 of them)."""
    if 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None


def repeated(line: str) -> tuple[int, int] | None:
    """(where the suffix starts, N) of Ray's `[repeated Nx across cluster]` suffix, or None.

    The suffix starts with the blanks and colour codes before the bracket; what follows it is
    Ray's hint, to the end of the line. The same as the search of
    `\\s*(?:ESC\\[[0-9;?]*[A-Za-z])*\\s*\\[repeated (\\d+)x across cluster\\].*$` (leftmost match)
    with N of at most MAX_DIGITS digits, found in linear time: the literal first, then the gap
    before it walked back (tests/judge/test_parse_regex_linear.py holds the two equal)."""
    body = len(line) - 1 if line.endswith("\n") else len(line)
    newline = line.rfind("\n", 0, body)  # `.*$` reads no line break but a last one
    for found in REPEATED_TEXT_RE.finditer(line):
        if found.end() > newline:
            return _gap_start(line, found.start()), int(found.group(1))
    return None


def _gap_start(line: str, end: int) -> int:
    """Where `\\s*(?:ESC[..)*\\s*` ending at `end` starts at the earliest: blanks, then colour
    codes, then blanks, read backwards (each character looked at a bounded number of times)."""
    i = end
    while i > 0 and line[i - 1].isspace():
        i -= 1
    while i > 0 and line[i - 1] in _ANSI_FINAL:
        j = i - 1
        while j > 0 and line[j - 1] in _ANSI_PARAM:
            j -= 1
        if j < 2 or not line.startswith("\x1b[", j - 2, j):
            break
        i = j - 2
    while i > 0 and line[i - 1].isspace():
        i -= 1
    return i


def marker(line: str) -> tuple[str, int, str] | None:
    """(kind, N, payload) of the first `<kind> N: {` in the line, or None. A role-tagged step
    line (`critic-step N: {`) has kind ROLE_STEP."""
    i = line.find(": {")
    while i >= 0:
        # N is at most MAX_DIGITS long: the space before it is looked for that far back only
        # (from the line's start, each of many `: {` scanned and copied the line: quadratic)
        j = line.rfind(" ", max(0, i - MAX_DIGITS - 1), i)
        num = small_int(line[j + 1 : i]) if j > 0 else None
        if num is not None:
            for kind in KINDS:
                k = j - len(kind)
                if not line.startswith(kind, k, j):
                    continue
                if k == 0 or not (line[k - 1].isalnum() or line[k - 1] in "_/-"):
                    return kind, num, line[i + 2 :]
                if kind == "step" and line[k - 1] == "-":  # `critic-step N:`: not the actor's
                    return ROLE_STEP, num, line[i + 2 :]
        i = line.find(": {", i + 3)
    return None


def bare(line: str) -> str | None:
    """The payload of a dict logged without a marker (`... - {...}`), or None."""
    i = line.find(BARE)
    return line[i + 3 :] if i >= 0 else None


def depth(text: str) -> int:
    """Braces and brackets opened minus closed, outside quoted strings."""
    level, quote, escaped = 0, "", False
    for c in text:
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "{[(":
            level += 1
        elif c in "}])":
            level -= 1
    return level


def strip_prefix(line: str) -> str:
    """A line's payload: without the prefixes a capture put before it (docker, kubectl,
    journald, srun, Ray: launcher/judge/parse/frame.py, the one rule), colour codes and its end."""
    return payload(line)


def continues_dict(line: str) -> bool:
    """Whether a line (prefix stripped) can be the next line of a dict printed over several:
    pretty printers indent them, or close the dict; a new log record cannot be one."""
    return bool(line) and line[0] in " \t}])" and not stamp(line)


def argument(line: str) -> tuple[str, str] | None:
    """(name, value as printed) of one line of the arguments listing, or None."""
    m = _ARG_RE.match(payload(line))
    return (m.group(1), m.group(2)) if m else None


def stamp(line: str) -> tuple[float, bool] | None:
    """(epoch seconds UTC, whether to the millisecond) of the logging prefix, or None."""
    m = _STAMP_RE.search(line)
    if not m:
        return None
    y, mo, d, h, mi, s, frac = m.group(1, 2, 3, 4, 5, 6, 7)
    micro = int(frac.ljust(6, "0")) if frac else 0
    try:
        dt = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), micro, tzinfo=UTC)
    except ValueError:
        return None
    return dt.timestamp(), frac is not None


# stamp() on an ASCII line, for the file reader's fast path: the same expression on bytes (`\\s` of
# a str pattern also matches \x1c-\x1f), and the minute's epoch cached, since a log's lines share
# their minutes. The same value as stamp(): whole microseconds over 10**6, as datetime computes it.
_STAMP_BYTES_RE = re.compile(
    rb"\[([0-9]{4})-([0-9]{2})-([0-9]{2})[ T]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    rb"(?:[.,]([0-9]{1,6}))?(?: [^\]\s\x1c-\x1f]+)?\]"
)
_MINUTES: dict[bytes, int | None] = {}


def stamp_bytes(line: bytes) -> tuple[float, bool] | None:
    """stamp() of an ASCII line given as bytes."""
    m = _STAMP_BYTES_RE.search(line)
    if not m:
        return None
    minute = line[m.start(1) : m.end(5)]
    base = _MINUTES.get(minute, 0)
    if base == 0:
        y, mo, d, h, mi = (int(g) for g in m.group(1, 2, 3, 4, 5))
        try:
            base = int(datetime(y, mo, d, h, mi, tzinfo=UTC).timestamp())
        except ValueError:
            base = None
        if len(_MINUTES) > 4096:
            _MINUTES.clear()
        _MINUTES[minute] = base
    second = int(m.group(6))
    if base is None or second > 59:
        return None
    frac = m.group(7)
    micro = int(frac.ljust(6, b"0")) if frac else 0
    return ((base + second) * 1_000_000 + micro) / 1_000_000, frac is not None


def as_float(value: object) -> float | None:
    """A metric's value as a float; None for a missing value, a bool or text."""
    if value.__class__ is float:
        return float(value)  # the common case first
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def number(metrics: Metrics, *keys: str) -> float | None:
    """The first of `keys` that holds a number (bools and text are not numbers here)."""
    for key in keys:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def shown(line: str, limit: int = 160) -> str:
    """A line as a person can read it in a message: made printable (launcher/excerpt.py, the one
    rule for text from the node), length capped."""
    text = printable(line.rstrip("\r\n"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def last_step(data: bytes) -> int | None:
    """N of the last `step N: {` line in a chunk of the log (None when it has none).

    The runner's progress reads the log through this, so a step line is recognised in one place.
    """
    last = None
    for line in data.decode(errors="replace").splitlines():
        found = marker(line)
        if found is not None and found[0] == "step":
            last = found[1]
    return last
