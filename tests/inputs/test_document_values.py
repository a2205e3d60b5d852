"""No recipe or profile holding what no field means validates, whatever field holds it
(launcher/inputs/yamlschema.py, `document_problems`).

The adversary walks every leaf of the seed recipe and of every shipped profile (env/*.yaml) and
puts one odd value there, in the file's own text, one leaf at a time (then one element deeper
into every list), rotating through ODD so that every kind lands on fields of every sort:

- YAML's `.nan`, `.inf`, `-.inf`: NaN compares false with everything, so a claim of `.nan`
  tokens/s was judged reproduced by any run;
- numbers past MAX_MAGNITUDE (`1e300`; `10**400`, which no float holds): a dry run raised
  OverflowError, or priced a claim to "$inf";
- text with a control character (ESC rewrote the cost question's line on a terminal; bash drops
  NUL) or, in a one-line field, a line break (a second line in the dry run's header comment).

And every mapping gets a key YAML does not read as text (`on`, `1`, `~`): `env: {on: "1"}` was
exported as `True=1`, and beside text keys made validation raise. Each file must be refused
(exit 2, no traceback) naming that field; a field added to a schema tomorrow is covered without a
new test.
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

# name -> (the value, what the refusal says)
ODD: dict[str, tuple[Any, str]] = {
    ".nan": (math.nan, "got .nan, not a finite number"),
    ".inf": (math.inf, "got .inf, not a finite number"),
    "-.inf": (-math.inf, "got -.inf, not a finite number"),
    "1e300": (1e300, "expected a number of magnitude at most"),
    "10**400": (10**400, "expected a number of magnitude at most"),
    "ESC": ("H200\x1b[2K  $0.42/h", "holds the control character '\\x1b'"),
    "NUL": ("a\x00b", "holds the control character '\\x00'"),
    "line break": ("one\ntwo", "holds a line break"),
}


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


def _block(path: tuple[Any, ...]) -> bool:
    """Whether the field may break lines (a text block of the recipe, an env value)."""
    return path[:1] in (("run",), ("notes",), ("env",)) or (
        len(path) == 3 and path[0] == "patches" and path[2] == "diff"
    )


def assert_every_leaf_refused(raw: dict, tmp_path: Path, command: list[str], what: str) -> int:
    checked = named = 0
    kinds = list(ODD)
    for n, path in enumerate(leaves(raw)):
        kind = kinds[n % len(kinds)]
        if kind == "line break" and _block(path):
            kind = "ESC"  # a text block may break lines; a control character it may not hold
        value, says = ODD[kind]
        f = tmp_path / f"{what}.yaml"
        f.write_text(yaml.safe_dump(with_value(raw, path, value), sort_keys=False))
        res = reproduce_here(*[a.replace("{}", str(f)) for a in command])
        where = field_path(path)
        assert res.code == 2, (where, kind, res.out, res.err)
        assert "Traceback" not in res.err
        # named for what it holds, or refused first for another reason that names the same
        # field (schema_version's own check comes before the schema)
        assert f"  - {where}: " in res.err, (where, kind, res.err)
        named += f"{where}: " in res.err and says in res.err
        checked += 1
    assert named >= checked - 1, (named, checked)
    return checked + assert_every_mapping_refuses_a_key_that_is_not_text(raw, tmp_path, command)


def mappings(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [path] + [p for k, v in node.items() for p in mappings(v, (*path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in mappings(v, (*path, i))]
    return []


def with_key(raw: Any, path: tuple[Any, ...], key: Any) -> Any:
    if not path:
        return {**raw, key: "1"}
    head, rest = path[0], path[1:]
    if isinstance(raw, list):
        out = list(raw)
        out[head] = with_key(out[head], rest, key)
        return out
    return {**raw, head: with_key(raw[head], rest, key)}


def assert_every_mapping_refuses_a_key_that_is_not_text(
    raw: dict, tmp_path: Path, command: list[str]
) -> int:
    keys = [True, 1, None]  # written `true`, `1`, `null`: what `on`, `1` and `~` read as
    found = mappings(raw)
    for n, path in enumerate(found):
        key = keys[n % len(keys)]
        f = tmp_path / "keys.yaml"
        f.write_text(yaml.safe_dump(with_key(raw, path, key), sort_keys=False))
        res = reproduce_here(*[a.replace("{}", str(f)) for a in command])
        where = field_path((*path, str(key)))
        assert res.code == 2 and "Traceback" not in res.err, (where, res.err)
        assert f"  - {where}: a key YAML reads as a" in res.err, (where, res.err)
    return len(found)


def test_every_field_of_the_seed_refuses_what_no_field_means(tmp_path):
    raw = yaml.safe_load(SEED.read_text())
    checked = assert_every_leaf_refused(raw, tmp_path, ["validate", "{}"], "recipe")
    assert checked > 100  # the walk reached the whole recipe, not a corner of it


@pytest.mark.parametrize("profile", sorted((REPO / "env").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_field_of_each_profile_refuses_what_no_field_means(tmp_path, profile):
    raw = yaml.safe_load(profile.read_text())
    command = [str(SEED), "--cluster", "{}", "--dry-run"]
    assert assert_every_leaf_refused(raw, tmp_path, command, "profile") >= 5


def test_the_walk_names_each_odd_number_once_and_finds_none_in_a_clean_document():
    raw = yaml.safe_load(SEED.read_text())
    assert non_finite_problems(raw) == []
    bad = with_value(with_value(raw, ("result", "mfu"), math.nan), ("env",), {"X": math.inf})
    assert [p for p, _ in non_finite_problems(bad)] == ["result.mfu", "env.X"]
