"""The miles arguments a recipe's fields also state, read from the `run` block or from a log.

Why: a recipe states its batch, its GPUs and its layout twice, once as fields (which measurement
uses) and once as the miles arguments of its `run` block (which training uses). When the two
disagree, every figure is computed for a run that did not happen. The same table serves two
checks, so they cannot drift apart:

- `validate` reads the `run` block as the shell would (continuation lines joined, quotes removed,
  arrays defined in the block expanded; anything only known at run time, such as
  `"${MODEL_ARGS[@]}"` filled by `read`, is left alone and makes absent arguments unknown) and
  compares each argument with its field;
- measuring compares the arguments miles printed at start-up (Megatron's `arguments` listing,
  docs/miles-log.md) with the same fields.

Each disagreement names the field, the argument and both values. docs/measurement.md lists the
checks and what is deliberately left out.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# A word whose value is only known when the script runs (a variable filled at run time) ...
OPAQUE = object()
# ... and words whose number too is only known then (`"${ARR[@]}"` of an array filled at run
# time, `$(...)`): they may hold any option.
OPAQUE_WORDS = object()


def _layout(raw: dict[str, Any], key: str, default: Any = None) -> Any:
    value = (raw.get("layout") or {}).get(key)
    return default if value is None else value


def _moe(raw: dict[str, Any]) -> bool:
    return int(_layout(raw, "ep", 1)) > 1


def _stated_null(raw: dict[str, Any], key: str) -> bool:
    """The layout writes `key: null`, which the schema defines as "not used" (not "not stated")."""
    layout = raw.get("layout") or {}
    return key in layout and layout[key] is None


def _recompute(raw: dict[str, Any], key: str) -> Any:
    block = (raw.get("layout") or {}).get("recompute")
    return block.get(key) if isinstance(block, dict) else None


@dataclass(frozen=True)
class Arg:
    """One miles argument that a recipe field also states."""

    option: str  # as the run block spells it
    dest: str  # as miles prints it in its arguments listing
    field: str  # the recipe field, for messages
    expected: Callable[[dict[str, Any]], Any]  # the field's value (None: not stated, not checked)
    kind: type = int
    # the value when the option is absent (None: unknown default, not checked), or a function of
    # the recipe (etp's default is tp)
    default: Any = None
    in_log: bool = True  # compared with the printed arguments too
    flag: bool = False  # a store_true switch
    # a null field that says the option is not used ("null without dynamic batching"), and how
    # to say so: the run block passing it then contradicts the field
    null_absent: Callable[[dict[str, Any]], bool] | None = None
    null_words: str = ""


def _nodes(raw: dict[str, Any]) -> int:
    gpu = raw["gpu"]
    return int(gpu["count"]) // int(gpu["per_node"])


ARGS: tuple[Arg, ...] = (
    Arg(
        "--global-batch-size",
        "global_batch_size",
        "workload.global_batch",
        lambda r: r["workload"]["global_batch"],
    ),
    Arg(
        "--actor-num-nodes",
        "actor_num_nodes",
        "gpu.count / gpu.per_node (nodes)",
        _nodes,
        default=1,
    ),
    Arg(
        "--actor-num-gpus-per-node",
        "actor_num_gpus_per_node",
        "gpu.per_node",
        lambda r: r["gpu"]["per_node"],
        default=8,
    ),
    # The rollout side's GPUs per node: miles prints its default (8) whatever the training uses,
    # so only a value the run block gives is compared.
    Arg(
        "--num-gpus-per-node",
        "num_gpus_per_node",
        "gpu.per_node",
        lambda r: r["gpu"]["per_node"],
        in_log=False,
    ),
    # One rollout is one optimizer step in a recipe's measurement (docs/measurement.md).
    Arg(
        "--num-rollout",
        "num_rollout",
        "result.steps_per_run",
        lambda r: r["result"]["steps_per_run"],
    ),
    Arg(
        "--tensor-model-parallel-size",
        "tensor_model_parallel_size",
        "layout.tp",
        lambda r: _layout(r, "tp", 1),
        default=1,
    ),
    Arg(
        "--pipeline-model-parallel-size",
        "pipeline_model_parallel_size",
        "layout.pp",
        lambda r: _layout(r, "pp", 1),
        default=1,
    ),
    Arg(
        "--context-parallel-size",
        "context_parallel_size",
        "layout.cp",
        lambda r: _layout(r, "cp", 1),
        default=1,
    ),
    Arg(
        "--expert-model-parallel-size",
        "expert_model_parallel_size",
        "layout.ep",
        lambda r: _layout(r, "ep", 1),
        default=1,
    ),
    # Without experts the expert tensor-parallel size does nothing (Megatron sets it to tp).
    Arg(
        "--expert-tensor-parallel-size",
        "expert_tensor_parallel_size",
        "layout.etp",
        lambda r: _layout(r, "etp") if _moe(r) else None,
        default=lambda r: _layout(r, "tp", 1),
    ),
    Arg(
        "--num-virtual-stages-per-pipeline-rank",
        "virtual_pipeline_model_parallel_size",
        "layout.vpp",
        lambda r: _layout(r, "vpp", 1),
        default=1,  # no virtual pipeline
    ),
    # Megatron turns sequence parallelism off where tp is 1: only compared where it applies.
    Arg(
        "--sequence-parallel",
        "sequence_parallel",
        "layout.sequence_parallel",
        lambda r: _layout(r, "sequence_parallel") if int(_layout(r, "tp", 1)) > 1 else None,
        kind=bool,
        default=False,
        flag=True,
    ),
    Arg(
        "--max-tokens-per-gpu",
        "max_tokens_per_gpu",
        "layout.max_tokens_per_gpu",
        lambda r: _layout(r, "max_tokens_per_gpu"),
        null_absent=lambda r: _stated_null(r, "max_tokens_per_gpu"),
        null_words="no dynamic batching",
    ),
    Arg(
        "--recompute-granularity",
        "recompute_granularity",
        "layout.recompute.granularity",
        lambda r: _recompute(r, "granularity"),
        kind=str,
        null_absent=lambda r: _stated_null(r, "recompute"),
        null_words="no recomputation",
    ),
    Arg(
        "--recompute-method",
        "recompute_method",
        "layout.recompute.method",
        lambda r: _recompute(r, "method"),
        kind=str,
        null_absent=lambda r: _stated_null(r, "recompute"),
        null_words="no recomputation",
    ),
    Arg(
        "--recompute-num-layers",
        "recompute_num_layers",
        "layout.recompute.num_layers",
        lambda r: _recompute(r, "num_layers"),
        null_absent=lambda r: _stated_null(r, "recompute"),
        null_words="no recomputation",
    ),
)
_BY_OPTION = {a.option: a for a in ARGS}
_FLAGS = {a.option for a in ARGS if a.flag}
# rollout batch x samples per prompt = rows per rollout, which must be one global batch.
ROLLOUT_BATCH, SAMPLES_PER_PROMPT = "--rollout-batch-size", "--n-samples-per-prompt"
TRAIN_SCRIPTS = ("train.py", "train_async.py")


# -------------------------------------------------------------------------------------------------
# Reading a bash script as words


@dataclass
class Command:
    line: int  # where it starts in the script (1-based)
    text: str


def commands(script: str) -> list[Command]:
    """The script's simple commands, split where bash splits them (newline, ;, &, |) outside
    quotes, `$(...)` and array parentheses; backslash-newlines joined, comments dropped."""
    out: list[Command] = []
    buf: list[str] = []
    line, start = 1, 1
    quote = ""  # "'", '"' or "`"
    depth = 0
    i, n = 0, len(script)

    def flush() -> None:
        text = "".join(buf).strip()
        if text:
            out.append(Command(start, text))
        buf.clear()

    while i < n:
        c = script[i]
        if c == "\\" and quote != "'" and i + 1 < n:
            if script[i + 1] == "\n":  # a continuation line
                i, line = i + 2, line + 1
                buf.append(" ")
                continue
            buf.append(script[i : i + 2])
            i += 2
            continue
        if c == "\n":
            line += 1
        if quote:
            if c == quote:
                quote = ""
            buf.append(c)
        elif c in "'\"`":
            quote = c
            buf.append(c)
        elif c == "#" and (not buf or buf[-1][-1:].isspace() or buf[-1] in ";&|("):
            while i < n and script[i] != "\n":
                i += 1
            continue
        elif c == "(" and (buf and (buf[-1].endswith("$") or buf[-1].endswith("="))):
            depth += 1
            buf.append(c)
        elif c == ")" and depth:
            depth -= 1
            buf.append(c)
        elif c in "\n;&|" and not depth:
            flush()
            start = line
        else:
            if not buf:
                start = line
            buf.append(c)
        i += 1
    flush()
    return out


# A command of the run block longer than this is not read for its arguments (it is one the training
# reads as a whole: no train invocation is this long), since shlex reads a long word in quadratic
# time (a 900 KB word made `validate` take 44 s).
MAX_COMMAND_CHARS = 32 * 1024
_ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_ARRAY_RE = re.compile(
    r"^(?:(?:export|local|readonly|declare(?:\s+-\w+)*)\s+)?([A-Za-z_][A-Za-z0-9_]*)=\((.*)\)$",
    re.S,
)
_EXPANSION_RE = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?\}?$")
_READ_RE = re.compile(r"\bread\s+(?:-\w+\s+)*([A-Za-z_][A-Za-z0-9_ ]*)")


def _dynamic(word: str) -> bool:
    return "$" in word or "`" in word


@dataclass
class RunBlock:
    """What the run block says: the train script's arguments and its exports."""

    invocations: list[tuple[int, list[Any]]] = field(default_factory=list)  # (line, argv words)
    exports: dict[str, tuple[int, Any]] = field(default_factory=dict)  # name -> (line, value)
    unparsed: list[tuple[int, str]] = field(default_factory=list)  # commands shlex could not read


