"""A bash script read into its simple commands, the way bash's own parser splits it.

Why: `validate` compares the train script's arguments with the recipe's fields, so it must read
the `run` block exactly as bash will run it. A reader that only knows quotes and continuation
lines goes wrong where bash does not: a here-document whose body holds one apostrophe made every
line after it look quoted, and the `python3 train.py` call behind it was never checked. This
module knows what bash's grammar gives a word, an operator, a comment, a here-document (`<<`,
`<<-`, quoted and unquoted delimiters, several on one line), a continuation line, an array
assignment, a redirection and a compound command, and keeps each piece's line.

It never runs anything. What it cannot follow (`case`, `coproc`, aliases, a structure it cannot
close) raises ReadError, naming the line; runargs.py then refuses the block instead of guessing.
Expansion of the words it found is in bashwords.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_META = frozenset(" \t\n;&|<>()")
_OPERATORS = (
    ";;&", ";;", ";&", "&&", "&>>", "&>", "||", "|&", "<<<", "<<-", "<<", "<&", "<>", ">>", ">&",
    ">|", ";", "&", "|", "<", ">", "(", ")",
)  # fmt: skip
_BY_FIRST = {c: [op for op in _OPERATORS if op[0] == c] for c in ";&|<>()"}
REDIRECTIONS = frozenset({"&>>", "&>", "<<<", "<<-", "<<", "<&", "<>", ">>", ">&", ">|", "<", ">"})
SEPARATORS = frozenset({";", "&", "\n", "&&", "||", "|", "|&", ";;", ";;&", ";&"})
_OPENERS = {"if": "fi", "while": "done", "until": "done", "for": "done", "select": "done"}
_CLOSERS = frozenset({"fi", "done", "esac", "}"})
_CONTINUERS = frozenset({"then", "else", "elif", "do", "!"})
UNSUPPORTED = {
    "case": "a `case` statement",
    "coproc": "a coprocess (`coproc`)",
    "alias": "an alias (it changes what a command word means)",
}


class ReadError(Exception):
    """The text is not bash this reader can split (bash -n would have said so first)."""


@dataclass(frozen=True)
class Word:
    """One word as written (quotes kept), its line, and for `NAME=( ... )` the array's words."""

    raw: str
    line: int
    elements: tuple[Word, ...] | None = None


@dataclass
class Command:
    """One simple command: its words (assignments first, redirections taken out), where it runs."""

    line: int
    words: list[Word] = field(default_factory=list)
    redirects: list[Word] = field(default_factory=list)  # redirection targets, here-strings
    heredocs: list[Word] = field(default_factory=list)  # here-document bodies
    # Inside a construct that may not run it, or runs it apart from the shell that goes on (a
    # branch, a loop, a subshell, a function, a pipeline, `&&`/`||`, `&`): an assignment there
    # may or may not reach the commands after it.
    conditional: bool = False
    kind: str = "simple"  # "simple", "for" (a loop's header), "test" ([[ ]] or (( )))


@dataclass
class Script:
    commands: list[Command]
    functions: list[tuple[int, str]]  # (line, name) of every function the script defines


@dataclass
class _Token:
    kind: str  # "word", "op", "eof"
    text: str
    line: int
    word: Word | None = None


@dataclass
class _Heredoc:
    delimiter: str
    strip_tabs: bool
    target: Command
    line: int


