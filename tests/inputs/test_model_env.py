"""A recipe may not change its model's architecture through miles' MODEL_ARGS_* variables.

miles' model scripts read them from the environment (at miles 78527b91, scripts/models/*.py:
`int(os.environ.get("MODEL_ARGS_NUM_LAYERS") or 48)` for Qwen3-30B-A3B), so `env:
MODEL_ARGS_NUM_LAYERS: '24'` trained a 24-layer model under the recipe's name and passed
validate. Every way a variable reaches a program's environment is walked: the recipe's env, the
profile's env, and the run block's export, declare -x, a command's prefix, `env NAME=...` and
`set -a`; each is refused, exit 2, naming where.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.cli import SEED, reproduce_here

from launcher.inputs.runargs import run_block_problems

# The names miles' model scripts read at 78527b91 (git grep -o 'MODEL_ARGS_[A-Z_]*' there)
NAMES = ("MODEL_ARGS_NUM_LAYERS", "MODEL_ARGS_ROTARY_BASE", "MODEL_ARGS_FIRST_K_DENSE_REPLACE")
SEED_RAW = yaml.safe_load(SEED.read_text())

FORMS = {
    "export": lambda n: f"export {n}=24\n" + SEED_RAW["run"],
    "declare -x": lambda n: f"declare -x {n}=24\n" + SEED_RAW["run"],
    "export of a set name": lambda n: f"{n}=24\nexport {n}\n" + SEED_RAW["run"],
    "a prefix inside the model script's $(...)": lambda n: SEED_RAW["run"].replace(
        '"$(python3 miles/', f'"$({n}=24 python3 miles/'
    ),
    "a prefix of a command": lambda n: f"{n}=24 true\n" + SEED_RAW["run"],
    "env NAME=": lambda n: SEED_RAW["run"].replace(
        "python3 train.py", f"env {n}=24 python3 train.py"
    ),
    "set -a": lambda n: f"set -a\n{n}=24\n" + SEED_RAW["run"],
}


def raw_with(**changes) -> dict:
    raw = yaml.safe_load(SEED.read_text())
    raw.update(changes)
    return raw


@pytest.mark.parametrize("name", NAMES)
def test_a_model_variable_in_the_recipes_env_is_refused(tmp_path: Path, name: str):
    raw = raw_with(env={**SEED_RAW["env"], name: "24"})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    for args in (("validate", path), (path, "--dry-run")):
        res = reproduce_here(*args)
        assert res.code == 2 and "Traceback" not in res.err, res
        assert f"- env.{name}: sets {name}, which miles' model scripts read" in res.err, res.err


def test_a_model_variable_in_the_profiles_env_is_refused(tmp_path: Path):
    profile = yaml.safe_load((SEED.parents[3] / "env" / "local.yaml").read_text())
    profile["env"] = {"MODEL_ARGS_NUM_LAYERS": "24"}
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    res = reproduce_here(SEED, "--dry-run", "--cluster", path)
    assert res.code == 2 and "Traceback" not in res.err, res
    assert "env.MODEL_ARGS_NUM_LAYERS: sets MODEL_ARGS_NUM_LAYERS" in res.err, res.err


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("name", NAMES)
def test_a_model_variable_the_run_block_exports_is_refused(form: str, name: str):
    problems = run_block_problems(raw_with(run=FORMS[form](name)))
    assert any(f == "run" and f"names {name}, which miles" in m for f, m in problems), problems


def test_a_model_variable_the_reader_does_not_know_is_refused_where_it_is_exported():
    for run in (
        "export MODEL_ARGS_NEW=1\n",
        "MODEL_ARGS_NEW=1 python3 x.py\n",
        "set -a\nMODEL_ARGS_NEW=1\n",
    ):
        problems = run_block_problems(raw_with(run=run + SEED_RAW["run"]))
        assert any("puts MODEL_ARGS_NEW in a program's environment" in m for _, m in problems), run


def test_the_seeds_own_shell_variable_is_no_model_variable():
    """MODEL_ARGS_LINE is a shell variable of the seed's block, never exported."""
    assert run_block_problems(SEED_RAW) == []
