"""Shared helpers for the measurement tests: the seed recipe, the stand-in miles, line builders."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import os
import re
import shlex
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


def model_argv(raw: dict) -> list[str]:
    """The model's flags a run block reads from `model_args_utils.py MODEL` (the stand-in's
    table, as the real run block reads miles'), which recipe_argv leaves out (known only when
    the block runs); none when the block does not call it."""
    found = re.search(r"model_args_utils\.py\s+([A-Za-z0-9_.-]+)", raw.get("run") or "")
    if found is None:
        return []
    spec = importlib.util.spec_from_file_location(
        "standin_model_args", STANDIN / "miles/utils/external_utils/model_args_utils.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.MODELS[found[1]])


def standin_words(raw: dict, steps: int = 20) -> str:
    """The stand-in's command-line words for a run of `raw` (its model's flags and its run
    block's arguments), shell-quoted: what a test's hand-written train stage passes, so the
    listing it prints is an honest run's."""
    return shlex.join(model_argv(raw) + recipe_argv(raw, steps))


def seed_arguments() -> dict[str, str]:
    """The arguments listing of an honest run of the seed, as the parser reads it (name ->
    value as printed): what a unit test gives ParseStats.arguments for a run of the seed."""
    from launcher.judge.parse.miles import parse_lines
    from launcher.judge.parse.records import ParseStats

    if not _SEED_ARGUMENTS:
        out = io.StringIO()
        spec = importlib.util.spec_from_file_location("standin_train", STANDIN / "train.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with contextlib.redirect_stdout(out):
            module.print_arguments(model_argv(seed_raw()) + recipe_argv(seed_raw(), 20))
        stats = ParseStats()
        list(parse_lines(out.getvalue().splitlines(), stats))
        _SEED_ARGUMENTS.update(stats.arguments)
    return dict(_SEED_ARGUMENTS)


_SEED_ARGUMENTS: dict[str, str] = {}


def run_standin(
    log: Path, steps: int = 20, *, raw: dict | None = None, args: dict | None = None, **env: object
) -> int:
    """Run the stand-in train.py with a recipe's arguments (the seed's by default; `args`
    overrides some), its output captured into `log` the way the launcher does."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("STANDIN_")}
    full["STANDIN_START_EPOCH"] = str(START)
    full.update({f"STANDIN_{k.upper()}": str(v) for k, v in env.items()})
    log.parent.mkdir(parents=True, exist_ok=True)
    raw = raw if raw is not None else seed_raw()
    argv = model_argv(raw) + recipe_argv(raw, steps, **(args or {}))
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