class _Lexer:
    def __init__(self, text: str):
        self.s, self.i, self.line = text, 0, 1
        self.pending: list[_Heredoc] = []

    def _skip_blanks(self) -> None:
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            if c in " \t":
                self.i += 1
            elif c == "\\" and s.startswith("\n", self.i + 1):
                self.i += 2
                self.line += 1
            elif c == "#":
                end = s.find("\n", self.i)
                self.i = n if end < 0 else end
            else:
                return

    def token(self) -> _Token:
        self._skip_blanks()
        s, line = self.s, self.line
        if self.i >= len(s):
            return _Token("eof", "", line)
        c = s[self.i]
        if c == "\n":
            self.i += 1
            self.line += 1
            self._heredoc_bodies()
            return _Token("op", "\n", line)
        if c in "<>" and s.startswith("(", self.i + 1):  # process substitution: a word
            return self._word(line)
        if c in _META:
            for op in _BY_FIRST[c]:
                if s.startswith(op, self.i):
                    self.i += len(op)
                    return _Token("op", op, line)
        return self._word(line)

    def _word(self, line: int) -> _Token:
        start, s, n = self.i, self.s, len(self.s)
        if s[self.i] in "<>":  # <( ... ) or >( ... )
            self.i += 1
            self.balanced("(", ")")
        while self.i < n:
            c = s[self.i]
            if c in _META:
                if c == "(" and s[start : self.i].endswith("=") and _is_name(s[start : self.i]):
                    return self._array(start, line)
                if c in "<>" and s.startswith("(", self.i + 1):
                    self.i += 1
                    self.balanced("(", ")")
                    continue
                break
            if c == "\\":
                if s.startswith("\n", self.i + 1):
                    self.line += 1
                self.i += 2
            elif c == "'":
                self._to("'", self.i + 1)
            elif c == '"':
                self._double()
            elif c == "`":
                self._backtick()
            elif c == "$" and self.i + 1 < n and s[self.i + 1] in "({'":
                nxt = s[self.i + 1]
                self.i += 1
                if nxt == "'":
                    self._ansi()
                else:
                    self.balanced(nxt, ")" if nxt == "(" else "}")
            else:
                self.i += 1
        raw = s[start : self.i]
        if raw.isdigit() and self.i < n and s[self.i] in "<>":
            return _Token("fd", raw, line)  # `2>&1`: the file descriptor of a redirection
        return _Token("word", raw, line, Word(raw, line))

    def _array(self, start: int, line: int) -> _Token:
        name = self.s[start : self.i]
        self.i += 1
        elements: list[Word] = []
        while True:
            tok = self.token()
            if tok.kind == "eof":
                raise ReadError(f"line {line}: the array {name}( is not closed")
            if tok.kind == "op" and tok.text == ")":
                break
            if tok.kind == "op" and tok.text == "\n":
                continue
            if tok.word is None:
                raise ReadError(f"line {tok.line}: {tok.text!r} inside the array {name}( )")
            elements.append(tok.word)
        raw = self.s[start : self.i]
        return _Token("word", raw, line, Word(raw, line, tuple(elements)))

    def _to(self, char: str, frm: int) -> None:
        end = self.s.find(char, frm)
        if end < 0:
            raise ReadError(f"line {self.line}: an unclosed {char}")
        self.line += self.s.count("\n", self.i, end)
        self.i = end + 1

    def _ansi(self) -> None:  # $'...': backslash escapes the quote
        s, n = self.s, len(self.s)
        self.i += 1
        while self.i < n and s[self.i] != "'":
            if s[self.i] == "\n":
                self.line += 1
            self.i += 2 if s[self.i] == "\\" else 1
        if self.i >= n:
            raise ReadError(f"line {self.line}: an unclosed $'")
        self.i += 1

    def _double(self) -> None:
        s, n = self.s, len(self.s)
        self.i += 1
        while self.i < n:
            c = s[self.i]
            if c == '"':
                self.i += 1
                return
            if c == "\\":
                self.i += 2
                continue
            if c == "\n":
                self.line += 1
            if c == "`":
                self._backtick()
            elif c == "$" and self.i + 1 < n and s[self.i + 1] in "({":
                nxt = s[self.i + 1]
                self.i += 1
                self.balanced(nxt, ")" if nxt == "(" else "}")
            else:
                self.i += 1
        raise ReadError(f"line {self.line}: an unclosed double quote")

    def _backtick(self) -> None:
        s, n = self.s, len(self.s)
        self.i += 1
        while self.i < n and s[self.i] != "`":
            if s[self.i] == "\n":
                self.line += 1
            self.i += 2 if s[self.i] == "\\" else 1
        if self.i >= n:
            raise ReadError(f"line {self.line}: an unclosed backquote")
        self.i += 1

    def balanced(self, opener: str, closer: str) -> None:
        """From an opener at self.i to its closer, quotes and nesting respected; inside `$(...)`
        also comments and here-documents, whose text may hold any quote or parenthesis."""
        s, n = self.s, len(self.s)
        depth = 0
        inner: list[tuple[str, bool]] = []  # here-documents named inside, read at the newline
        while self.i < n:
            c = s[self.i]
            if c == opener:
                depth += 1
            elif c == closer:
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return
            elif c == "\\":
                self.i += 1
            elif opener == "(" and c == "#" and (self.i == 0 or s[self.i - 1] in " \t\n;(|&"):
                end = s.find("\n", self.i)
                self.i = n if end < 0 else end
                continue
            elif opener == "(" and s.startswith("<<", self.i) and not s.startswith("<<<", self.i):
                self.i += 3 if s.startswith("<<-", self.i) else 2
                strip = s[self.i - 1] == "-"
                while self.i < n and s[self.i] in " \t":
                    self.i += 1
                start = self.i
                while self.i < n and s[self.i] not in " \t\n;&|<>()":
                    if s[self.i] in "'\"":
                        self._to(s[self.i], self.i + 1)
                    else:
                        self.i += 1
                inner.append((dequote_delimiter(s[start : self.i])[0], strip))
                continue
            elif c == "'" and opener == "(":
                self._to("'", self.i + 1)
                continue
            elif c == '"':
                self._double()
                continue
            elif c == "`":
                self._backtick()
                continue
            elif c == "\n":
                self.line += 1
                self.i += 1
                for delimiter, strip in inner:
                    self._skip_body(delimiter, strip)
                inner.clear()
                continue
            self.i += 1
        raise ReadError(f"line {self.line}: an unclosed {opener}")

    def _skip_body(self, delimiter: str, strip: bool) -> None:
        s = self.s
        while self.i < len(s):
            end = s.find("\n", self.i)
            end = len(s) if end < 0 else end
            text = s[self.i : end]
            self.i = min(end + 1, len(s))
            self.line += 1
            if (text.lstrip("\t") if strip else text) == delimiter:
                return

    def _heredoc_bodies(self) -> None:
        """Here-documents begin on the line after their operator, in the order they were named."""
        s = self.s
        for doc in self.pending:
            body: list[str] = []
            while self.i < len(s):
                end = s.find("\n", self.i)
                end = len(s) if end < 0 else end
                text = s[self.i : end]
                self.i = min(end + 1, len(s))
                self.line += 1
                if (text.lstrip("\t") if doc.strip_tabs else text) == doc.delimiter:
                    break
                body.append(text)
            doc.target.heredocs.append(Word("\n".join(body), doc.line))
        self.pending.clear()


