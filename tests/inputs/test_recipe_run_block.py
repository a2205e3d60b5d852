"""`validate`: the run block's arguments and exports against the fields that state the same fact.

The run block is read as bash reads it (launcher/inputs/runargs.py): continuation lines joined, quotes
removed, comments dropped, arrays it defines expanded; words only known when it runs are left
alone. Each contradiction is named with both values, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.cli import SEED, reproduce_here
from support.paths import TESTS

from launcher.inputs.bashread import read_script
from launcher.inputs.runargs import OPAQUE, OPAQUE_WORDS, options_of, read_run_block

DENSE = TESTS / "data" / "recipes" / "llama3.1-8b-h100-p5-dense.yaml"


def edited(tmp_path: Path, source: Path, old: str, new: str, field=None) -> Path:
    raw = yaml.safe_load(source.read_text())
    assert old in raw["run"], old
    raw["run"] = raw["run"].replace(old, new)
    if field is not None:
        node = raw
        for key in field[0][:-1]:
            node = node[key]
        node[field[0][-1]] = field[1]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


CASES = {
    "global batch": (SEED, "--global-batch-size 128", "--global-batch-size 64", None,
                     "workload.global_batch", "128", "--global-batch-size 64"),
    "gpus per node": (SEED, "--actor-num-gpus-per-node 8", "--actor-num-gpus-per-node 4", None,
                      "gpu.per_node", "8", "--actor-num-gpus-per-node 4"),
    "rollouts": (SEED, "--num-rollout 20", "--num-rollout 10", None,
                 "result.steps_per_run", "20", "--num-rollout 10"),
    "tp": (SEED, "--tensor-model-parallel-size 1", "--tensor-model-parallel-size 2", None,
           "layout.tp", "1", "--tensor-model-parallel-size 2"),
    "ep": (SEED, "--expert-model-parallel-size 8", "--expert-model-parallel-size 4", None,
           "layout.ep", "8", "--expert-model-parallel-size 4"),
    "max tokens": (SEED, "--max-tokens-per-gpu 16384", "--max-tokens-per-gpu 8192", None,
                   "layout.max_tokens_per_gpu", "16384", "--max-tokens-per-gpu 8192"),
    "nodes": (SEED, "--actor-num-nodes 1", "--actor-num-nodes 2", None,
              "gpu.count / gpu.per_node (nodes)", "1", "--actor-num-nodes 2"),
    # (the seed's run-time model arguments could hold --n-samples-per-prompt: checked where not)
    "rollout batch": (DENSE, '--rollout-batch-size "$GLOBAL_BATCH"', "--rollout-batch-size 64",
                      None, "workload.global_batch", "128", "= 64 rows"),
    "export vs env": (SEED, "expandable_segments:False\n\n", "expandable_segments:True\n\n", None,
                      "env.PYTORCH_CUDA_ALLOC_CONF", "'expandable_segments:False'",
                      "PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'"),
    "an array the block defines": (DENSE, "--tensor-model-parallel-size 1   #",
                                   "--tensor-model-parallel-size 2   #", None,
                                   "layout.tp", "1", "--tensor-model-parallel-size 2"),
    "a variable the block sets": (DENSE, "GLOBAL_BATCH=128", "GLOBAL_BATCH=96", None,
                                  "workload.global_batch", "128", "--global-batch-size 96"),
    "8.0 is not an integer to miles": (SEED, "--num-rollout 20", "--num-rollout 20.0", None,
                                       "result.steps_per_run", "'20.0'", "an integer"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_block_that_contradicts_a_field_is_refused_with_both_values(case, tmp_path):
    source, old, new, field, where, recipe_value, run_value = CASES[case]
    path = edited(tmp_path, source, old, new, field)
    res = reproduce_here("validate", path)
    assert res.code == 2 and "Traceback" not in res.err, res
    assert f"- {where}:" in res.err, res.err
    assert recipe_value in res.err and run_value in res.err, res.err


def test_the_seed_and_every_fixture_agree_with_their_run_blocks():
    fixtures = sorted((TESTS / "data" / "recipes").glob("*.yaml"))
    res = reproduce_here("validate", SEED, *fixtures)
    assert res.code == 0, res.err


def test_words_known_only_at_run_time_are_left_alone():
    block = read_run_block(
        'read -ra MODEL_ARGS <<< "$(cat args.txt)"\n'
        'GBS=$(python3 -c "print(128)")\n'
        'python3 train.py "${MODEL_ARGS[@]}" --global-batch-size "$GBS" \\\n'
        "  --num-rollout 20  # twenty\n"
    )
    ((_, argv),) = block.invocations
    assert argv[0] is OPAQUE_WORDS and argv[2] is OPAQUE
    opts = options_of(argv)
    assert opts.opaque and opts.values["--global-batch-size"] is OPAQUE
    assert opts.values["--num-rollout"] == "20"


def test_the_shell_reading_joins_continuations_keeps_quotes_and_drops_comments():
    found = read_script(
        "export A='x; y' # not a command\n"
        'B="two\nlines"; python3 train.py \\\n --lr 1e-5 | tee log\n'
        "ARR=(\n  --a 1  # the first\n  --b 2\n)\n"
    ).commands
    assert [[w.raw for w in c.words] for c in found] == [
        ["export", "A='x; y'"],
        ['B="two\nlines"'],
        ["python3", "train.py", "--lr", "1e-5"],
        ["tee", "log"],
        ["ARR=(\n  --a 1  # the first\n  --b 2\n)"],
    ]
    assert [c.line for c in found] == [1, 2, 3, 4, 5]
    assert [w.raw for w in found[-1].words[0].elements or ()] == ["--a", "1", "--b", "2"]


def test_a_rollout_no_samples_per_prompt_makes_one_global_batch_is_refused(tmp_path):
    """256 rows a rollout against a global batch of 128: no whole --n-samples-per-prompt makes
    that one batch, whatever the seed's run-time words hold; validate and the dry run, exit 2."""
    path = edited(tmp_path, SEED, "--rollout-batch-size 128", "--rollout-batch-size 256")
    for args in (("validate", path), (path, "--dry-run")):
        res = reproduce_here(*args)
        assert res.code == 2 and "Traceback" not in res.err, res
        assert "- workload.global_batch: 128, but the run block's rollouts hold " in res.err
        assert "--rollout-batch-size 256 x --n-samples-per-prompt 1 (absent: miles' default)" in (
            res.err
        )
        assert "no whole number of samples per prompt" in res.err
    # a rollout of 64 prompts needs its 2 samples each written in the block
    path = edited(tmp_path, SEED, "--rollout-batch-size 128", "--rollout-batch-size 64")
    assert "pass --n-samples-per-prompt 2" in reproduce_here("validate", path).err
    path = edited(
        tmp_path,
        SEED,
        "--rollout-batch-size 128",
        "--rollout-batch-size 64 --n-samples-per-prompt 2",
    )
    assert reproduce_here("validate", path).code == 0
