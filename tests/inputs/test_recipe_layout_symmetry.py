"""Every field the run block also states is compared in both directions (launcher/inputs/runargs.py).

Before, a layout that declared sequence parallel while the run block did not pass it validated
(the seed's run-time model arguments were read as possibly holding any option), while the
opposite was refused; a `max_tokens_per_gpu: null` (no dynamic batching) beside a run block that
passes --max-tokens-per-gpu validated. Now, for every row of the table (runargs.ARGS): the field
saying one value and the run block another is refused, each way round; a layout field that
states a value the run block does not pass is refused; a null that means "not used" beside a run
block that uses it is refused. The tests are generated from the table: a row without a case here
fails the coverage test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.cli import SEED

from launcher.inputs.recipe import validate_raw
from launcher.inputs.runargs import ARGS
from launcher.inputs.yamlschema import read_yaml_mapping

TRAIN = "python3 train.py \\\n"


def seed(tp2: bool = False) -> dict[str, Any]:
    raw = read_yaml_mapping(SEED, "recipe")[0]  # dates stay text, as the launcher reads them
    if tp2:  # sequence parallelism applies only where tp > 1
        raw["layout"].update(tp=2, dp=4)
        raw["run"] = raw["run"].replace(
            "--tensor-model-parallel-size 1", "--tensor-model-parallel-size 2"
        )
    return raw


def set_field(raw: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def set_option(raw: dict[str, Any], option: str, value: Any) -> None:
    """The run block with `option` passed as `value` (True: a bare flag; None: not passed)."""
    lines = raw["run"].split("\n")
    kept = [ln for ln in lines if not ln.strip().startswith(option + " ") and ln.strip() not in
            (option, option + " \\")]  # fmt: skip
    text = "\n".join(kept)
    if value is not None:
        word = option if value is True else f"{option} {value}"
        assert TRAIN in text
        text = text.replace(TRAIN, f"{TRAIN}  {word} \\\n", 1)
    raw["run"] = text


# option -> (field path, the seed's value (field and run block agree), another value, tp2 setup,
#            the option's default when absent or None: a flag's "absent" is False)
ROWS: dict[str, tuple[tuple[str, ...], Any, Any, bool]] = {
    "--global-batch-size": (("workload", "global_batch"), 128, 64, False),
    "--actor-num-nodes": (("gpu", "count"), 1, 2, False),  # the field: count / per_node nodes
    "--actor-num-gpus-per-node": (("gpu", "per_node"), 8, 4, False),
    "--num-gpus-per-node": (("gpu", "per_node"), 8, 4, False),
    "--num-rollout": (("result", "steps_per_run"), 20, 30, False),
    "--tensor-model-parallel-size": (("layout", "tp"), 1, 2, False),
    "--pipeline-model-parallel-size": (("layout", "pp"), 1, 2, False),
    "--context-parallel-size": (("layout", "cp"), 1, 2, False),
    "--expert-model-parallel-size": (("layout", "ep"), 8, 4, False),
    "--expert-tensor-parallel-size": (("layout", "etp"), 1, 2, False),
    "--num-virtual-stages-per-pipeline-rank": (("layout", "vpp"), 2, 3, False),
    "--sequence-parallel": (("layout", "sequence_parallel"), True, False, True),
    "--max-tokens-per-gpu": (("layout", "max_tokens_per_gpu"), 16384, 8192, False),
    "--recompute-granularity": (("layout", "recompute", "granularity"), "full", "selective", False),
    "--recompute-method": (("layout", "recompute", "method"), "uniform", "block", False),
    "--recompute-num-layers": (("layout", "recompute", "num_layers"), 1, 2, False),
}


def field_value_for(option: str, value: Any) -> Any:
    return value * 8 if option == "--actor-num-nodes" else value  # nodes -> gpu.count


def run_word(value: Any) -> Any:
    if value is True:
        return True
    return None if value is False else value


def agreeing(option: str, value: Any) -> dict[str, Any]:
    path, _, _, tp2 = ROWS[option]
    raw = seed(tp2)
    set_field(raw, path, field_value_for(option, value))
    set_option(raw, option, run_word(value))
    return raw


def problems_of(raw: dict[str, Any], field: str, option: str) -> list[str]:
    return [m for f, m in validate_raw(raw) if f == field and option in m]


def field_of(option: str) -> str:
    return next(a.field for a in ARGS if a.option == option)


def test_every_row_of_the_table_has_its_cases():
    assert sorted(ROWS) == sorted(a.option for a in ARGS)


@pytest.mark.parametrize("option", sorted(ROWS))
def test_a_field_and_a_run_block_that_agree_validate(option):
    path, base, other, _ = ROWS[option]
    for value in (base, other):
        raw = agreeing(option, value)
        assert problems_of(raw, field_of(option), option) == [], (option, value)


@pytest.mark.parametrize("option", sorted(ROWS))
@pytest.mark.parametrize("direction", ["field says A, run block B", "field says B, run block A"])
def test_a_field_and_a_run_block_that_disagree_are_refused_both_ways(option, direction):
    path, a, b, _ = ROWS[option]
    field_value, run_value = (a, b) if direction.endswith("block B") else (b, a)
    raw = agreeing(option, field_value)
    set_option(raw, option, run_word(run_value))
    found = problems_of(raw, field_of(option), option)
    assert found, (option, direction, validate_raw(raw))
    assert repr(field_value_for(option, field_value) if option != "--actor-num-nodes"
                else field_value) in found[0]  # fmt: skip


LAYOUT_ROWS = sorted(o for o in ROWS if field_of(o).startswith("layout."))


@pytest.mark.parametrize("option", LAYOUT_ROWS)
def test_a_layout_field_the_run_block_does_not_pass_is_refused(option):
    """Also with the seed's run-time model arguments beside it: a layout field is compared with
    the run block's own words."""
    path, base, other, _ = ROWS[option]
    for value in (base, other):
        raw = agreeing(option, value)
        default = next(a.default for a in ARGS if a.option == option)
        default = default(raw) if callable(default) else default
        if value == default or (value is False and option == "--sequence-parallel"):
            continue  # absent is this value
        set_option(raw, option, None)
        found = problems_of(raw, field_of(option), option)
        assert found and "does not pass" in found[0], (option, value, validate_raw(raw))


