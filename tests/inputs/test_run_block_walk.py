"""The run block as bash runs it: every run-argument check, written inside every bash construct.

The promise (launcher/inputs/runblock.py): what `validate` compares with the recipe's fields is
what bash passes to train.py, and a train call it cannot be sure of refuses the recipe. The walk
takes every row of runargs.ARGS that the seed states (and the rollout check), writes its option
with the seed's value (honest) and with another (a violation) inside each construct below, and
asserts: the violation is refused naming its field, the honest form passes, and, with bash
itself as the oracle (the script run by real bash with a `python3` on PATH that records its
argv), the value validate read is the value bash passed, the last one as argparse reads it.
"""

from __future__ import annotations

import copy
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cli import SEED, reproduce_here

from launcher.inputs import runargs
from launcher.inputs.runargs import ARGS, OPAQUE, options_of, read_run_block, run_block_problems

SEED_RAW = yaml.safe_load(SEED.read_text())
PRELUDE = (
    "export CUDA_DEVICE_MAX_CONNECTIONS=1\n"
    "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False\n"
    "# the model's arguments: don't edit (an apostrophe in a comment is no quote)\n"
    'MODEL_ARGS_LINE="$(python3 miles/utils/external_utils/model_args_utils.py qwen3-30B-A3B)"\n'
    'read -ra MODEL_ARGS <<< "$MODEL_ARGS_LINE"\n'
)


def seed_args() -> list[tuple[str, str]]:
    """The seed's train call as (option, value) pairs ("" for a switch), its own words."""
    ((_, argv),) = read_run_block(SEED_RAW["run"]).invocations
    pairs, i = [], 0
    while i < len(argv):
        word = argv[i]
        if isinstance(word, str) and word.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if isinstance(nxt, str) and not nxt.startswith("--"):
                pairs.append((word, nxt))
                i += 2
                continue
            if nxt is OPAQUE:
                pairs.append((word, {"--hf-checkpoint": '"$HF_CKPT"', "--ref-load": '"$TORCH_DIST"',
                                     "--prompt-data": '"$SFT_DATA"'}[word]))  # fmt: skip
                i += 2
                continue
            pairs.append((word, ""))
        i += 1
    return pairs


SEED_ARGS = seed_args()
SEED_VALUES = dict(SEED_ARGS)

# (option, the seed's value, another value) for every check the seed's fields state
CHECKS: list[tuple[str, str, str]] = [
    (a.option, SEED_VALUES[a.option], "4" if a.kind is int else "selective")
    for a in ARGS
    if a.option in SEED_VALUES and a.expected(SEED_RAW) is not None
] + [("--rollout-batch-size", "128", "256")]
FIELD = {a.option: a.field for a in ARGS} | {"--rollout-batch-size": "workload.global_batch"}


def call(rest: str, *, head: str = "python3 train.py") -> str:
    """The seed's train call with the option under test left out, REST in its place."""
    return head + " \\\n  " + " \\\n  ".join(
        [*(f"{o} {v}".rstrip() for o, v in SEED_ARGS if o != OPTION[0]), '"${MODEL_ARGS[@]}"', rest]
    ) + "\n"  # fmt: skip


OPTION = [""]  # the option under test, for `call`


