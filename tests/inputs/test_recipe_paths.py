"""No recipe text climbs out of the node's cache or the store (issue 19, medium).

`workload.dataset.revision: ../../..` validated (the '../' check covered active_params only) and
the dataset's store key then pointed outside the store root. The class check: walk the schema for
EVERY string field (no list of the fields someone thought of), give each a hostile value in turn,
and for each recipe that still validates compute every path and store key the launcher derives
from it (the plan's asset paths, the node programs' asset spec, `prepare`'s work spec, every
asset's store key): none may hold an empty, '.' or '..' segment, or leave its root.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cli import SEED

from launcher.errors import BadInput
from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe, recipe_schema
from launcher.plan.asset_spec import build_spec, converter_identity
from launcher.plan.nodelib import node_module
from launcher.plan.plan import _assets
from launcher.prepare.assets import PrepareOptions, work_spec

HOSTILE = [
    "../../..",
    "..",
    "a/../../../b",
    "https://huggingface.co/../../x",
    "https://huggingface.co/datasets/a/..",
    "owner/..",
]
CACHE = "/var/tmp/reproduce-cache"
WORK = Path("/var/tmp/reproduce-prepare-work")


def string_fields(schema: dict[str, Any], root: dict[str, Any], path: tuple = ()) -> Iterator:
    """Every field path of the schema whose value may be a string (objects' properties, their
    free-form additionalProperties as one sample key, arrays' items as element 0)."""
    node = schema
    if "$ref" in node:
        ref = node["$ref"].split("/")[-1]
        node = {**root["$defs"][ref], **{k: v for k, v in node.items() if k != "$ref"}}
    types = node.get("type")
    types = types if isinstance(types, list) else [types]
    if "string" in types or "enum" in node and any(isinstance(e, str) for e in node["enum"]):
        yield path
    for key, sub in (node.get("properties") or {}).items():
        yield from string_fields(sub, root, (*path, key))
    if isinstance(node.get("additionalProperties"), dict):
        yield from string_fields(node["additionalProperties"], root, (*path, "x_extra"))
    if isinstance(node.get("items"), dict):
        yield from string_fields(node["items"], root, (*path, 0))
    for alt in node.get("oneOf") or []:
        yield from string_fields(alt, root, path)


def put(raw: dict, path: tuple, value: str) -> None:
    node: Any = raw
    for key in path[:-1]:
        if isinstance(key, int):
            if not node:
                node.append({})
            node = node[key]
        else:
            nxt = path[path.index(key) + 1] if key in path else None
            node = node.setdefault(key, [] if isinstance(nxt, int) else {})
            if node is None:
                return
    last = path[-1]
    if isinstance(last, int):
        node[:1] = [value]
    else:
        node[last] = value


def derived(recipe) -> list[tuple[str, str, str]]:
    """(what, root, path-or-key) for everything the launcher derives from the recipe."""
    profile = load_profile("local")
    assets = _assets(recipe, profile, CACHE)
    out = [("plan", CACHE, p) for p in (assets.hf_ckpt, assets.torch_dist, assets.sft_data)]
    spec = build_spec(
        recipe,
        cache_dir=CACHE,
        hf_ckpt=assets.hf_ckpt,
        sft_data=assets.sft_data,
        torch_dist=assets.torch_dist,
        converter=converter_identity(recipe, "--model-args"),
        store="/srv/store",
    )
    prepared = work_spec(recipe, PrepareOptions(store="/srv/store", work_dir=WORK))
    key_of = node_module("asset_spec").store_key
    for name, s, root in (("spec", spec, CACHE), ("prepare", prepared, str(WORK.resolve()))):
        for a in s["assets"]:
            out.append((f"{name} {a['name']} path", root, a["path"]))
            out.append((f"{name} {a['name']} store key", "", key_of(a)))
    return out


def escapes(root: str, path: str) -> bool:
    rel = path[len(root) :] if root else "/" + path
    if root and not path.startswith(root + "/"):
        return True
    segments = rel.split("/")[1:]
    return any(s in ("", ".", "..") or "\n" in s for s in segments)


def cases() -> list[tuple[tuple, str]]:
    schema = recipe_schema()
    fields = sorted(set(string_fields(schema, schema)), key=str)
    assert ("workload", "dataset", "revision") in fields  # the walk reaches the finding's field
    return [(f, v) for f in fields for v in HOSTILE]


def test_the_seed_derives_only_paths_inside_their_roots():
    for what, root, path in derived(load_recipe(SEED)):
        assert not escapes(root, path), (what, path)


CASES = cases()


@pytest.mark.parametrize(
    "field, value", CASES, ids=[f"{'.'.join(map(str, f))}={v!r}" for f, v in CASES]
)
def test_no_string_field_makes_a_path_or_store_key_climb_out(tmp_path, field, value):
    raw = copy.deepcopy(yaml.safe_load(SEED.read_text()))
    if field[0] == "schema_version":
        return
    put(raw, field, value)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    try:
        recipe = load_recipe(path)
    except BadInput:
        return  # refused: fine, whatever the reason (the message names the field elsewhere)
    for what, root, derived_path in derived(recipe):
        assert not escapes(root, derived_path), (".".join(map(str, field)), what, derived_path)


@pytest.mark.parametrize("value", ["../../..", "main/../x", "..", "a/b"])
def test_the_dataset_revision_is_refused_naming_its_field(tmp_path, value):
    raw = yaml.safe_load(SEED.read_text())
    raw["workload"]["dataset"]["revision"] = value
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(BadInput, match=r"- workload\.dataset\.revision: "):
        load_recipe(path)
