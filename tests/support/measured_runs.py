"""K measured runs on this host (result.runs: K): the Plan's own train-stage loop (the text node.sh
renders) run by the real Runner over `--cluster local` from the stand-in miles, each run's step
time set by REPRODUCE_MEASURED_RUN. Shared by the K-run tests of measurement and of verify."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import yaml

from launcher.clusters.local import LocalCluster
from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.plan.measured import train_lines
from launcher.plan.plan import Plan, build_plan
from launcher.plan.protocol import DONE_LINE, STAGE_FUNCTIONS
from launcher.records.rundir import RunDir
from launcher.runner.runner import Runner
from support.measure import seed_raw
from support.paths import TESTS

STANDIN = TESTS / "standin_miles"


def runs_recipe(tmp_path: Path, runs: int) -> Path:
    raw = seed_raw()
    raw["result"]["runs"] = runs
    path = tmp_path / "recipes" / "qwen3-30b-a3b" / "h200" / f"runs{runs}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def runs_node_script(plan: Plan, per_run_env: str) -> str:
    """node.sh's train stage as the Plan renders it (train_lines), run on this host from the
    stand-in miles; `per_run_env` (bash, may read REPRODUCE_MEASURED_RUN) sets each run's env."""
    k = plan.runs["measured"]
    run_block = per_run_env.rstrip("\n") + "\n" + plan.recipe.run_script.rstrip("\n")
    lines = train_lines("the recipe's run block", str(STANDIN), run_block, k)
    return "\n".join(
        [
            "#!/bin/bash",
            "{",
            "set -euo pipefail",
            f"NODE_RUN_DIR={plan.node_run_dir}",
            'export REPRODUCE_OUT_DIR="$NODE_RUN_DIR/out"',
            'cd "$NODE_RUN_DIR"',
            STAGE_FUNCTIONS,
            "_cleanup() { :; }",
            "trap _on_exit EXIT",
            "export STANDIN_NOISE_LINES=1 HF_CKPT=/hf TORCH_DIST=/torch-dist SFT_DATA=/rows",
            *lines,
            DONE_LINE,
            "exit",
            "}",
            "",
        ]
    )


def k_runs(
    tmp_path: Path, runs: int, per_run_env: str, accepted: int | None = None
) -> tuple[RunDir, Plan, Callable]:
    """A run directory for K measured runs, its Plan, and what executes it (the Runner)."""
    recipe_path = runs_recipe(tmp_path, runs)
    recipe = load_recipe(recipe_path)
    plan = build_plan(recipe, load_profile("local"), runs=accepted)
    rd = RunDir.create(tmp_path / "runs", recipe.slug, plan.run_id)
    plan = dataclasses.replace(plan, node_run_dir=str(tmp_path / "node" / plan.run_id))
    plan = dataclasses.replace(plan, node_script=runs_node_script(plan, per_run_env))
    rd.write_inputs(
        recipe_text=recipe.text,
        profile=Path(load_profile("local").path).read_text(),
        plan=plan.to_dict(),
        node_script=plan.node_script,
    )
    runner = Runner(scripts_dir=tmp_path / "scripts", poll_s=0.05)
    (tmp_path / "scripts").mkdir(exist_ok=True)
    return rd, plan, lambda: runner.execute(plan, rd, LocalCluster())


def times_env(times: list[float], fail_run: int | None = None) -> str:
    words = " ".join(str(t) for t in times)
    text = f'TIMES=(0 {words}); export STANDIN_STEP_TIME_S="${{TIMES[${{REPRODUCE_MEASURED_RUN:-1}}]}}"'
    if fail_run is not None:
        text += f'\nif [ "${{REPRODUCE_MEASURED_RUN:-1}}" = {fail_run} ]; then export STANDIN_FAIL_AT=8; fi'
    return text
