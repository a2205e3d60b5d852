"""Bad recipes: exit 2, one clear message naming the file and the field, no traceback, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.cli import FIXTURES, SEED, reproduce_here

from launcher.inputs.recipe import load_recipe, recipe_schema


def seed_data() -> dict:
    return yaml.safe_load(SEED.read_text())


def write(tmp_path: Path, data, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def mutate(path_keys: list, value=None, delete: bool = False):
    def apply(data: dict) -> dict:
        node = data
        for key in path_keys[:-1]:
            node = node[key]
        if delete:
            del node[path_keys[-1]]
        else:
            node[path_keys[-1]] = value
        return data

    return apply


SHORT_DIGEST_SOURCE = "The image is radixark/miles v0.1.0 (amd64 digest sha256:45ae7833) with EFA"

BAD = {
    "wrong type": (mutate(["gpu", "count"], "eight"), "gpu.count", "expected an integer"),
    "missing required": (
        mutate(["workload", "global_batch"], delete=True),
        "workload.global_batch",
        "missing required field",
    ),
    "short digest": (
        mutate(["stack", "source"], SHORT_DIGEST_SOURCE),
        "stack.source",
        "not a full digest",
    ),
    "no digest at all": (
        mutate(["stack", "source"], "versions read by hand"),
        "stack.image",
        "sha256",
    ),
    "schema_version 2": (mutate(["schema_version"], 2), "schema_version", "supports 1"),
    "unknown top-level field": (mutate(["resutl"], {"x": 1}), "resutl", "unknown field"),
    "unknown nested field": (mutate(["gpu", "cuont"], 8), "gpu.cuont", "unknown field"),
    "window outside steps": (
        mutate(["result", "window"], [5, 20]),
        "result.window",
        "expected last <= 19",
    ),
    "window reversed": (mutate(["result", "window"], [10, 5]), "result.window", "first <= last"),
    "negative figure": (
        mutate(["result", "tokens_per_s_per_gpu"], -6913.23),
        "result.tokens_per_s_per_gpu",
        "> 0",
    ),
    "window tokens inconsistent": (
        mutate(["result", "window_tokens"], 15728641),
        "result.window_tokens",
        "15728640",
    ),
    "layout does not fit": (mutate(["layout", "dp"], 4), "layout", "gpu.count is 8"),
    "count not a multiple of per_node": (
        mutate(["gpu", "count"], 12),
        "gpu.count",
        "multiple of per_node",
    ),
    "bad env name": (mutate(["env", "BAD-NAME"], "1"), "env.BAD-NAME", "not a shell variable name"),
    "env value not text": (
        mutate(["env", "NCCL_DEBUG"], ["WARN"]),
        "env.NCCL_DEBUG",
        "expected text",
    ),
    "run uses an unbound variable": (
        mutate(["run"], 'python3 train.py --load "$CKPT_DIR"\n'),
        "run",
        "$CKPT_DIR",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_recipe_exits_2_naming_the_field(case: str, tmp_path: Path) -> None:
    change, field, expected = BAD[case]
    path = write(tmp_path, change(seed_data()))
    for args in (("validate", path), (path, "--cluster", "aws", "--dry-run")):
        res = reproduce_here(*args)
        assert res.code == 2, (case, res)
        assert "Traceback" not in res.err and res.out == ""
        assert str(path) in res.err
        assert f"- {field}:" in res.err, res.err
        assert expected in res.err, res.err


@pytest.mark.parametrize(
    "text, expected",
    [
        ("gpu: [unclosed\n", "not valid YAML"),
        ("", "the file is empty"),
        ("- a\n- b\n", "the document is a list"),
        ("just text\n", "the document is a text"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
    ],
)
def test_unreadable_recipe_files(text, expected: str, tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    res = reproduce_here(path, "--cluster", "local", "--dry-run")
    assert res.code == 2 and "Traceback" not in res.err
    assert str(path) in res.err and expected in res.err


def test_missing_recipe_file(tmp_path: Path) -> None:
    res = reproduce_here(tmp_path / "nope.yaml", "--dry-run")
    assert res.code == 2 and "no such recipe file" in res.err and "Traceback" not in res.err


def test_a_bad_recipe_leaves_no_run_directory(tmp_path: Path) -> None:
    path = write(tmp_path, mutate(["schema_version"], 2)(seed_data()))
    runs = tmp_path / "runs"
    res = reproduce_here(path, "--cluster", "local", "--runs-dir", runs)
    assert res.code == 2
    assert not runs.exists() or not any(runs.rglob("*"))


def test_every_error_is_reported_at_once(tmp_path: Path) -> None:
    data = seed_data()
    data["gpu"]["count"] = "eight"
    data["typo"] = 1
    res = reproduce_here("validate", write(tmp_path, data))
    assert res.code == 2 and "2 problems" in res.err
    assert "- gpu.count:" in res.err and "- typo:" in res.err


def test_validate_accepts_the_seed_and_the_fixtures() -> None:
    paths = [SEED, *sorted(FIXTURES.glob("*.yaml"))]
    res = reproduce_here("validate", *paths)
    assert res.code == 0, res.err
    assert res.out.count("ok: ") == len(paths)


def test_image_from_the_seed_prose() -> None:
    recipe = load_recipe(SEED)
    assert recipe.image.repository == "radixark/miles"
    assert (
        recipe.image.digest
        == "sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca"
    )
    assert recipe.image.source_field == "stack.source"


def test_structured_image_wins_over_prose(tmp_path: Path) -> None:
    data = seed_data()
    data["stack"]["image"] = {
        "repository": "127.0.0.1:5000/miles",
        "tag": "test",
        "digest": "sha256:" + "ab" * 32,
    }
    recipe = load_recipe(write(tmp_path, data))
    assert recipe.image.ref == "127.0.0.1:5000/miles@sha256:" + "ab" * 32


def _paths(data, prefix=""):
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path
            yield from _paths(value, path)
    elif isinstance(data, list):
        for item in data:
            yield from _paths(item, prefix + "[]")


def _schema_node(schema: dict, path: str) -> dict | None:
    node = schema
    for part in path.split("."):
        items = part.endswith("[]")
        part = part.rstrip("[]")
        for branch in node.get("oneOf", []):  # e.g. recompute: null or a mapping
            if branch.get("type") == "object":
                node = branch
        props = node.get("properties") or {}
        if part in props:
            node = props[part]
        elif isinstance(node.get("additionalProperties"), dict):  # user-named keys (env)
            node = node["additionalProperties"]
        else:
            return None
        if "$ref" in node and "description" not in node:
            node = schema["$defs"][node["$ref"].split("/")[-1]]
        while items:
            node = node.get("items") or {}
            items = False
    return node


def test_schema_describes_every_field_of_the_seed() -> None:
    schema = recipe_schema()
    missing = [
        p for p in _paths(seed_data()) if not (_schema_node(schema, p) or {}).get("description")
    ]
    assert missing == []


def test_date_fields_stay_text() -> None:
    recipe = load_recipe(SEED)
    assert recipe.raw["result"]["measured"] == "2026-10-21"
