"""The model's identity as positive proof: the architecture Megatron's listing prints gives the
active and total parameter counts, held to the recipe's active_params and name
(launcher/judge/identity.py; docs/measurement.md, "The model's identity").

The adversary walks every model argument the count reads, each to values that make another model
(the verdict must become a mismatch naming the model) and to the seed's own value written another
way (it must stay reproduced), and runs miles' 5-layer CI slice of Qwen3-30B-A3B and a top-k 4
run through the stand-in and the CLI.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.measure import (
    REPO,
    SEED,
    as_recipe,
    run_standin,
    seed_arguments,
    seed_raw,
    step_times_for_tps,
)

from launcher.inputs.recipe import Sections
from launcher.judge.identity import counts, identity, name_figure
from launcher.judge.measure import measure
from launcher.judge.parse.miles import ParseStats, StepRecord
from launcher.judge.verdict import judge

CLAIM = 6913.23
STEP = step_times_for_tps(CLAIM)


def verdict_of(arguments: dict[str, str], raw: dict | None = None):
    raw = raw if raw is not None else seed_raw()
    recs = [StepRecord(step=s, loss=1.0 + 1.0 / (s + 2), step_time=STEP) for s in range(20)]
    stats = ParseStats(arguments=dict(arguments))
    result = measure(recs, as_recipe(raw), parse_stats=stats)
    return result, judge(result, as_recipe(raw))


def test_the_seeds_listing_gives_exactly_its_active_parameters():
    found = identity(Sections.of(seed_raw()), seed_arguments())
    assert found.problems == () and found.counts is not None
    assert found.counts.active == seed_raw()["result"]["active_params"]["count"] == 3_041_656_832
    assert 29e9 < found.counts.total < 31e9  # Qwen3-30B-A3B: "30B"
    result, verdict = verdict_of(seed_arguments())
    assert verdict.status == "reproduced", verdict.reasons
    assert any(c.startswith("the model: ") for c in result.evidence.checked)


# Each model argument the count reads, set to values that make another model. Every one of them
# is a mismatch naming the model (the layout's own checks do not see any of them).
ANOTHER_MODEL = {
    "num_layers": ["5", "24", "47", "49", "96"],
    "hidden_size": ["1024", "4096"],
    "ffn_hidden_size": ["1536"],  # unused by an all-MoE model: see SAME_MODEL
    "num_attention_heads": ["16", "64"],
    "num_query_groups": ["32"],
    "kv_channels": ["64", "256"],
    "vocab_size": ["32000", "262144"],
    "num_experts": ["64", "16", "512"],
    "moe_router_topk": ["4", "2", "1", "16"],
    "moe_ffn_hidden_size": ["384", "1536"],
    "moe_shared_expert_intermediate_size": ["4096"],
    "moe_layer_freq": ["2", "[0] * 48"],
    "swiglu": ["False"],
}
# The seed's model written another way, or arguments the count does not read: still the seed.
SAME_MODEL = {
    "ffn_hidden_size": ["6144", "1536"],  # every layer is MoE: the dense FFN size is never used
    "moe_layer_freq": ["1", "[1] * 48"],
    "norm_epsilon": ["1e-05"],
    "rotary_base": ["10000"],
    "moe_shared_expert_intermediate_size": ["None", "0"],
}


def _cases(table: dict[str, list[str]]) -> list[tuple[str, str]]:
    return [(name, value) for name, values in table.items() for value in values]


@pytest.mark.parametrize(("name", "value"), _cases(ANOTHER_MODEL))
def test_every_model_argument_set_to_another_model_is_a_mismatch(name, value):
    args = seed_arguments()
    if value.startswith("[") and "*" in value:
        item, times = value.strip("[").split("] * ")
        value = str([int(item)] * int(times))
    if (name, value) == ("ffn_hidden_size", "1536"):  # only a dense layer would read it
        args["moe_layer_freq"] = str([0] + [1] * 47)
    args[name] = value
    result, verdict = verdict_of(args)
    assert verdict.status == "mismatch", (name, value, verdict.reasons)
    assert verdict.difference_percent is None
    assert any(d.check == "model" for d in result.evidence.disagreements), verdict.reasons


@pytest.mark.parametrize(("name", "value"), _cases(SAME_MODEL))
def test_the_same_model_written_another_way_is_still_the_model(name, value):
    args = seed_arguments()
    if value.startswith("[") and "*" in value:
        item, times = value.strip("[").split("] * ")
        value = str([int(item)] * int(times))
    args[name] = value
    _, verdict = verdict_of(args)
    assert verdict.status == "reproduced", (name, value, verdict.reasons)


def test_a_recipe_counting_the_input_embedding_too_is_the_same_model():
    raw = seed_raw()
    found = identity(Sections.of(raw), seed_arguments()).counts
    assert found is not None
    raw["result"]["active_params"]["count"] = found.active_with_embedding
    assert verdict_of(seed_arguments(), raw)[1].status == "reproduced"
    raw["result"]["active_params"]["count"] = int(found.active * 1.02)
    assert verdict_of(seed_arguments(), raw)[1].status == "mismatch"


@pytest.mark.parametrize("missing", ["num_layers", "hidden_size", "vocab_size"])
def test_a_listing_without_the_models_size_fails_closed(missing):
    args = seed_arguments()
    del args[missing]
    result, verdict = verdict_of(args)
    assert verdict.status == "mismatch"
    assert any(missing in r and "identity is not proven" in r for r in verdict.reasons)


def test_a_model_family_the_count_does_not_cover_is_named_not_passed_as_checked():
    args = seed_arguments()
    args["multi_latent_attention"] = "True"
    result, verdict = verdict_of(args)
    assert any("the model: multi_latent_attention" in n for n in result.evidence.not_checked)
    assert not any(c.startswith("the model:") for c in result.evidence.checked)


def test_the_name_states_a_total_and_a_tied_model_counts_its_vocabulary_once():
    assert name_figure("Qwen3-30B-A3B") == 30e9
    assert name_figure("Qwen2.5-0.5B") == 0.5e9
    assert name_figure("Llama-3.1-8B-Instruct") == 8e9
    assert name_figure("DeepSeek-V3") is None
    found = identity(Sections.of(seed_raw()), seed_arguments())
    assert found.architecture is not None and found.counts is not None
    tied = counts(found.architecture, tied=True)
    assert found.counts.total - tied.total == 151936 * 2048


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "word"),
    [
        # miles' CI slice of Qwen3-30B-A3B (MODEL_ARGS_NUM_LAYERS=5), at its own faster pace
        ({"num_layers": 5}, "5 layers"),
        ({"moe_router_topk": 4}, "top-4"),
        ({"num_layers": 24}, "24 layers"),
    ],
)
def test_another_model_through_the_cli_is_a_mismatch_not_a_speed(tmp_path, args, word):
    log = tmp_path / "train.log"
    assert run_standin(log, 20, args=args, step_time_s=STEP / 7) == 0
    proc = cli("measure", log, "--recipe", SEED)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "verdict: MISMATCH" in proc.stdout and "verdict: FASTER" not in proc.stdout
    assert word in proc.stdout


def test_compare_of_two_logs_of_two_models_is_refused_as_two_recipes(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    assert run_standin(a, 20) == 0
    assert run_standin(b, 20, args={"moe_router_topk": 4}) == 0
    proc = cli("compare", a, b)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "moe_router_topk: 8 vs 4" in proc.stderr