def _is_name(text: str) -> bool:
    name = text[:-1].removesuffix("+")
    return bool(name) and (name[0].isalpha() or name[0] == "_") and name.replace("_", "a").isalnum()


def dequote_delimiter(raw: str) -> tuple[str, bool]:
    """A here-document's delimiter as bash compares it, and whether it was quoted."""
    quoted = any(c in raw for c in "'\"\\")
    out, i = [], 0
    while i < len(raw):
        c = raw[i]
        if c == "\\" and i + 1 < len(raw):
            out.append(raw[i + 1])
            i += 2
            continue
        if c not in "'\"":
            out.append(c)
        i += 1
    return "".join(out), quoted


def read_script(text: str) -> Script:
    """The script's simple commands in order (ReadError when it cannot be split)."""
    lexer = _Lexer(text)
    commands: list[Command] = []
    functions: list[tuple[int, str]] = []
    stack: list[str] = []  # open constructs: an expected closer, or "(" / "{" / "function"
    cmd = Command(1)
    link = ""  # the operator before the current command
    pending_function = False

    def finish(op: str) -> None:
        nonlocal cmd, link
        if cmd.words or cmd.redirects or cmd.heredocs:
            cmd.conditional = cmd.conditional or (
                any(s not in ("{",) for s in stack)
                or link in ("&&", "||", "|", "|&")
                or op in ("&&", "||", "|", "|&", "&")
            )
            commands.append(cmd)
        link = op if op != "\n" else ""
        cmd = Command(lexer.line)

    while True:
        tok = lexer.token()
        if tok.kind == "eof":
            finish("")
            break
        at_start = not cmd.words and not cmd.redirects
        if tok.kind == "fd":
            continue  # the redirection operator follows
        if tok.kind == "op" and tok.text in REDIRECTIONS:
            target = lexer.token()
            if target.word is None:
                raise ReadError(f"line {tok.line}: {tok.text} without a target")
            if tok.text in ("<<", "<<-"):
                delim, _quoted = dequote_delimiter(target.word.raw)
                lexer.pending.append(_Heredoc(delim, tok.text == "<<-", cmd, tok.line))
            else:
                cmd.redirects.append(target.word)
            continue
        if tok.kind == "op":
            if tok.text == "(" and cmd.kind == "for":
                raise ReadError(
                    f"line {tok.line}: an arithmetic `for ((...))`, which this reader does not "
                    "follow"
                )
            if tok.text == "(" and at_start and lexer.s.startswith("(", lexer.i):
                start = lexer.i - 1  # (( ... )): an arithmetic command, one test word
                lexer.i = start
                lexer.balanced("(", ")")
                cmd.kind = "test"
                cmd.words.append(Word(lexer.s[start : lexer.i], tok.line))
                continue
            if tok.text == "(" and at_start:
                stack.append("(")
                pending_function = False
                continue
            if tok.text == "(" and len(cmd.words) == 1:  # NAME () compound: a function
                closing = lexer.token()
                if closing.text != ")":
                    raise ReadError(f"line {tok.line}: `(` after {cmd.words[0].raw}")
                functions.append((tok.line, cmd.words[0].raw))
                cmd = Command(lexer.line)
                pending_function = True
                continue
            if tok.text == ")":
                finish(")")
                if not stack or stack[-1] != "(":
                    raise ReadError(f"line {tok.line}: a `)` this reader cannot match")
                stack.pop()
                continue
            if tok.text == "(":
                raise ReadError(f"line {tok.line}: a `(` this reader cannot follow")
            finish(tok.text)
            continue
        assert tok.word is not None
        word = tok.word
        if at_start and word.raw in UNSUPPORTED:
            raise ReadError(
                f"line {tok.line}: {UNSUPPORTED[word.raw]}, which this reader does not follow"
            )
        if at_start and word.raw == "function":
            name = lexer.token()
            functions.append((tok.line, name.text))
            pending_function = True
            nxt = lexer.token()
            if nxt.text == "(":
                if lexer.token().text != ")":
                    raise ReadError(f"line {tok.line}: function {name.text} (")
                continue
            tok, word, at_start = nxt, nxt.word or Word(nxt.text, nxt.line), True
        if at_start and word.raw == "{":
            stack.append("function" if pending_function else "{")
            pending_function = False
            continue
        if at_start and pending_function:
            raise ReadError(f"line {tok.line}: a function body this reader cannot follow")
        if at_start and word.raw in _OPENERS:
            stack.append(_OPENERS[word.raw])
            if word.raw in ("for", "select"):
                cmd.kind = "for"
                cmd.words.append(word)
            continue
        if at_start and word.raw in _CONTINUERS:
            continue
        if at_start and word.raw in _CLOSERS:
            want = "function" if word.raw == "}" and stack[-1:] == ["function"] else word.raw
            if want == "}" and stack[-1:] == ["{"]:
                want = "{"
            if not stack or stack[-1] != want:
                raise ReadError(f"line {tok.line}: a `{word.raw}` this reader cannot match")
            stack.pop()
            continue
        if at_start and word.raw in ("[[", "(("):
            cmd.kind = "test"
        if cmd.kind == "for" and word.raw == "do" and len(cmd.words) > 1:
            finish(";")
            continue
        if cmd.kind == "for" and word.raw == "in":
            continue
        cmd.words.append(word)
    if stack:
        raise ReadError(f"a `{stack[-1]}` construct is not closed")
    if lexer.pending:
        raise ReadError("a here-document is not closed")
    return Script(commands, functions)
