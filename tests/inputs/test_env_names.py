"""Which variables an `env` may set, for a recipe and a profile alike (launcher/inputs/envnames.py).

The adversary walks every name of the two lists: each of the launcher's own names in a profile's
env is refused on every kind (a profile's env reaches the container as a recipe's does: it had
exported HF_TOKEN and a PYTHONPATH over the launcher's); each name that changes how a program
starts, in either env, is refused on a Ray cluster (the job's env is node.sh's own: `BASH_ENV:
'$(...)'` ran the recipe's code before the image digest check, found 2026-12-04) and accepted
where the env reaches only the training container.
"""

from __future__ import annotations

import pytest
import yaml
from support.cli import SEED, reproduce_here
from support.paths import REPO

from launcher.inputs.envnames import LAUNCHER_ENV, STARTUP_ENV

STARTUP = sorted(STARTUP_ENV) + ["BASH_FUNC_echo%%"]


def recipe_with(tmp_path, env: dict) -> str:
    raw = yaml.safe_load(SEED.read_text())
    raw["env"] = {**raw["env"], **env}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def profile_with(tmp_path, kind: str, env: dict) -> str:
    raw = yaml.safe_load((REPO / "env" / f"{kind}.yaml").read_text())
    raw["env"] = env
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


@pytest.mark.parametrize("name", STARTUP)
def test_a_startup_variable_is_refused_on_ray_and_left_to_the_container_elsewhere(tmp_path, name):
    value = "$(echo forged >&2)"
    ray = reproduce_here(recipe_with(tmp_path, {name: value}), "--cluster", "ray", "--dry-run")
    if "%" in name:  # not a variable name at all: refused by the schema, on every kind
        assert ray.code == 2 and f"env.{name}" in ray.err
        return
    assert ray.code == 2 and "Traceback" not in ray.err, ray.err
    assert f"  - env.{name}: sets {name}, which changes how a program starts" in ray.err
    prof = reproduce_here(
        str(SEED), "--cluster", profile_with(tmp_path, "ray", {name: value}), "--dry-run"
    )
    assert prof.code == 2 and f"  - env.{name}: sets {name}" in prof.err, prof.err
    local = reproduce_here(recipe_with(tmp_path, {name: value}), "--cluster", "local", "--dry-run")
    assert local.code == 0, local.err


@pytest.mark.parametrize("kind", ["local", "ssh", "aws", "ray"])
def test_a_profile_env_may_not_set_the_launchers_own_names(tmp_path, kind):
    for name in sorted(LAUNCHER_ENV) + ["REPRODUCE_OUT_DIR", "AWS_SECRET_ACCESS_KEY"]:
        res = reproduce_here(
            str(SEED), "--cluster", profile_with(tmp_path, kind, {name: "x"}), "--dry-run"
        )
        assert res.code == 2 and "Traceback" not in res.err, (name, res.err)
        assert f"  - env.{name}: sets {name}" in res.err, (name, res.err)