def _q(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


# Each construct: (option, value) -> the whole run block.
CONSTRUCTS: dict[str, Callable[[str, str], str]] = {
    "plain": lambda o, v: PRELUDE + call(f"{o} {v}"),
    "option=value": lambda o, v: PRELUDE + call(f"{o}={v}"),
    "single quotes": lambda o, v: PRELUDE + call(f"{o} {_q(v)}"),
    "double quotes": lambda o, v: PRELUDE + call(f'"{o}" "{v}"'),
    "ANSI-C quotes": lambda o, v: PRELUDE + call(f"{o} $'{v}'"),
    "quotes joined in one word": lambda o, v: PRELUDE + call(f"{o} \"{v[:1]}\"'{v[1:]}'"),
    "a continuation between option and value": lambda o, v: PRELUDE + call(f"{o} \\\n    {v}"),
    "a here-document with an apostrophe before": lambda o, v: (
        PRELUDE + "cat > /dev/null <<EOF\nit's the $HOME of a note\nEOF\n" + call(f"{o} {v}")
    ),
    "a quoted here-document with quotes and $( before": lambda o, v: (
        PRELUDE + "cat > /dev/null <<'EOF'\ndon't \"$(stop)\" `here`\nEOF\n" + call(f"{o} {v}")
    ),
    "a <<- here-document with tabs and apostrophes": lambda o, v: (
        PRELUDE + 'cat > /dev/null <<-"END"\n\tit\'s\n\t"open\n\tEND\n' + call(f"{o} {v}")
    ),
    "two here-documents on one line": lambda o, v: (
        PRELUDE
        + "cat - /dev/fd/3 > /dev/null <<A 3<<'B'\nan ' apostrophe\nA\nanother \" quote\nB\n"
        + call(f"{o} {v}")
    ),
    "a here-document on the train call": lambda o, v: (
        PRELUDE
        + call(f"{o} {v} <<'EOF'").rstrip("\n")
        + "\nisn't an argument: it's its input\nEOF\n"
    ),
    "a comment with an apostrophe at the end of the call": lambda o, v: (
        PRELUDE + call(f"{o} {v}").rstrip("\n") + "  # it's the last\n"
    ),
    "a variable": lambda o, v: PRELUDE + f"VALUE={v}\n" + call(f'{o} "$VALUE"'),
    "an exported braced variable": lambda o, v: (
        PRELUDE + f"export VALUE='{v}'\n" + call(f"{o} ${{VALUE}}")
    ),
    "an array the block defines": lambda o, v: (
        PRELUDE + f"EXTRA=(\n  {o} {v}  # don't forget\n)\n" + call('"${EXTRA[@]}"')
    ),
    "a word-split variable": lambda o, v: PRELUDE + f'EXTRA="{o} {v}"\n' + call("$EXTRA"),
    "an if": lambda o, v: PRELUDE + "if true; then\n" + call(f"{o} {v}") + "fi\n",
    "a function it calls": lambda o, v: PRELUDE + "train() {\n" + call(f"{o} {v}") + "}\ntrain\n",
    "a subshell": lambda o, v: PRELUDE + "(\n  cd .\n" + call(f"{o} {v}") + ")\n",
    "a brace group and a pipe": lambda o, v: (
        PRELUDE + "{ " + call(f"{o} {v} 2>&1").rstrip("\n") + "; } | tee /dev/null\n"
    ),
    "after ; and &&": lambda o, v: PRELUDE + "cd . ; true && " + call(f"{o} {v}"),
    "exec env timeout": lambda o, v: (
        PRELUDE
        + call(f"{o} {v}", head="exec env -u X A=1 timeout -s INT 10h python3 -u ./train.py")
    ),
    "given twice, this one last": lambda o, v: PRELUDE + call(f"{o} {SEED_VALUES[o]} {o} {v}"),
    "miles' ray job submit": lambda o, v: (
        PRELUDE
        + call(
            f"{o} {v}", head='ray job submit --address="http://127.0.0.1:8265" -- python3 train.py'
        )
    ),
}


def recipe_with(run: str) -> dict[str, Any]:
    raw = copy.deepcopy(SEED_RAW)
    raw["run"] = run
    return raw


FAKE_PYTHON = """#!/bin/bash
case "$1" in
  *model_args_utils.py) echo "--num-layers 48 --hidden-size 2048" ;;
  *) printf '%s\\0' "$@" > "$ARGV_OUT" ;;
esac
"""


@pytest.fixture(scope="module")
def bash_env(tmp_path_factory) -> dict[str, str]:
    bindir = tmp_path_factory.mktemp("bin")
    fake = bindir / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    ray = bindir / "ray"  # `ray job submit ... -- COMMAND` runs COMMAND (the job's entrypoint)
    ray.write_text('#!/bin/bash\nwhile [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n')
    ray.chmod(0o755)
    return {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "HF_CKPT": "/ckpt",
        "TORCH_DIST": "/dist",
        "SFT_DATA": "/rows",
        "HOME": str(bindir),
    }


def bash_argv(run: str, env: dict[str, str], tmp: Path) -> list[str]:
    out = tmp / "argv"
    out.unlink(missing_ok=True)
    script = tmp / "run.sh"
    script.write_text(run)
    subprocess.run(["bash", str(script)], env={**env, "ARGV_OUT": str(out)}, cwd=tmp,
                   check=True, timeout=30, capture_output=True)  # fmt: skip
    return out.read_bytes().decode().split("\0")[:-1]


def last_value(argv: list[str], option: str) -> str | None:
    """The option's value as argparse reads it: the last one given."""
    found = None
    for k, word in enumerate(argv):
        if word == option and k + 1 < len(argv):
            found = argv[k + 1]
        elif word.startswith(option + "="):
            found = word.split("=", 1)[1]
    return found


@pytest.fixture
def no_bash_n(monkeypatch):
    """The walk reads thousands of blocks: `bash -n` (a process each) is left to the CLI test."""
    monkeypatch.setattr(runargs, "syntax_problems", lambda script: [])


@pytest.mark.parametrize("construct", sorted(CONSTRUCTS))
def test_every_check_inside_every_construct(construct, bash_env, tmp_path, no_bash_n):
    oracle = {CHECKS[k % len(CHECKS)][0] for k in (len(construct), len(construct) + 5)}
    for option, honest, wrong in CHECKS:
        OPTION[0] = option
        for value, refused in ((honest, False), (wrong, True)):
            run = CONSTRUCTS[construct](option, value)
            problems = run_block_problems(recipe_with(run))
            said = f"{construct}: {option} {value}: {problems}"
            if refused:
                assert any(f == FIELD[option] for f, _ in problems), said
            else:
                assert problems == [], said
            # bash as the oracle: what validate read is what bash passed
            ((_, argv),) = read_run_block(run).invocations
            read = options_of(argv).values.get(option)
            if refused and option in oracle:  # two checks per construct: a process each
                passed = last_value(bash_argv(run, bash_env, tmp_path), option)
                assert read == passed == value, f"{said}: validate read {read!r}, bash {passed!r}"
            else:
                assert read == value, said


HIDDEN = {
    "a here-document fed to bash": "bash <<'EOF'\n{call}EOF\n",
    "bash -c": 'bash -c "{call}"\n',
    "bash -c, the name joined across an expansion": 'E=\nbash -c "python3 tr${E}ain.py"\n',
    "a here-document to bash, the name joined across an expansion": (
        "bash <<EOF\npython3 tr$(true)ain.py --num-rollout 20\nEOF\n"
    ),
    "eval": "eval '{call}'\n",
    "eval of text only known at run time": 'CMD="$(cat cmd.txt)"\neval "$CMD"\n',
    "bash -c of text only known at run time": 'bash -c "$(cat cmd.txt)"\n',
    "a command substitution": 'OUT="$({call})"\n',
    "a command substitution in the call's own arguments": (
        'python3 train.py --num-rollout 20 --notes "$(python3 train.py --num-rollout 5)"\n'
    ),
    "python -c": 'python3 -c \'import subprocess; subprocess.run(["python3", "train.py"])\'\n',
    "a script written by a here-document": "cat > go.sh <<EOF\n{call}EOF\nbash go.sh\n",
    "a folded run: > block": 'read -ra MODEL_ARGS <<< "$MODEL_ARGS_LINE" {call}',
    "a script only known at run time": 'S=$(echo train.py)\npython3 "$S" --num-rollout 20\n',
    "a command only known at run time": "$(echo python3) train.py --num-rollout 20\n",
    "a function named like the interpreter": 'python3() { command python3 "$@"; }\n{call}',
    "a case statement": 'case "$X" in\n  *) {call};;\nesac\n',
    "aliases": "shopt -s expand_aliases\n{call}",
    "no train call at all": "bash scripts/run-qwen3-30B-A3B.sh\n",
}


@pytest.mark.parametrize("form", sorted(HIDDEN))
def test_a_train_call_validate_cannot_be_sure_of_is_refused(form):
    OPTION[0] = ""
    honest = call("").replace(" \\\n  \n", "\n").replace(" \\\n", " ").rstrip() + "\n"
    hidden = HIDDEN[form].replace("{call}", honest)
    if form != "no train call at all":  # an honest call beside it: the hidden one alone refuses
        problems = run_block_problems(recipe_with(PRELUDE + honest))
        assert problems == [], problems
        hidden += honest
    problems = run_block_problems(recipe_with(PRELUDE + hidden))
    assert problems and all(f == "run" for f, _ in problems), (form, problems)
    if form != "no train call at all":
        assert not any("calls no train script" in m for _, m in problems), (form, problems)


# Ways a block changes a variable after it set it, before the train call reads it: validate may
# never read the stale value (it reads the new one, or nothing it would compare).
REWRITES = {
    "a branch": "if true; then GBS=64; fi\n",
    "a function it calls": "set_gbs() { GBS=64; }\nGBS=128\nset_gbs\n",
    "an array element": "ARGS[1]=64\n",
    "arithmetic": "(( GBS = 64 ))\n",
    "an arithmetic expansion": ": $(( GBS = 64 ))\n",
    "let": "let GBS=64\n",
    "a default": "unset GBS\n: ${GBS:=64}\n",
    "printf -v": "printf -v GBS '%d' 64\n",
    "read": "read -r GBS <<< 64\n",
    "eval": "eval GBS=64\n",
    "declare -i": "declare -i GBS\nGBS=32*2\n",
    "a name reference": "declare -n REF=GBS\nREF=64\n",
    "a DEBUG trap": "trap 'GBS=64' DEBUG\n",
    "IFS": "IFS=x\nGBS=64\n",
}


@pytest.mark.parametrize("how", sorted(REWRITES))
def test_a_variable_changed_after_it_was_set_is_never_read_stale(how, bash_env, tmp_path):
    OPTION[0] = "--global-batch-size"
    run = (
        PRELUDE
        + "GBS=128\nARGS=(--global-batch-size 128)\n"
        + REWRITES[how]
        + call(
            '"${ARGS[@]}" --global-batch-size "$GBS"'
            if how != "an array element"
            else '"${ARGS[@]}"'
        )
    )
    passed = last_value(bash_argv(run, bash_env, tmp_path), "--global-batch-size")
    assert passed == "64", (how, passed)  # bash's word
    ((_, argv),) = read_run_block(run).invocations
    read = options_of(argv).values.get("--global-batch-size")
    assert read != "128", (how, argv)
    if isinstance(read, str):
        assert read == "64"
        assert any(f == "workload.global_batch" for f, _ in run_block_problems(recipe_with(run)))


def test_the_issue_cases_through_the_cli(tmp_path):
    """A here-document holding one apostrophe, and a folded `run: >` block: exit 2, the field named."""
    raw = yaml.safe_load(SEED.read_text())
    raw["run"] = "cat > notes.txt <<EOF\nthe seed's notes\nEOF\n" + raw["run"].replace(
        "--global-batch-size 128", "--global-batch-size 64"
    )
    path = tmp_path / "heredoc.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    res = reproduce_here("validate", path)
    assert res.code == 2 and "Traceback" not in res.err, res
    assert "- workload.global_batch: 128, but the run block passes --global-batch-size 64" in (
        res.err
    )
    res = reproduce_here(path, "--dry-run")
    assert res.code == 2 and "workload.global_batch" in res.err, res

    text = SEED.read_text()
    start = text.index("run: |")
    end = text.index("notes: |")
    lines = yaml.safe_load(text[start:end])["run"].replace("\\\n", "").splitlines()
    folded = "run: >\n" + "".join(f"  {line}\n" if line.strip() else "\n" for line in lines)
    path = tmp_path / "folded.yaml"
    path.write_text(text[:start] + folded + text[end:])
    assert "python3 train.py" in yaml.safe_load(path.read_text())["run"].splitlines()[1]
    res = reproduce_here("validate", path)
    assert res.code == 2 and "Traceback" not in res.err, res
    assert "- run: line 2: train.py appears as an argument of `read`" in res.err, res.err
    assert "write `run: |`" in res.err


def test_bash_is_here_for_the_oracle():
    assert subprocess.run(["bash", "-c", "true"], check=False).returncode == 0
    assert os.environ.get("PATH")


NOISE = [
    "cat > /dev/null <<EOF\nit's $HOME ) ( \" ` \nEOF\n",
    "cat > /dev/null <<'E O'\n' \" $( ) `\nE O\n",
    "cat > /dev/null <<-X\n\tdon't\n\t X\n\tX\n",
    "cat > /dev/null <<A; cat > /dev/null <<B\nA'\nA\nB\"\nB\n",
    '# it\'s a comment with "quotes" and $(\n',
    "NOTE=$(cat <<'EOF'\nit's (here\nEOF\n)\n",
    ": \"$(echo ')')\" `echo '('`\n",
    "EXTRA=(\n  --lr 1e-5  # don't\n  --min-lr 1e-6\n)\n",
    'helper() {\n  echo "it\'s" > /dev/null\n}\n',
    "if false; then\n  echo no\nfi\n",
    "for i in 1 2; do :; done\n",
    "{ :; } 2>/dev/null\n",
    "x=1; y=2 && true || false\n",
    "read -r LINE <<< 'a b' || true\n",
]
VALUE_STYLES = [
    lambda v: v,
    lambda v: f"'{v}'",
    lambda v: f'"{v}"',
    lambda v: f"$'{v}'",
    lambda v: f"\"{v[:1]}\"'{v[1:]}'",
    lambda v: f"{v[:1]}\\\n{v[1:]}",
    lambda v: '"$V"',
    lambda v: "${V}",
]
HEADS = [
    "python3 train.py",
    "exec python3 train.py",
    "env A=1 python3 -u train.py",
    "timeout 1h nohup python3 ./train.py",
]
TAILS = ["", " 2>&1 | tee /dev/null", " || true", "  # it's the end", " &\nwait"]


def test_generated_blocks_are_read_as_bash_runs_them(bash_env, tmp_path, no_bash_n):
    """Noise, quoting, wrappers and tails drawn at random (seeded, 60 blocks): validate's reading
    of --global-batch-size is bash's, and the honest block is never refused."""
    import random

    rng = random.Random(38)
    OPTION[0] = "--global-batch-size"
    for _ in range(60):
        value = rng.choice(["128", "64"])
        style = rng.choice(VALUE_STYLES)
        noise = "".join(rng.sample(NOISE, rng.randint(1, 4)))
        head, tail = rng.choice(HEADS), rng.choice(TAILS)
        setup = f"V={value}\n" if "V" in style("x") else ""
        text = call(f"--global-batch-size {style(value)}", head=head).rstrip("\n") + tail + "\n"
        run = PRELUDE + noise + setup + text
        ((_, argv),) = read_run_block(run).invocations
        read = options_of(argv).values.get("--global-batch-size")
        passed = last_value(bash_argv(run, bash_env, tmp_path), "--global-batch-size")
        assert read == passed == value, (run, read, passed)
        problems = run_block_problems(recipe_with(run))
        assert (problems == []) == (value == "128"), (run, problems)
