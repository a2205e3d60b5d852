"""`--num-epoch` instead of `--num-rollout`: the count miles derives, held to steps_per_run.

miles prints its arguments listing with `num_rollout None` and derives the count afterwards
(miles/ray/placement_group.py: num_rollout = len(dataset) // rollout_batch_size x num_epoch).
validate derives the same count from the recipe's rows and the run block, and the evidence gate
from the printed num_epoch and rollout_batch_size, so an honest --num-epoch run is judged like
any other, and a count that cannot be known before the run is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from support.cli import reproduce_here
from support.measure import as_recipe, run_standin, seed_raw

from launcher.inputs.runargs import printed_getter, rollouts_from_epochs, run_block_problems
from launcher.judge.evidence import logged_args_disagreements


def epoch_recipe(steps: int = 50, epochs: int = 1, extra: str = "") -> dict[str, Any]:
    raw = seed_raw()
    raw["run"] = raw["run"].replace("--num-rollout 20", f"--num-epoch {epochs}{extra}")
    raw["result"]["steps_per_run"] = steps
    return raw


def write(tmp_path: Path, raw: dict[str, Any], name: str = "epochs.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_an_epoch_count_that_gives_steps_per_run_validates_and_dry_runs(tmp_path):
    # the seed's 6,400 rows // 128 rows a rollout = 50 rollouts an epoch
    path = write(tmp_path, epoch_recipe(50))
    assert reproduce_here("validate", path).code == 0
    res = reproduce_here(path, "--dry-run")
    assert res.code == 0, res.err


def test_an_epoch_count_that_contradicts_steps_per_run_is_refused_with_the_derivation(tmp_path):
    res = reproduce_here("validate", write(tmp_path, epoch_recipe(20)))
    assert res.code == 2 and "Traceback" not in res.err
    assert "- result.steps_per_run: 20, but --num-epoch 1 x (6400 rows // " in res.err, res.err
    assert "= 50 rollouts" in res.err
    assert run_block_problems(epoch_recipe(100, epochs=2)) == []


def test_an_epoch_count_validate_cannot_derive_is_refused():
    for extra, why in (
        (" --rollout-max-prompt-len 4096", "drops rows at run time"),
        (" --disable-rollout-global-dataset", "miles refuses --num-epoch"),
        (" --data-source-path my.Source", "another data source"),
        ("", "known only at run time"),
    ):
        raw = epoch_recipe(50, extra=extra)
        if not extra:
            raw["run"] = 'E="$(cat epochs)"\n' + raw["run"].replace(
                "--num-epoch 1", '--num-epoch "$E"'
            )
        problems = run_block_problems(raw)
        assert any(f == "result.steps_per_run" and why in m for f, m in problems), problems
    raw = epoch_recipe(50)
    del raw["workload"]["dataset"]["build"]["rows"]
    (problem,) = [m for f, m in run_block_problems(raw) if f == "result.steps_per_run"]
    assert "no workload.dataset.build.rows" in problem


def test_the_printed_listing_gives_the_same_count():
    raw = epoch_recipe(50)
    logged = {"num_rollout": "None", "num_epoch": "1", "rollout_batch_size": "128"}
    assert rollouts_from_epochs(raw, printed_getter(logged))[0] == 50
    logged["rollout_max_prompt_len"] = "2048"
    assert rollouts_from_epochs(raw, printed_getter(logged))[0] is None


def test_an_honest_num_epoch_log_is_judged_on_its_speed_not_mismatch(tmp_path):
    raw = epoch_recipe(50)
    recipe = write(tmp_path, raw)
    log = tmp_path / "train.log"
    assert run_standin(log, None, raw=raw, prompt_rows=6400) == 0
    text = log.read_text()
    assert "num_rollout ....." in text and " None\n" in text.split("num_rollout", 1)[1][:80]
    res = reproduce_here("measure", log, "--recipe", recipe, "--json")
    verdict = json.loads(res.out)["verdict"]
    assert verdict["status"] != "mismatch", verdict["reasons"]
    assert not any("num_rollout" in r for r in verdict["reasons"]), verdict["reasons"]
    # and a listing whose epoch gives another count than the recipe's disagrees, saying why
    logged = {"num_rollout": "None", "num_epoch": "1", "rollout_batch_size": "128"}
    (found,) = logged_args_disagreements(as_recipe(epoch_recipe(25)), logged)
    assert found.what == "result.steps_per_run"
    assert "num_rollout = None (--num-epoch 1 x (6400 rows // " in found.detail


# -- the virtual pipeline set by layers per virtual stage (Megatron's other way) ----------------

DENSE = Path(__file__).parents[1] / "data" / "recipes" / "llama3.1-8b-h100-p5-dense.yaml"


def vpp_recipe(vpp_words: str, vpp: int = 2, layers: str = "--num-layers 64") -> dict[str, Any]:
    """The dense fixture on 64 layers, PP 4 and DP 2, its virtual pipeline set by VPP_WORDS."""
    raw = yaml.safe_load(DENSE.read_text())
    raw["layout"].update(pp=4, dp=2, vpp=vpp)
    raw["run"] = (
        raw["run"]
        .replace("--num-layers 32", layers)
        .replace(
            "--pipeline-model-parallel-size 1", f"--pipeline-model-parallel-size 4 {vpp_words}"
        )
    )
    return raw


def test_vpp_by_layers_per_virtual_stage_is_accepted_as_megatron_derives_it(tmp_path):
    path = write(tmp_path, vpp_recipe("--num-layers-per-virtual-pipeline-stage 8"))
    res = reproduce_here("validate", path)
    assert res.code == 0, res.err
    assert run_block_problems(vpp_recipe("--num-virtual-stages-per-pipeline-rank 2")) == []
    # the layout string: 8 stages of 8 layers on pp 4 is 2 virtual stages
    assert run_block_problems(vpp_recipe("--pipeline-model-parallel-layout '(t*8|)*7t*8'")) == []


def test_vpp_by_layers_that_gives_another_size_is_refused_with_the_arithmetic(tmp_path):
    path = write(tmp_path, vpp_recipe("--num-layers-per-virtual-pipeline-stage 16"))
    res = reproduce_here("validate", path)
    assert res.code == 2 and "Traceback" not in res.err
    assert "- layout.vpp: 2, but 64 layers // pp 4 // " in res.err
    assert "--num-layers-per-virtual-pipeline-stage 16 = 1 virtual stages" in res.err
    for words, layers, why in (
        ("--num-layers-per-virtual-pipeline-stage 8", '"${MODEL_ARGS[@]}"', "without --num-layers"),
        ("--num-layers-per-virtual-pipeline-stage 8", "--num-layers 60", "which Megatron refuses"),
        ("--pipeline-model-parallel-layout '(t|)*99999999'", "--num-layers 64", "unrolls past"),
    ):
        raw = vpp_recipe(words, layers=layers)
        if "MODEL_ARGS" in layers:
            raw["run"] = 'read -ra MODEL_ARGS <<< "$(cat args)"\n' + raw["run"]
        problems = run_block_problems(raw)
        assert any(f == "layout.vpp" and why in m for f, m in problems), (words, problems)


def test_an_honest_vpp_by_layers_log_agrees_with_the_recipe(tmp_path):
    """Megatron prints the virtual pipeline size it derived (2), which the gate holds to
    layout.vpp like any other (the stand-in derives it as Megatron's validate_args does)."""
    raw = vpp_recipe("--num-layers-per-virtual-pipeline-stage 8")
    log = tmp_path / "train.log"
    assert run_standin(log, 20, raw=raw) == 0
    assert "virtual_pipeline_model_parallel_size ...." in log.read_text()
    logged = {"virtual_pipeline_model_parallel_size": "2"}
    assert logged_args_disagreements(as_recipe(raw), logged) == []
    res = reproduce_here("measure", log, "--recipe", write(tmp_path, raw, "vpp.yaml"), "--json")
    verdict = json.loads(res.out)["verdict"]
    assert not any("virtual_pipeline" in r for r in verdict["reasons"]), verdict["reasons"]
