"""Every regular expression that reads what a container printed runs in linear time.

Why: the miles log, node.log's markers and progress lines are the training container's output,
hostile input to the launcher (docs/architecture.md, "The trust boundary"), and Python's `re`
backtracks. `REPEATED_RE` (`\\s*(?:ESC[...)*\\s*\\[repeated ...`, searched on every line holding
`cluster]`) took 27 s on one line of `x 1: {` + 3,000 spaces + `across cluster]`, and about
30 minutes on 12,000 spaces: `measure`, `verify` of a hostile bundle and the nightly hung. So the
class is held here, not the one expression: every compiled pattern a module of the log parser
(launcher/judge/parse/), the node protocol (launcher/plan/protocol.py) or the runner
(launcher/runner/) holds at module level is found by walking the modules (a pattern added later
is covered unasked) and run on pathological inputs: long runs of spaces, digits, `ESC[`, `:`,
`{`, of each character the pattern names, and inputs pumped from the pattern itself (every short
window of every sequence in its parse tree, repeated behind a prefix that leads the engine there:
`(pid=1pid=1...` for `\\([^()]*pid=\\d+[^()]*\\)`, `'k': 0000...` for `\\d+\\.?\\d*`).

How, without timing a test against the clock (the suite has no wall-clock thresholds: CI machines
are loaded): each input is run at two sizes in the same process, and the larger (8x) must cost
less than RATIO times the smaller's CPU time, plus SLACK. Linear work gives 8x, quadratic 64x,
cubic 512x; CPU time (not wall time) and the minimum of REPEATS runs keep the ratio steady under
load. A run past its bound is cut by a CPU-time alarm (SIGPROF; `re` checks signals while it
backtracks), so a super-linear pattern fails in seconds instead of hanging the suite.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from re import _compiler as sre_compile  # type: ignore[attr-defined]
from re import _constants as sre_const  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

import pytest

from launcher.judge.parse import frame, lines, templates
from launcher.judge.parse import shapes as log_shapes
from launcher.judge.parse.miles import MilesLogParser, parse_lines

PACKAGES = ("launcher.judge.parse", "launcher.runner")
MODULES = ("launcher.plan.protocol", "launcher.plan.markers")
SMALL, LARGE = 2_000, 16_000
RATIO = 30.0  # linear is 8, quadratic 64
SLACK = 0.02  # CPU seconds: what a linear search of 16,000 characters never comes near
REPEATS = 3
WINDOW = 4  # the longest run of a sequence's items pumped as one unit
# Characters tried where a pattern wants one of a set (the first one the set takes is used).
POOL = "a0 x_Z-.:{}'\"[](),=\x1b\t\n\x00!/e\u00e9"


def _modules() -> list[Any]:
    found = [importlib.import_module(name) for name in MODULES]
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        found.append(pkg)
        for info in pkgutil.walk_packages(pkg.__path__, package + "."):
            found.append(importlib.import_module(info.name))
    return found


def _patterns() -> dict[str, re.Pattern]:
    """module.NAME -> every compiled pattern held at module level (also in a dict, list, tuple
    or set there), each once."""
    out: dict[str, re.Pattern] = {}
    seen: set[int] = set()
    for mod in _modules():
        for name, value in sorted(vars(mod).items()):
            values = [value]
            if isinstance(value, dict):
                values = list(value.values())
            elif isinstance(value, (list, tuple, set, frozenset)):
                values = list(value)
            for item in values:
                if isinstance(item, re.Pattern) and id(item) not in seen:
                    seen.add(id(item))
                    out[f"{mod.__name__}.{name}"] = item
    return out


PATTERNS = _patterns()


# --- inputs pumped from a pattern's parse tree ---


class _Sampler:
    """Short strings that match pieces of one pattern (lookarounds and anchors ignored: a
    heuristic that leads the engine into a piece, not a proof that the whole matches)."""

    def __init__(self, pattern: re.Pattern) -> None:
        self.binary = isinstance(pattern.pattern, bytes)
        self.flags = pattern.flags
        self.parsed = sre_parse.parse(pattern.pattern, pattern.flags)
        self._chars: dict[str, str] = {}

    def _char(self, item: tuple[Any, Any]) -> str:
        """A character that the one-character item (a set, `.`, a negated literal) takes."""
        key = repr(item)
        if key not in self._chars:
            sub = sre_parse.SubPattern(self.parsed.state, [item])
            one = sre_compile.compile(sub, self.flags)
            pool = POOL + "".join(map(chr, range(256)))
            for c in pool:
                if self.binary and ord(c) > 255:
                    continue
                if one.fullmatch(c.encode("latin-1") if self.binary else c):
                    self._chars[key] = c
                    break
            else:
                self._chars[key] = ""
        return self._chars[key]

    def sample(self, items: list[tuple[Any, Any]]) -> str:
        out = []
        for op, av in items:
            if op is sre_const.LITERAL:
                out.append(chr(av))
            elif op in (sre_const.NOT_LITERAL, sre_const.IN, sre_const.ANY):
                out.append(self._char((op, av)))
            elif op in (sre_const.MAX_REPEAT, sre_const.MIN_REPEAT, sre_const.POSSESSIVE_REPEAT):
                low, high, sub = av
                out.append(self.sample(list(sub)) * (max(low, 1) if high else 0))
            elif op is sre_const.SUBPATTERN:
                out.append(self.sample(list(av[-1])))
            elif op is sre_const.ATOMIC_GROUP:
                out.append(self.sample(list(av)))
            elif op is sre_const.BRANCH:
                out.append(self.sample(list(av[1][0])))
        return "".join(out)

    def contexts(
        self, items: list[tuple[Any, Any]], prefix: str
    ) -> Iterator[tuple[str, list[tuple[Any, Any]]]]:
        """(prefix, sequence) for every sequence in the tree: the prefix leads to its start."""
        yield prefix, items
        for m, (op, av) in enumerate(items):
            before = prefix + self.sample(items[:m])
            subs: list[Any] = []
            if op in (sre_const.MAX_REPEAT, sre_const.MIN_REPEAT, sre_const.POSSESSIVE_REPEAT):
                subs = [av[2]]
            elif op is sre_const.SUBPATTERN:
                subs = [av[-1]]
            elif op is sre_const.ATOMIC_GROUP:
                subs = [av]
            elif op is sre_const.BRANCH:
                subs = list(av[1])
            elif op in (sre_const.ASSERT, sre_const.ASSERT_NOT):
                subs = [av[1]]
            for sub in subs:
                yield from self.contexts(list(sub), before)

    def pumps(self) -> Iterator[tuple[str, str]]:
        """(head, unit): the head, then the unit repeated, drives one window of one sequence."""
        for prefix, items in self.contexts(list(self.parsed), ""):
            for i in range(len(items)):
                head = prefix + self.sample(items[:i])
                for j in range(i, min(len(items), i + WINDOW)):
                    unit = self.sample(items[i : j + 1])
                    if unit:
                        yield head, unit


def _fill(head: str, unit: str, tail: str, size: int) -> str:
    body = max(size - len(head) - len(tail), len(unit))
    return head + (unit * (body // len(unit) + 1))[:body] + tail


def _shapes(pattern: re.Pattern) -> list[tuple[str, str, str]]:
    """(head, unit, tail) of every pathological input for `pattern`."""
    fixed = [" ", "\t", "\x1b[", "0", "9;", ":", "{", ": {", "'", "x", "\x1b[0m ", "\\"]
    shapes = [("", unit, "") for unit in fixed]
    shapes.append(("x 1: {", " ", "across cluster]"))  # the red team's line
    shapes.append(("(", "pid=1", ""))
    sampler = _Sampler(pattern)
    source = pattern.pattern
    text = source.decode("latin-1") if isinstance(source, bytes) else source
    shapes += [("", c, "") for c in sorted(set(text))]
    for head, unit in sampler.pumps():
        shapes.append((head, unit, ""))
        shapes.append((head, unit, "\x00"))
    return list(dict.fromkeys(shapes))


# --- measuring ---


class _OverBound(Exception):
    """The CPU-time alarm: the run went past its bound."""


def _alarm(_signum: int, _frame: Any) -> None:
    raise _OverBound


def _cpu(run: Callable[[], object], bound: float | None = None) -> float:
    """CPU seconds `run` took; inf when it went past `bound` (cut by SIGPROF)."""
    can_cut = bound is not None and threading.current_thread() is threading.main_thread()
    if can_cut:
        previous = signal.signal(signal.SIGPROF, _alarm)
        signal.setitimer(signal.ITIMER_PROF, max(float(bound or 0), 0.001))
    start = time.thread_time()
    try:
        run()
    except _OverBound:
        return float("inf")
    finally:
        if can_cut:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, previous)
    return time.thread_time() - start


def _ops(pattern: re.Pattern, subject: Any) -> list[tuple[str, Callable[[], object]]]:
    return [
        ("search", lambda: pattern.search(subject)),
        ("fullmatch", lambda: pattern.fullmatch(subject)),
        ("finditer", lambda: sum(1 for _ in pattern.finditer(subject))),
    ]


def _subject(pattern: re.Pattern, text: str) -> Any:
    if isinstance(pattern.pattern, bytes):
        return text.encode("latin-1", "replace")
    return text


def superlinear(
    ops: Callable[[str], list[tuple[str, Callable[[], object]]]],
    shapes: list[tuple[str, str, str]],
) -> str | None:
    """The first input on which one of `ops` (what to run on a text) costs more than linear
    time, described; else None."""
    for head, unit, tail in shapes:
        small, large = _fill(head, unit, tail, SMALL), _fill(head, unit, tail, LARGE)
        for (op, run_small), (_, run_large) in zip(ops(small), ops(large), strict=True):
            base = min(_cpu(run_small) for _ in range(REPEATS))
            bound = RATIO * base + SLACK
            took = float("inf")
            # Again only when over the bound, and only where load could explain it: a run cut
            # past half a CPU second at 30x the smaller's is no noise.
            for _ in range(REPEATS if bound < 0.5 else 1):
                took = min(took, _cpu(run_large, bound))
                if took <= bound:
                    break
            if took > bound:
                shown = f"{head!r} + {unit!r} * n + {tail!r}"
                grew = "past the bound (cut)" if took == float("inf") else f"{took / base:.0f}x"
                return (
                    f"{op} on {shown}: {base * 1e3:.2f} ms CPU at {SMALL:,} characters, "
                    f"{grew} at {LARGE:,} (linear is 8x, the bound {RATIO:g}x + {SLACK}s)"
                )
    return None


def _on(pattern: re.Pattern) -> Callable[[str], list[tuple[str, Callable[[], object]]]]:
    return lambda text: _ops(pattern, _subject(pattern, text))


def test_every_module_pattern_is_found():
    """The walk finds the patterns this file exists for (a walk that finds nothing passes
    everything)."""
    names = set(PATTERNS)
    for name in (
        "launcher.judge.parse.lines.REPEATED_TEXT_RE",
        "launcher.judge.parse.frame._RAY_RE",
        "launcher.judge.parse.frame._JOURNALD_RE",
        "launcher.judge.parse.frame._DOCKER_RE",
        "launcher.judge.parse.frame._KUBECTL_RE",
        "launcher.judge.parse.frame._SRUN_RE",
        "launcher.judge.parse.lines._PAIR_RE",
        "launcher.judge.parse.templates._FLAT_RE",
        "launcher.plan.markers._MARKER_LINE",
        "launcher.plan.protocol._PROGRESS_LINE",
    ):
        assert name in names, sorted(names)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_runs_in_linear_time(name):
    pattern = PATTERNS[name]
    found = superlinear(_on(pattern), _shapes(pattern))
    assert found is None, f"{name} ({pattern.pattern!r}) is super-linear: {found}"


def test_payload_templates_run_in_linear_time():
    """The file reader compiles one pattern per payload layout it meets (templates.py): built
    from the reference number grammar, so a layout made from a hostile payload is held too."""
    tmpl = templates.template_of(b"{'perf/step_time': 1.5, 'loss': np.float64(2.0)}")
    assert tmpl is not None
    shapes = [
        ("{'perf/step_time': ", "1", ""),
        ("{'perf/step_time': 1", ".1", ""),
        ("{'perf/step_time': 1.5, 'loss': np.float64(", "9", ""),
        ("{'perf/step_time': ", "1e", ""),
    ]
    found = superlinear(_on(tmpl.regex), shapes)
    assert found is None, f"a payload template is super-linear: {found}"


# --- the line readers around the patterns ---

LINE_SHAPES = [
    ("", " ", ""),
    ("x 1: {", " ", "across cluster]"),
    ("x 1: {", " ", "\x1b[32m [repeated 3x across cluster]"),
    ("", " \x1b[0m", "[repeated 3x across cluster]"),
    ("", "[repeated 3x across cluster]", ""),
    ("", ": {", ""),
    ("", "x: {", ""),
    ("step ", "1", ": {'a': 1}"),
    ("step 1: {", "'a': 1, ", "}"),
    ("step 1: {'a': ", "1", "}"),
    ("step 1: {'a': ", "[", "}"),
    ("step 1: {'a': ", "'", "}"),
    ("", "(pid=1", ""),
    ("(", "pid=1", ") step 1: {'a': 1}"),
    ("", "\x1b[", ""),
    ("", "\x1b[1;", ""),
    ("", " - {", ""),
    ("", "[2026-10-21 10:00:00", ""),
    ("  name ", ".", " x"),
    ("ft op=train_step rollout=", "9", " valid_step=false"),
    ("", "Killed ", ""),
    ("", "1 ", "Killed"),
    ("", "{", ""),
    ("", "}", ""),
    ("", ":", ""),
    ("", "0", ""),
]


def _line_ops(text: str) -> list[tuple[str, Callable[[], object]]]:
    def payload() -> object:
        try:
            return lines.parse_payload(text)
        except (ValueError, TypeError, RecursionError, MemoryError):  # as the parser catches
            return None

    raw = text.encode("utf-8", "surrogateescape")
    return [
        ("marker", lambda: lines.marker(text)),
        ("repeated", lambda: lines.repeated(text)),
        ("strip_prefix", lambda: lines.strip_prefix(text)),
        ("stamp", lambda: lines.stamp(text)),
        ("argument", lambda: lines.argument(text)),
        ("depth", lambda: lines.depth(text)),
        ("parse_payload", payload),
        ("last_step", lambda: lines.last_step(raw)),
        ("skipped_rollout", lambda: log_shapes.skipped_rollout(text)),
        ("maybe_signal", lambda: log_shapes.maybe_signal(text)),
        ("signal", lambda: log_shapes.signal(text)),
        ("parse_lines", lambda: list(parse_lines([text + "\n"]))),
        ("fast", lambda: MilesLogParser().fast(raw)),
    ]


def test_the_line_readers_run_in_linear_time():
    """What the parser does to one line around its patterns (finding `: {`, walking back from
    `[repeated`, the payload's brackets) is held the same way: a scan that starts again from the
    line's start for each of many `: {` was quadratic too."""
    found = superlinear(_line_ops, LINE_SHAPES)
    assert found is None, f"a line reader is super-linear: {found}"


# --- the harness catches what it is for, and the linear readers read what the old ones read ---

# The expressions this file found super-linear, as they were (2026-12: red team, ReDoS).
OLD_REPEATED = re.compile(r"\s*(?:\x1b\[[0-9;?]*[A-Za-z])*\s*\[repeated (\d+)x across cluster\].*$")
OLD_RAY_PREFIX = re.compile(
    r"^(?:\x1b\[[0-9;?]*[A-Za-z])*\([^()]*pid=\d+[^()]*\)(?:\x1b\[[0-9;?]*[A-Za-z])* ?"
)
OLD_NUM = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"


@pytest.mark.parametrize(
    "pattern",
    [OLD_RAY_PREFIX, re.compile(rf"'([^'\\]*)': ({OLD_NUM})(?=\s*[,}}])")],
    ids=["ray-prefix", "number"],
)
def test_the_harness_finds_a_quadratic_pattern(pattern):
    """A quadratic pattern fails here (the cubic REPEATED of the report takes minutes to be cut,
    too long for every run of the suite; it fails test_pattern_runs_in_linear_time the same way)."""
    assert superlinear(_on(pattern), _shapes(pattern)) is not None


TOKENS = [" ", "\t", "\x1b[", "32", ";", "m", "0", "x", "[repeated ", "3", "x across cluster]"]
TOKENS += ["\n", "\u3000", "(pid=", "1", ")", "(", "a", "\x1b[0m", "?", "\x1c", "\u0663"]


def _lines(count: int, seed: int) -> Iterator[str]:
    rng = __import__("random").Random(seed)
    for _ in range(count):
        yield "".join(rng.choice(TOKENS) for _ in range(rng.randint(0, 14)))


def test_repeated_finds_what_the_old_expression_found():
    for line in _lines(40_000, 1):
        old = OLD_REPEATED.search(line)
        want = None
        if old is not None and len(old.group(1)) <= lines.MAX_DIGITS:
            want = (old.start(), int(old.group(1)))
        assert lines.repeated(line) == want, repr(line)


def test_strip_prefix_strips_what_the_old_expression_stripped():
    # Ray's prefix as before (its pid in ASCII digits: `\\d` took every script's); the other
    # captures' prefixes (launcher/judge/parse/frame.py) need words these lines never hold.
    ascii_pid = re.compile(OLD_RAY_PREFIX.pattern.replace(r"pid=\d+", "pid=[0-9]+"))
    for line in _lines(40_000, 2):
        want = ascii_pid.sub("", line, count=1)
        if "\x1b" in want:
            want = frame.ANSI_RE.sub("", want)
        assert lines.strip_prefix(line) == want.rstrip("\r\n"), repr(line)


def test_numbers_are_read_as_the_old_grammar_read_them():
    old = re.compile(OLD_NUM)
    new = re.compile(lines._NUM)
    for text in _lines(20_000, 3):
        text = text.replace(" ", ".").replace("x", "e")
        assert [m.span() for m in old.finditer(text)] == [m.span() for m in new.finditer(text)]