def read_run_block(script: str) -> RunBlock:
    """The train script's argument words (OPAQUE where only the running shell knows them)."""
    block = RunBlock()
    scalars: dict[str, Any] = {}
    arrays: dict[str, list[Any]] = {}
    for cmd in commands(script):
        if len(cmd.text) > MAX_COMMAND_CHARS:  # shlex reads a long word in quadratic time
            block.unparsed.append((cmd.line, cmd.text[:200]))
            continue
        m = _ARRAY_RE.match(cmd.text)
        if m:
            try:
                words = shlex.split(m.group(2))
            except ValueError:
                block.unparsed.append((cmd.line, cmd.text))
                continue
            arrays[m.group(1)] = [_expand_one(w, scalars, arrays) for w in words]
            continue
        for name in _READ_RE.findall(cmd.text):  # `read -ra X`: filled at run time
            for var in name.split():
                arrays[var] = [OPAQUE_WORDS]
                scalars[var] = OPAQUE
        try:
            words = shlex.split(cmd.text)
        except ValueError:
            block.unparsed.append((cmd.line, cmd.text))
            continue
        keyword = (
            words[0] if words and words[0] in ("export", "declare", "local", "readonly") else ""
        )
        if keyword:
            words = [w for w in words[1:] if not w.startswith("-")]
        assigns = [_ASSIGN_RE.match(w) for w in words]
        if words and all(assigns):
            for a in assigns:
                assert a is not None
                value = OPAQUE if _dynamic(a.group(2)) else a.group(2)
                scalars[a.group(1)] = value
                arrays.pop(a.group(1), None)
                if keyword == "export":
                    block.exports[a.group(1)] = (cmd.line, value)
            continue
        while words and _ASSIGN_RE.match(words[0]):  # FOO=1 python3 train.py ...
            words = words[1:]
        for i, word in enumerate(words):
            if word.rsplit("/", 1)[-1] in TRAIN_SCRIPTS:
                block.invocations.append((cmd.line, _expand(words[i + 1 :], scalars, arrays)))
                break
    return block


