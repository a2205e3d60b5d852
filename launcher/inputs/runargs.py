"""The miles arguments a recipe's fields also state, read from the `run` block or from a log.

Why: a recipe states its batch, its GPUs and its layout twice, once as fields (which measurement
uses) and once as the miles arguments of its `run` block (which training uses). When the two
disagree, every figure is computed for a run that did not happen. The same table serves two
checks, so they cannot drift apart:

- `validate` reads the `run` block as bash does (runblock.py: here-documents, quotes, comments,
  continuation lines, arrays and variables the block sets; anything only known at run time, such
  as `"${MODEL_ARGS[@]}"` filled by `read`, is left alone and makes absent arguments unknown;
  a train call it cannot be sure of refuses the block) and compares each argument with its
  field;
- measuring compares the arguments miles printed at start-up (Megatron's `arguments` listing,
  docs/miles-log.md) with the same fields.

Each disagreement names the field, the argument and both values. docs/measurement.md lists the
checks and what is deliberately left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.inputs.bashwords import OPAQUE, OPAQUE_WORDS
from launcher.inputs.derived import coerce, rollouts_from_epochs, vpp_from_layers
from launcher.inputs.envnames import MODEL_ENV_PREFIX, MODEL_ENV_READ, MODEL_ENV_WHY
from launcher.inputs.runblock import TRAIN_SCRIPTS, read_run_block


def _layout(raw: dict[str, Any], key: str, default: int | None = None) -> Any:
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
    # the value miles derives later when the option is absent (printed None), from other
    # arguments: (recipe, a getter of arguments by dest) -> (the value or None, how or why not)
    derived: Callable[[dict[str, Any], Callable[[str], Any]], tuple[Any, str]] | None = None


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
        derived=rollouts_from_epochs,
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
        derived=vpp_from_layers,
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


@dataclass
class TrainOptions:
    """The options of one train script invocation, as argparse would read them (the last wins)."""

    values: dict[str, Any]  # option -> its value word (OPAQUE when only known at run time)
    opaque: bool  # words only known at run time could hold further options


def options_of(argv: list[Any]) -> TrainOptions:
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
    return TrainOptions(values, opaque)


# -------------------------------------------------------------------------------------------------
# Comparing


_KIND_WORDS = {int: "an integer", bool: "true or false", str: "text"}


def equal(expected: object, got: object, kind: type) -> bool:
    if kind is str:
        return str(expected) == str(got)
    return bool(expected == got) if kind is bool else expected == got


# Linux's limit on one argument (MAX_ARG_STRLEN): the container's script, the run block in it,
# is one (launcher/plan/plan.py checks the whole script against the same figure).
MAX_RUN_BYTES = 128 * 1024


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
    size = len(raw["run"].encode())
    if size > MAX_RUN_BYTES:  # never read: it could not start, and reading it costs time
        return [
            (
                "run",
                f"is {size:,} bytes, over the {MAX_RUN_BYTES:,} bytes Linux passes as one "
                "argument: the training container's script carries the block whole in one "
                "(`docker run ... bash -c`), so it could not start; expected a smaller run block "
                "(keep large text in the image or a file)",
            )
        ]
    problems = syntax_problems(raw["run"])
    if problems:
        return problems
    block = read_run_block(raw["run"])
    if block.problems:
        return [("run", p) for p in block.problems]
    if not block.invocations:
        return [
            (
                "run",
                f"calls no train script ({' or '.join(TRAIN_SCRIPTS)}) that validate can see "
                "bash run; expected a `python3 train.py ...` command of its own, so the "
                "arguments that training uses are the ones checked",
            )
        ]
    env = raw.get("env") or {}
    named = [n for n in MODEL_ENV_READ if re.search(rf"\b{n}\b", raw["run"])]
    for name in named:  # also inside a $(...), a here-document, a string: anywhere
        line = raw["run"][: raw["run"].index(name)].count("\n") + 1
        problems.append(
            (
                "run",
                f"line {line} names {name}, {MODEL_ENV_WHY}; expected no such variable",
            )
        )
    for line, name, _value in block.environ:
        if name.startswith(MODEL_ENV_PREFIX) and name not in named:
            problems.append(
                (
                    "run",
                    f"line {line} puts {name} in a program's environment, {MODEL_ENV_WHY}; "
                    "expected no such variable",
                )
            )
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


def _arg_problem(arg: Arg, raw: dict[str, Any], opts: TrainOptions, where: str) -> str | None:
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
    derived = arg.derived(raw, lambda d: _option_value(opts, d)) if arg.derived else (None, "")
    if given is None and derived != (None, ""):
        value, how = derived
        if value is None:
            return (
                f"{expected!r}, but the run block does not pass {arg.option}, and {how} "
                f"{where}; expected {arg.option} passed, or a count validate can derive"
            )
        if value != expected:
            return f"{expected!r}, but {how} {where}; expected the same"
        return None
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


def _option_value(opts: TrainOptions, dest: str) -> Any:
    """An argument of the run block by miles' dest name (None: absent; OPAQUE: run time)."""
    if dest == "rollout_global_dataset":
        return False if "--disable-rollout-global-dataset" in opts.values else None
    return opts.values.get("--" + dest.replace("_", "-"))


