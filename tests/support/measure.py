"""Shared helpers for the measurement tests: the seed recipe, the stand-in miles, line builders."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import yaml

from launcher.inputs.recipe import Recipe
from support.paths import REPO, SEED

STANDIN = REPO / "tests/standin_miles"
START = 1792576800.0  # 2026-10-21 10:00:00 UTC


def seed_raw() -> dict:
    """The seed recipe as a plain mapping (a fresh copy each call, so tests may edit it)."""
    return copy.deepcopy(yaml.safe_load(SEED.read_text()))


def as_recipe(raw: dict) -> Recipe:
    """A Recipe of the seed's path holding `raw` as is (not validated: tests edit fields away)."""
    return Recipe(path=SEED, raw=raw, text="")


def seed_recipe() -> Recipe:
    return as_recipe(seed_raw())


def recipe_argv(raw: dict, steps: int | None = None, **override: object) -> list[str]:
    """The train script's arguments of a recipe's run block (those known before it runs), with
    --num-rollout set to `steps` and `override` ({"global_batch_size": 64}) replacing values."""
    from launcher.inputs.runargs import OPAQUE, options_of, read_run_block

    values: dict = {}
    for _, argv in read_run_block(raw["run"]).invocations:
        values.update(options_of(argv).values)
    if steps is not None:
        values["--num-rollout"] = str(steps)
    for key, value in override.items():
        values["--" + key.replace("_", "-")] = value
    out: list[str] = []
    for option, value in values.items():
        if value is OPAQUE or value is None:
            continue
        out += [option] if value is True else [option, str(value)]
    return out


def run_standin(
    log: Path, steps: int = 20, *, raw: dict | None = None, args: dict | None = None, **env: object
) -> int:
    """Run the stand-in train.py with a recipe's arguments (the seed's by default; `args`
    overrides some), its output captured into `log` the way the launcher does."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("STANDIN_")}
    full["STANDIN_START_EPOCH"] = str(START)
    full.update({f"STANDIN_{k.upper()}": str(v) for k, v in env.items()})
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = recipe_argv(raw if raw is not None else seed_raw(), steps, **(args or {}))
    with open(log, "wb") as fh:
        proc = subprocess.run(
            [sys.executable, "train.py", *argv],
            cwd=STANDIN,
            env=full,
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=60,
        )
    return proc.returncode


def step_times_for_tps(
    tps_per_gpu: float, gpus: int = 8, tokens_per_step: int = 128 * 8192
) -> float:
    """The constant step time that yields a given tokens/s per GPU."""
    return tokens_per_step / tps_per_gpu / gpus