def _expand(words: list[str], scalars: dict[str, Any], arrays: dict[str, list[Any]]) -> list[Any]:
    out: list[Any] = []
    for word in words:
        m = _EXPANSION_RE.match(word)
        if m and m.group(2) and m.group(1) in arrays:
            out.extend(arrays[m.group(1)])
        else:
            out.append(_expand_one(word, scalars, arrays))
    return out


def _expand_one(word: str, scalars: dict[str, Any], arrays: dict[str, list[Any]]) -> Any:
    """One word: itself, a known variable's value, OPAQUE (one unknown word) or OPAQUE_WORDS."""
    if not _dynamic(word):
        return word
    m = _EXPANSION_RE.match(word)
    if m and not m.group(2):
        return scalars.get(m.group(1), OPAQUE)
    return OPAQUE if m is None and "$(" not in word and "`" not in word else OPAQUE_WORDS


@dataclass
class Options:
    """The options of one train script invocation, as argparse would read them (the last wins)."""

    values: dict[str, Any]  # option -> its value word (OPAQUE when only known at run time)
    opaque: bool  # words only known at run time could hold further options


def options_of(argv: list[Any]) -> Options:
    values: dict[str, Any] = {}
    opaque = False
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word is OPAQUE or word is OPAQUE_WORDS:
            opaque = True  # a word of its own, not an option's value: it may be any option
            continue
        if not word.startswith("--"):
            continue
        name, eq, inline = word.partition("=")
        if eq:
            values[name] = inline
        elif name in _FLAGS:
            values[name] = True
        elif i < len(argv) and argv[i] is OPAQUE_WORDS:
            values[name], opaque = OPAQUE, True  # its value and maybe more options, unknown
            i += 1
        elif i < len(argv) and (argv[i] is OPAQUE or not str(argv[i]).startswith("--")):
            values[name] = argv[i]  # an option's value (known, or one word known at run time)
            i += 1
        else:
            values[name] = True
    return Options(values, opaque)


