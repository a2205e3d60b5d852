"""No recipe or profile holding a number that is not finite validates, whatever field holds it.

The adversary walks every leaf of the seed recipe and of every shipped profile (env/*.yaml) and
puts YAML's `.nan`, `.inf` or `-.inf` there, in the file's own text, one leaf at a time; then
also one element deeper into every list. Each such file must be refused (exit 2) naming that
field, so a field added to a schema tomorrow is covered without a new test. Why it matters: NaN
compares false with everything, so a claim of `.nan` tokens/s was judged reproduced by any run
(launcher/inputs/yamlschema.py, `non_finite_problems`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cli import SEED, reproduce_here
from support.paths import REPO

from launcher.inputs.yamlschema import field_path, non_finite_problems

ODD = {".nan": math.nan, ".inf": math.inf, "-.inf": -math.inf}


def leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a scalar, and to every list (a value put into a list is a leaf there too)."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in leaves(v, (*path, k))]
    if isinstance(node, list):
        return [path + (len(node),)] + [
            p for i, v in enumerate(node) for p in leaves(v, (*path, i))
        ]
    return [path]


def with_value(raw: Any, path: tuple[Any, ...], value: float) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(raw, list):
        out = list(raw)
        if head == len(out):
            out.append(value)
        else:
            out[head] = with_value(out[head], rest, value)
        return out
    return {**raw, head: with_value(raw[head], rest, value)}


def assert_every_leaf_refused(raw: dict, tmp_path: Path, command: list[str], what: str) -> int:
    checked = finite = 0
    for n, path in enumerate(leaves(raw)):
        text = list(ODD)[n % 3]  # each leaf gets one of the three; over the walk, all three
        doc = yaml.safe_dump(with_value(raw, path, ODD[text]), sort_keys=False)
        assert text in doc  # PyYAML writes them as YAML's own literals
        f = tmp_path / f"{what}.yaml"
        f.write_text(doc)
        res = reproduce_here(*[a.replace("{}", str(f)) for a in command])
        where = field_path(path)
        assert res.code == 2, (where, text, res.out, res.err)
        assert "Traceback" not in res.err
        # named as not finite, or refused first for another reason that names the same field
        # (schema_version's own check comes before the schema)
        assert f"  - {where}: " in res.err, (where, res.err)
        finite += f"{where}: got {text}, not a finite number" in res.err
        checked += 1
    assert finite >= checked - 1, (finite, checked)
    return checked


def test_every_field_of_the_seed_refuses_nan_and_inf(tmp_path):
    raw = yaml.safe_load(SEED.read_text())
    checked = assert_every_leaf_refused(raw, tmp_path, ["validate", "{}"], "recipe")
    assert checked > 100  # the walk reached the whole recipe, not a corner of it


@pytest.mark.parametrize("profile", sorted((REPO / "env").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_field_of_each_profile_refuses_nan_and_inf(tmp_path, profile):
    raw = yaml.safe_load(profile.read_text())
    command = [str(SEED), "--cluster", "{}", "--dry-run"]
    assert assert_every_leaf_refused(raw, tmp_path, command, "profile") >= 5


def test_the_walk_names_each_odd_number_once_and_finds_none_in_a_clean_document():
    raw = yaml.safe_load(SEED.read_text())
    assert non_finite_problems(raw) == []
    bad = with_value(with_value(raw, ("result", "mfu"), math.nan), ("env",), {"X": math.inf})
    assert [p for p, _ in non_finite_problems(bad)] == ["result.mfu", "env.X"]