def printed_getter(logged: Mapping[str, str]) -> Callable[[str], Any]:
    """An argument of miles' printed listing by dest name, as Python printed it (None: absent
    or printed None; True and False for switches)."""

    def get(dest: str) -> Any:
        text = logged.get(dest)
        if text is None or text.strip() == "None":
            return None
        return {"True": True, "False": False}.get(text.strip(), text.strip())

    return get


def _rollout_problems(raw: dict[str, Any], opts: TrainOptions, where: str) -> list[tuple[str, str]]:
    """A rollout's rows (rollout batch x samples per prompt) must be one global batch: a
    recipe's step is one rollout. Samples per prompt absent from the block's own words count as
    miles' default, 1, even beside words known only at run time: a rollout batch that no whole
    number of samples makes one global batch is refused whatever those words hold, and one that
    needs more than 1 must say so in the block."""
    batch, samples = opts.values.get(ROLLOUT_BATCH), opts.values.get(SAMPLES_PER_PROMPT, "1")
    if batch is None or batch is OPAQUE or samples is OPAQUE:
        return []
    try:
        rows = coerce(batch, int) * coerce(samples, int)
    except (ValueError, TypeError):
        return [
            (
                "workload.global_batch",
                f"the run block passes {ROLLOUT_BATCH} {batch!r} or {SAMPLES_PER_PROMPT} "
                f"{samples!r} {where}, which miles does not read as an integer",
            )
        ]
    global_batch = raw["workload"]["global_batch"]
    if rows == global_batch:
        return []
    shown = f"{ROLLOUT_BATCH} {batch} x {SAMPLES_PER_PROMPT} {samples}"
    if SAMPLES_PER_PROMPT not in opts.values:
        shown += " (absent: miles' default)"
    per_prompt = global_batch // int(batch) if int(batch) and global_batch % int(batch) == 0 else 0
    fix = (
        f"pass {SAMPLES_PER_PROMPT} {per_prompt} in the block's own words"
        if per_prompt and SAMPLES_PER_PROMPT not in opts.values
        else "no whole number of samples per prompt makes these rows one global batch"
        if not per_prompt
        else "expected the same"
    )
    return [
        (
            "workload.global_batch",
            f"{global_batch}, but the run block's rollouts hold {shown} = {rows} rows {where}; "
            f"a recipe's step is one rollout of one global batch: {fix}",
        )
    ]


def checked_dests() -> list[str]:
    """The printed argument names compared with the recipe (for the verdict's "not checked")."""
    return [a.dest for a in ARGS if a.in_log] + ["rollout_batch_size"]