# -------------------------------------------------------------------------------------------------
# Comparing


def coerce(value: Any, kind: type) -> Any:
    """A printed or written value as the type miles parses it; ValueError when it cannot be."""
    if value is None or value is True and kind is bool:
        return value
    text = str(value).strip()
    if text == "None":
        return None
    if kind is bool:
        if text in ("True", "False"):
            return text == "True"
        raise ValueError(text)
    if kind is int:
        if not re.fullmatch(r"[-+]?\d+", text):
            raise ValueError(text)
        return int(text)
    return text


_KIND_WORDS = {int: "an integer", bool: "true or false", str: "text"}


def equal(expected: Any, got: Any, kind: type) -> bool:
    if kind is str:
        return str(expected) == str(got)
    return bool(expected == got) if kind is bool else expected == got


def syntax_problems(script: str) -> list[tuple[str, str]]:
    """What `bash -n` says of the run block: a syntax error found now, not in the training
    container after every paid stage (node.sh's own `bash -n` cannot see it: the block is in a
    heredoc there). None when this machine has no bash to ask."""
    import shutil
    import subprocess

    bash = shutil.which("bash")
    if bash is None:
        return []
    try:
        proc = subprocess.run(
            [bash, "-n"], input=script.encode(), capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode == 0:
        return []
    said = " ".join(proc.stderr.decode(errors="replace").replace("bash: ", "").split())[:300]
    return [("run", f"is not valid bash: {said}; expected a script bash can parse (`bash -n`)")]


def run_block_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Every run-block argument and export that contradicts a field: (field, message)."""
    problems = syntax_problems(raw["run"])
    if problems:
        return problems
    block = read_run_block(raw["run"])
    env = raw.get("env") or {}
    for name, (line, value) in sorted(block.exports.items()):
        if name in env and value is not OPAQUE and value != str(env[name]):
            problems.append(
                (
                    f"env.{name}",
                    f"{env[name]!r}, but the run block exports {name}={value!r} (line {line}); "
                    "expected the same value",
                )
            )
    problems += _layout_problems(raw)
    for line, argv in block.invocations:
        opts = options_of(argv)
        where = f"(run block line {line})"
        for arg in ARGS:
            problem = _arg_problem(arg, raw, opts, where)
            if problem:
                problems.append((arg.field, problem))
        problems += _rollout_problems(raw, opts, where)
    return problems


def _layout_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """A layout that states sequence parallelism where Megatron turns it off (tp 1)."""
    if _layout(raw, "sequence_parallel") is True and int(_layout(raw, "tp", 1)) == 1:
        return [
            (
                "layout.sequence_parallel",
                "true, but layout.tp is 1, where Megatron turns sequence parallelism off; "
                "expected false or null",
            )
        ]
    return []


def _arg_problem(arg: Arg, raw: dict[str, Any], opts: Options, where: str) -> str | None:
    """Why one option of one train invocation contradicts its field, or None. Symmetric for the
    layout: a field that states a value the run block does not pass is refused like a run block
    that passes a value the field does not state (a null that means "not used" included)."""
    expected = arg.expected(raw)
    given = opts.values.get(arg.option, None)
    if given is OPAQUE:
        return None  # only the running shell knows it
    if expected is None:
        if given is None or arg.null_absent is None or not arg.null_absent(raw):
            return None  # not stated
        shown = "" if given is True else f" {given}"
        return (
            f"null ({arg.null_words}), but the run block passes {arg.option}{shown} {where}; "
            "expected the option absent or the field stated"
        )
    layout = arg.field.startswith("layout.")
    if given is None:
        default = arg.default(raw) if callable(arg.default) else arg.default
        if not layout and (opts.opaque or default is None):
            return None  # absent, and the default is not known to hold
        hidden = (
            " (a layout field is compared with the run block's own words: words only known at "
            "run time are not read as the layout)"
            if opts.opaque
            else ""
        )
        if default is None:
            return (
                f"{expected!r}, but the run block does not pass {arg.option} {where}{hidden}; "
                "expected it passed with the same value"
            )
        given_value, how = default, f"does not pass {arg.option} (default {default})"
        where += hidden
    elif given is True and not arg.flag:
        return f"the run block passes {arg.option} without a value {where}"
    else:
        try:
            given_value = coerce(given, arg.kind)
        except ValueError:
            return (
                f"the run block passes {arg.option} {given!r} {where}, "
                f"which miles does not read as {_KIND_WORDS[arg.kind]}"
            )
        how = f"passes {arg.option} {given if given is not True else ''}".rstrip()
    if not equal(expected, given_value, arg.kind):
        return f"{expected!r}, but the run block {how} {where}; expected the same"
    return None


def _rollout_problems(raw: dict[str, Any], opts: Options, where: str) -> list[tuple[str, str]]:
    batch, samples = opts.values.get(ROLLOUT_BATCH), opts.values.get(SAMPLES_PER_PROMPT, "1")
    if batch is None or batch is OPAQUE or samples is OPAQUE:
        return []
    if samples == "1" and SAMPLES_PER_PROMPT not in opts.values and opts.opaque:
        return []  # the samples per prompt may hide in a run-time word
    try:
        rows = coerce(batch, int) * coerce(samples, int)
    except (ValueError, TypeError):
        return [
            (
                "workload.global_batch",
                f"the run block passes {ROLLOUT_BATCH} {batch!r} "
                f"{where}, which miles does not read as an integer",
            )
        ]
    global_batch = raw["workload"]["global_batch"]
    if rows != global_batch:
        return [
            (
                "workload.global_batch",
                f"{global_batch}, but the run block's rollouts hold {ROLLOUT_BATCH} {batch} x "
                f"{SAMPLES_PER_PROMPT} {samples} = {rows} rows {where}; a recipe's step is one "
                "rollout of one global batch, so expected the same",
            )
        ]
    return []


def checked_dests() -> list[str]:
    """The printed argument names compared with the recipe (for the verdict's "not checked")."""
    return [a.dest for a in ARGS if a.in_log] + ["rollout_batch_size"]
