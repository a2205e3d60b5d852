"""The `run` block as bash runs it: the train script's calls, their argument words, the variables
the block exports, and what the block does that validate cannot follow.

Why: runargs.py holds the block's arguments to the recipe's fields, and that check is worth
something only when the words it reads are the words bash will pass. bashread.py splits the
block as bash's parser does and bashwords.py expands each word as far as the block tells; this
module walks the commands in order, as the shell would, and keeps the promise fail closed: a
`train.py` that appears anywhere but as the script of a `python` command bash runs (inside a
here-document, a string, a `$(...)`, the arguments of `read` in a folded `run: >` block, an
`eval`), a python whose script is only known at run time, a command word only known at run
time, a function that redefines a command the reading relies on, or a construct bashread does
not follow, is a problem that refuses the recipe, naming the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from launcher.inputs.bashread import Command, ReadError, Word, read_script
from launcher.inputs.bashwords import OPAQUE, OPAQUE_WORDS, Vars, expand, literal

TRAIN_SCRIPTS = ("train.py", "train_async.py")
_TRAIN_MODULES = ("train", "train_async")
_MENTION_RE = re.compile(r"(?<![\w.-])(?:train|train_async)\.py(?![\w-])")
_PYTHON_RE = re.compile(r"(?:.*/)?python(?:\d+(?:\.\d+)*)?")
_ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UNQUOTE = str.maketrans("", "", "'\"\\\n")  # what quote removal drops between letters
_ELEMENT_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\[[^]]*\]\+?=")  # ARR[1]=64
# What changes a variable from inside a word: `${NAME:=...}` and arithmetic (`$((N = 64))`,
# `((N++))`, `let N=64`).
_DEFAULT_SET_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?=")
_ARITH_SET_RE = re.compile(
    r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:\[[^]]*\])?\s*(?:[-+*/%&|^]|<<|>>)?=(?!=)"
    r"|(?:\+\+|--)\s*([A-Za-z_][A-Za-z0-9_]*)|([A-Za-z_][A-Za-z0-9_]*)\s*(?:\+\+|--)"
)
# python's options that take a value, and those that end its options (-c CODE, -m MODULE, -)
_PY_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})
# Commands that run the rest of their words as a command, and how many option words each
# takes before it (a dict: option -> takes a value).
WRAPPERS: dict[str, dict[str, bool]] = {
    "exec": {"-a": True, "-c": False, "-l": False},
    "env": {"-i": False, "-u": True, "--ignore-environment": False, "-0": False},
    "nohup": {},
    "time": {"-p": False},
    "command": {"-p": False},
    "stdbuf": {"-i": True, "-o": True, "-e": True},
    "timeout": {"-s": True, "-k": True, "--foreground": False, "--preserve-status": False,
                "-v": False},
    "nice": {"-n": True},
}  # fmt: skip
_DECLARERS = frozenset({"export", "declare", "typeset", "local", "readonly"})
_READERS = frozenset({"read", "mapfile", "readarray"})
_RUNS_TEXT = frozenset({"eval", "source", "."})
_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
# Function names that would change what this reading relies on.
_RESERVED_NAMES = _DECLARERS | _READERS | _RUNS_TEXT | set(WRAPPERS) | {"printf", "unset", "set"}
FOLDED_HINT = (
    "a `run: >` block is folded by YAML into one line, so the lines after a command become its "
    "arguments: write `run: |`"
)


@dataclass
class RunBlock:
    """What the run block says: the train script's arguments, its exports, what it hides."""

    invocations: list[tuple[int, list[Any]]] = field(default_factory=list)  # (line, argv)
    exports: dict[str, tuple[int, Any]] = field(default_factory=dict)  # name -> (line, value)
    # every variable the block puts in a program's environment: (line, name, value)
    environ: list[tuple[int, str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why it cannot be read, with the line


# Expansions a text may hold, which can join letters around them once expanded (`tr${E}ain.py`
# with E empty): a mention is looked for with them taken out too.
_EXPANSION_RE = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\$\([^()]*\)|`[^`]*`")


def mentions_train(text: str) -> bool:
    """Whether TEXT names a train script: as written, or joined across its quotes, escapes and
    the expansions in it (which the running shell could make empty)."""
    if _MENTION_RE.search(text) is not None:
        return True
    joined = _EXPANSION_RE.sub("", text).translate(_UNQUOTE)
    return _MENTION_RE.search(joined) is not None


def read_run_block(script: str) -> RunBlock:
    """The block's train calls (argument words OPAQUE where only the running shell knows them)
    and every problem that keeps validate from being sure what bash will run."""
    block = RunBlock()
    try:
        parsed = read_script(script)
    except ReadError as err:
        block.problems.append(f"{err}; expected a script whose train.py call bash's grammar shows")
        return block
    for line, name in parsed.functions:
        if _PYTHON_RE.fullmatch(name) or name in _RESERVED_NAMES or name in TRAIN_SCRIPTS:
            block.problems.append(
                f"line {line} defines a function `{name}`, which changes what that command "
                "does where the block names it; expected no function of that name"
            )
    walker = _Walker(block, {name for _, name in parsed.functions})
    for cmd in parsed.commands:
        walker.command(cmd)
    return block


class _Walker:
    def __init__(self, block: RunBlock, functions: set[str]):
        self.block, self.vs, self.allexport = block, Vars(), False
        self.functions = functions
        self.transformed: set[str] = set()  # declare -i/-l/-u: an assignment's value changes

    def side_effects(self, cmd: Command) -> None:
        """Variables a command changes from inside its words: unknown after it."""
        for w in [*cmd.words, *cmd.redirects]:
            for name in _DEFAULT_SET_RE.findall(w.raw):
                self.vs.forget(name)
            arithmetic = "$((" in w.raw or "$[" in w.raw or cmd.kind == "test"
            if arithmetic or (cmd.words and cmd.words[0].raw == "let"):
                for m in _ARITH_SET_RE.finditer(w.raw):
                    self.vs.forget(next(g for g in m.groups() if g))

    def hidden(self, line: int, where: str, hint: str = "") -> None:
        self.block.problems.append(
            f"line {line}: train.py appears {where}, where validate cannot see it run or read "
            "its arguments; expected the train script called as `python3 train.py ...`, a "
            "command of its own" + (f" ({hint})" if hint else "")
        )

    def _mention(self, word: Word) -> bool:
        raw = word.raw
        if "$'" not in raw and '$"' not in raw:  # quotes and escapes only join letters
            return mentions_train(raw)
        text = literal(word)
        return mentions_train(raw) or (text is not None and mentions_train(text))

    def command(self, cmd: Command) -> None:
        self.side_effects(cmd)
        for body in cmd.heredocs:
            if mentions_train(body.raw):
                self.hidden(body.line, "in a here-document's text")
        for target in cmd.redirects:
            if self._mention(target):
                self.hidden(target.line, f"in a redirection (`{target.raw}`)")
        if cmd.kind == "for":
            if len(cmd.words) > 1 and _NAME_RE.fullmatch(cmd.words[1].raw):
                self.vs.forget(cmd.words[1].raw)
            for w in cmd.words[2:]:
                if self._mention(w):
                    self.hidden(w.line, "in the words of a `for` loop")
            return
        if cmd.kind == "test":
            if any(self._mention(w) for w in cmd.words):
                self.hidden(cmd.line, "in a test (`[[ ]]` or `(( ))`)")
            return
        words = cmd.words
        i = 0
        while i < len(words) and (
            _ASSIGN_RE.match(words[i].raw) or _ELEMENT_RE.match(words[i].raw)
        ):
            element = _ELEMENT_RE.match(words[i].raw)
            if element:  # ARR[1]=64: the array is no longer what the block said
                if self._mention(words[i]):
                    self.hidden(words[i].line, f"in the value of {element.group(1)}")
                self.vs.forget(element.group(1))
            i += 1
        if i == len(words):  # assignments alone: the shell's own variables
            for w in words:
                self.assign(w, cmd, exported=self.allexport)
            return
        for w in words[:i]:  # FOO=1 cmd: in cmd's environment only
            m = _ASSIGN_RE.match(w.raw)
            if m is None:
                continue
            value = self.value_of(w, m)
            self.block.environ.append((w.line, m.group(1), value))
        name_word = words[i]
        if name_word.raw in _DECLARERS:
            self.declare(name_word.raw, words[i + 1 :], cmd)
            return
        argv: list[Any] = []
        sources: list[Word] = []
        for w in words[i:]:
            fields = expand(w, self.vs)
            argv += fields
            sources += [w] * len(fields)
        if not argv:
            return
        if not isinstance(argv[0], str):
            self.block.problems.append(
                f"line {cmd.line}: runs a command only known at run time (`{name_word.raw}`); "
                "expected the command named in the block, so validate knows what runs"
            )
            return
        self.builtin(argv, cmd)
        start = self.unwrap(argv, cmd)
        script_at = self.python_script(argv, start)
        if script_at is not None:
            script = argv[script_at]
            if isinstance(script, str):
                base = script.rsplit("/", 1)[-1]
                if base in TRAIN_SCRIPTS or (
                    argv[script_at - 1] == "-m" and script in _TRAIN_MODULES
                ):
                    self.block.invocations.append((cmd.line, argv[script_at + 1 :]))
                    for w in dict.fromkeys(sources[script_at + 1 :]):  # what its words run
                        if any(m in w.raw for m in ("$(", "`", "<(", ">(")) and self._mention(w):
                            self.hidden(w.line, "in a command its arguments run")
                    return
            else:
                self.block.problems.append(
                    f"line {cmd.line}: runs python with a script only known at run time "
                    f"(`{sources[script_at].raw}`); expected the script named in the block"
                )
                return
        for k, w in enumerate(sources):
            if self._mention(w):
                folded = k > 0 and bool(_PYTHON_RE.fullmatch(sources[k - 1].raw))
                self.hidden(w.line, f"as an argument of `{argv[0]}`", FOLDED_HINT * folded)
                return

    def value_of(self, w: Word, m: re.Match[str]) -> Any:
        if w.elements is not None:
            return OPAQUE_WORDS
        value_word = Word(m.group(3), w.line)
        if self._mention(value_word):
            self.hidden(w.line, f"in the value of {m.group(1)}")
        return expand(value_word, self.vs, split=False)[0]

    def assign(self, w: Word, cmd: Command, *, exported: bool, arrays_too: bool = True) -> None:
        m = _ASSIGN_RE.match(w.raw)
        if m is None:
            return
        name = m.group(1)
        if w.elements is not None:
            for e in w.elements:
                if self._mention(e):
                    self.hidden(e.line, f"in the array {name}")
            if cmd.conditional or m.group(2):
                self.vs.forget(name)
            else:
                self.vs.set_array(name, [v for e in w.elements for v in expand(e, self.vs)])
            return
        value = self.value_of(w, m)
        changed = cmd.conditional or m.group(2) or name in self.transformed
        self.vs.set_scalar(name, OPAQUE if changed else value)
        if exported:
            self.block.exports[name] = (w.line, self.vs.scalars[name])
            self.block.environ.append((w.line, name, self.vs.scalars[name]))

    def declare(self, keyword: str, words: list[Word], cmd: Command) -> None:
        flags = "".join(w.raw[1:] for w in words if w.raw.startswith(("-", "+")))
        exported = keyword == "export" or "x" in flags or self.allexport
        if "n" in flags and keyword != "export":  # a name reference: assignments go elsewhere
            self.vs.unknown = True
        if set(flags) & set("ilu"):  # the value is evaluated or its case changed
            for w in words:
                name = w.raw.split("=", 1)[0].split("+", 1)[0]
                if _NAME_RE.fullmatch(name):
                    self.transformed.add(name)
        for k, w in enumerate(words):
            if self._mention(w):
                folded = k > 0 and bool(_PYTHON_RE.fullmatch(words[k - 1].raw))
                self.hidden(w.line, f"as an argument of `{keyword}`", FOLDED_HINT * folded)
                return
        for w in words:
            if w.raw.startswith(("-", "+")):
                continue
            if _ASSIGN_RE.match(w.raw):
                self.assign(w, cmd, exported=exported)
            elif _NAME_RE.fullmatch(w.raw):
                if exported:
                    value = self.vs.scalar(w.raw)
                    self.block.exports[w.raw] = (w.line, value)
                    self.block.environ.append((w.line, w.raw, value))
            else:
                self.block.problems.append(
                    f"line {w.line}: `{keyword} {w.raw}`: not a variable name bash accepts, or "
                    "one known only at run time; expected NAME or NAME=value"
                )
                return

    def builtin(self, argv: list[Any], cmd: Command) -> None:
        """What a builtin does to the variables the reading knows."""
        name = argv[0]
        words = [a for a in argv[1:] if isinstance(a, str)]
        shell_text = name.rsplit("/", 1)[-1] in _SHELLS and "-c" in argv[1:-1]
        text = (
            argv[argv.index("-c") + 1 :][:1] if shell_text else argv[1:] if name == "eval" else []
        )
        if any(not isinstance(t, str) for t in text):
            self.block.problems.append(
                f"line {cmd.line}: `{name}` runs text only known at run time, which may call "
                "train.py where validate cannot read it; expected the commands written in the block"
            )
        if name in _RUNS_TEXT:
            self.vs.unknown = True  # it may set anything
        elif name == "read":
            k = 1
            while k < len(argv):
                a = argv[k]
                if isinstance(a, str) and a.startswith("-") and len(a) > 1:
                    if a[-1] in "adinNptu" and k + 1 < len(argv):
                        if a[-1] == "a" and isinstance(argv[k + 1], str):
                            self.vs.forget(argv[k + 1])
                        k += 1
                elif isinstance(a, str) and _NAME_RE.fullmatch(a):
                    self.vs.forget(a)
                k += 1
        elif name in ("mapfile", "readarray", "unset", "getopts"):
            for a in words:
                base = a.split("[", 1)[0]
                if _NAME_RE.fullmatch(base):
                    self.vs.forget(base)
        elif name in self.functions:  # its body may set any variable
            self.vs.scalars.clear()
            self.vs.arrays.clear()
        elif name == "trap" and any(a in ("DEBUG", "ERR", "RETURN") for a in words):
            self.vs.unknown = True  # code run before (or after) every command
        elif name == "printf" and "-v" in words[:-1]:
            self.vs.forget(words[words.index("-v") + 1].split("[", 1)[0])
        elif name == "set" and any(a in ("-a", "allexport") for a in words):
            self.allexport = True
        elif name == "shopt" and "expand_aliases" in words:
            self.block.problems.append(
                f"line {cmd.line}: turns aliases on (`shopt -s expand_aliases`), which change "
                "what a command word means; expected no aliases"
            )

    def unwrap(self, argv: list[Any], cmd: Command) -> int:
        """The index of the command a chain of wrappers (exec, env, timeout, ...; miles' own
        `ray job submit ... -- COMMAND`) runs."""
        i = 0
        if argv[:3] == ["ray", "job", "submit"] and "--" in argv:
            i = argv.index("--") + 1
        while i < len(argv) and argv[i] in WRAPPERS:
            options = WRAPPERS[argv[i]]
            wrapper = argv[i]
            i += 1
            while i < len(argv) and isinstance(argv[i], str) and argv[i].startswith("-"):
                if argv[i] == "--":
                    i += 1
                    break
                i += 2 if options.get(argv[i], False) else 1
            while wrapper == "env" and i < len(argv) and isinstance(argv[i], str):
                m = _ASSIGN_RE.match(argv[i])
                if m is None:
                    break
                self.block.environ.append((cmd.line, m.group(1), m.group(3)))
                i += 1
            if wrapper == "timeout" and i < len(argv):
                i += 1  # the duration
        return i

    @staticmethod
    def python_script(argv: list[Any], start: int) -> int | None:
        """Where the script (or the -m module) of a python command is, or None."""
        if start >= len(argv) or not isinstance(argv[start], str):
            return None
        if not _PYTHON_RE.fullmatch(argv[start]):
            return None
        i = start + 1
        while i < len(argv) and isinstance(argv[i], str) and argv[i].startswith("-"):
            if argv[i] == "-m":
                return i + 1 if i + 1 < len(argv) else None
            if argv[i] in ("-c", "-"):
                return None
            if argv[i] == "--":
                i += 1
                break
            i += 2 if argv[i] in _PY_WITH_VALUE else 1
        return i if i < len(argv) else None
