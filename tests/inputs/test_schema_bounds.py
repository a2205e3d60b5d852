"""A walk over every number field of the two schemas (schema/*.schema.yaml).

A profile describes a machine: every number in it has a range the machine takes (a port,
seconds, GB, $/h), and a value outside it failed only on the node, after acquisition (found
2026-12-04: `ray.port: -5`, `docker.stack_bytes: -1`, `root_volume_gb: 10**30` validated). So
every number field of the profile schema states both bounds. A recipe's numbers are measurements
and sizes: each states its lower bound (the upper one is yamlschema's MAX_MAGNITUDE for all).
A field added tomorrow without them fails here, naming it.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from support.paths import REPO

RECIPE_WITHOUT_MINIMUM = {
    "/properties/workload/properties/dataset/properties/build/properties/seed"
}


def numbers(node: Any, path: str = "") -> list[tuple[str, dict]]:
    found: list[tuple[str, dict]] = []
    if isinstance(node, dict):
        kinds = node.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if "integer" in kinds or "number" in kinds:
            found.append((path, node))
        for key, value in node.items():
            found += numbers(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += numbers(value, f"{path}[{i}]")
    return found


def bounded(node: dict, side: str) -> bool:
    return side in node or f"exclusive{side.capitalize()}" in node


def test_every_number_of_the_profile_schema_states_its_range():
    schema = yaml.safe_load((REPO / "schema" / "profile.schema.yaml").read_text())
    found = numbers(schema)
    assert len(found) > 15
    missing = [p for p, n in found if not (bounded(n, "minimum") and bounded(n, "maximum"))]
    assert missing == [], missing


def test_every_number_of_the_recipe_schema_states_its_lower_bound():
    schema = yaml.safe_load((REPO / "schema" / "recipe.schema.yaml").read_text())
    found = numbers(schema)
    assert len(found) > 15
    missing = [p for p, n in found if not bounded(n, "minimum")]
    assert sorted(missing) == sorted(RECIPE_WITHOUT_MINIMUM), missing


@pytest.mark.parametrize(
    "field, value",
    [
        ({"ray": {"port": -5}}, "ray.port"),
        ({"docker": {"stack_bytes": -1}}, "docker.stack_bytes"),
        ({"docker": {"shm_size": "-1"}}, "docker.shm_size"),
        ({"work_dir": "."}, "work_dir"),
        ({"cache_dir": "/var/tmp/a:b"}, "cache_dir"),
        ({"work_dir": "~/reproduce"}, "work_dir"),
    ],
)
def test_a_value_the_node_would_refuse_is_refused_here(tmp_path, field, value):
    from support.cli import SEED, reproduce_here

    raw = yaml.safe_load((REPO / "env" / "ssh.yaml").read_text())
    for key, v in field.items():
        raw[key] = {**raw.get(key, {}), **v} if isinstance(v, dict) else v
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    res = reproduce_here(str(SEED), "--cluster", str(path), "--dry-run")
    assert res.code == 2 and f"  - {value}: " in res.err, res.err
