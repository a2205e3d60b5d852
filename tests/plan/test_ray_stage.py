"""Every run's Ray ends with it (launcher/plan/ray_stage.py): by the container's own PID namespace
when it has one, else by `ray stop --force` in the training script's EXIT trap. Walked over
every way a profile can take that namespace away, and the host runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.cli import SEED

from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.plan.plan import build_plan

STOP = "_cleanup() { ray stop --force >/dev/null 2>&1 || true; }"


def ray_stage_text(tmp_path: Path, profile: dict) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"kind": "local", **profile}))
    script = build_plan(load_recipe(SEED), load_profile(str(path)), run_id="ray-stage").node_script
    return script.split("# ---- stage ray:", 1)[1].split("# ---- stage train:", 1)[0]


@pytest.mark.parametrize(
    ("profile", "stops"),
    [
        ({}, False),  # docker's default: a PID namespace of its own
        ({"docker": {"extra_args": ["--init", "--label", "pid=host"]}}, False),
        ({"docker": {"extra_args": ["--pid", "host"]}}, True),
        ({"docker": {"extra_args": ["--pid=host"]}}, True),
        ({"docker": {"extra_args": ["--pid=container:other"]}}, True),
        ({"runtime": "host"}, True),
    ],
)
def test_ray_is_stopped_exactly_where_nothing_else_would_end_it(tmp_path, profile, stops):
    text = ray_stage_text(tmp_path, profile)
    assert (STOP in text) is stops, text
    assert "ray start --head" in text