NULL_MEANS_ABSENT = {
    "--max-tokens-per-gpu": (("layout", "max_tokens_per_gpu"), "no dynamic batching"),
    "--recompute-granularity": (("layout", "recompute"), "no recomputation"),
    "--recompute-method": (("layout", "recompute"), "no recomputation"),
    "--recompute-num-layers": (("layout", "recompute"), "no recomputation"),
}


@pytest.mark.parametrize("option", sorted(NULL_MEANS_ABSENT))
def test_a_null_that_means_not_used_beside_a_run_block_that_uses_it_is_refused(option):
    path, words = NULL_MEANS_ABSENT[option]
    raw = seed()
    for other in ("--recompute-granularity", "--recompute-method", "--recompute-num-layers"):
        if path[-1] == "recompute" and other != option:
            set_option(raw, other, None)
    set_field(raw, path, None)
    if path[-1] == "recompute":
        set_option(raw, option, ROWS[option][1])
    found = problems_of(raw, field_of(option), option)
    assert found and found[0].startswith(f"null ({words})"), validate_raw(raw)
    set_option(raw, option, None)
    assert problems_of(raw, field_of(option), option) == []


def test_sequence_parallel_declared_where_megatron_turns_it_off_is_refused():
    raw = seed()
    raw["layout"]["sequence_parallel"] = True  # tp 1
    found = [m for f, m in validate_raw(raw) if f == "layout.sequence_parallel"]
    assert found and "layout.tp is 1" in found[0]


def test_the_issue_case_declared_sequence_parallel_not_passed(tmp_path: Path):
    raw = seed(tp2=True)
    raw["layout"]["sequence_parallel"] = True
    found = [m for f, m in validate_raw(raw) if f == "layout.sequence_parallel"]
    assert found and "does not pass --sequence-parallel" in found[0] and "run time" in found[0]
