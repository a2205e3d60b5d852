"""launcher/plan/asset_spec.py: the recipe's assets as the node programs' spec, the tokenizer prose
parsed, and the spec accepted by scripts/asset_spec.py (one identity and store key per asset)."""

from __future__ import annotations

import json

import pytest
from support.cli import SEED
from support.node_scripts import load_script

from launcher.inputs.recipe import load_recipe
from launcher.plan.asset_spec import build_spec, converter_identity, dataset_repo, parse_tokenizer

asset_spec = load_script("asset_spec")
CKPT = ("Qwen/Qwen3-30B-A3B", "ad44e777bcd18fa416d9da3bd8f70d33ebb85d39")


def seed_spec(tmp_path, **kw):
    recipe = load_recipe(SEED)
    spec = build_spec(
        recipe,
        cache_dir="/cache",
        hf_ckpt="/cache/hf/q",
        sft_data="/cache/rows/r.parquet",
        torch_dist="/cache/td/q",
        converter=converter_identity(recipe, "qwen3-30B-A3B"),
        **kw,
    )
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return spec, asset_spec.load_spec(path)


def test_the_seeds_tokenizer_prose_becomes_files_hashes_and_sources():
    recipe = load_recipe(SEED)
    pin = parse_tokenizer(recipe.dataset.build.tokenizer or "", recipe.hf_model)
    assert pin.files == {
        "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
        "tokenizer_config.json": "d5d09f07b48c3086c508b30d1c9114bd1189145b74e982a265350c923acd8101",
    }
    assert pin.sources == [
        {"repo": "Qwen/Qwen3-32B", "revision": "9216db5781bf21249d130ec9da846c4624c16137"},
        {"repo": "Qwen/Qwen3-30B-A3B", "revision": CKPT[1]},
    ]
    assert pin.notes == ["Qwen3-32B: owner Qwen taken from the checkpoint's repo"]


def test_the_structured_twin_wins_over_prose():
    pin = parse_tokenizer(
        {
            "repo": "o/t",
            "revision": "1" * 40,
            "sha256": {"tokenizer.json": "A" * 64},
            "also": [{"repo": "o/m", "revision": "2" * 40}],
        },
        CKPT,
    )
    assert pin.files == {"tokenizer.json": "a" * 64}
    assert [s["repo"] for s in pin.sources] == ["o/t", "o/m"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("Qwen3-32B at its usual revision", "no 'FILE sha256 HEX'"),
        (f"Qwen3-32B; tokenizer.json sha256 {'a' * 64}", "no repo with a 40-hex revision"),
    ],
)
def test_prose_without_what_is_needed_is_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_tokenizer(text, CKPT)


def test_dataset_sources():
    assert dataset_repo("allenai/tulu-3-sft-mixture") == "allenai/tulu-3-sft-mixture"
    assert (
        dataset_repo("https://huggingface.co/datasets/allenai/tulu-3-sft-mixture")
        == "allenai/tulu-3-sft-mixture"
    )
    assert dataset_repo("Tulu 3, from the web") is None


def test_the_seed_spec_is_valid_and_its_keys_are_stable(tmp_path):
    spec, loaded = seed_spec(tmp_path, store="s3://bucket/p")
    by = asset_spec.assets_by_name(loaded)
    assert list(by) == ["tokenizer", "dataset", "rows", "hf_ckpt", "torch_dist"]
    assert (
        by["rows"]["build_problem"] is None
        and by["rows"]["seed"] == 42
        and by["rows"]["rows"] == 6400
    )
    assert asset_spec.store_key(by["hf_ckpt"]) == f"hf/models/Qwen--Qwen3-30B-A3B@{CKPT[1]}"
    assert (
        asset_spec.store_key(by["rows"])
        == "rows/7ea7f5dca51f6be280e2f7cd7ee786ac05f546570e5ac1b07236c920338241fe"
    )
    assert asset_spec.store_key(by["dataset"]).startswith(
        "hf/datasets/allenai--tulu-3-sft-mixture@b14afda6"
    )
    td = asset_spec.store_key(by["torch_dist"])
    assert td.startswith(f"torch_dist/Qwen--Qwen3-30B-A3B@{CKPT[1]}/")
    other = json.loads(json.dumps(by["torch_dist"]))
    other["identity"]["image"] = "sha256:" + "0" * 64  # another image converts to another key
    assert asset_spec.store_key(other) != td


def test_a_recipe_whose_rows_cannot_be_built_says_why(tmp_path):
    recipe = load_recipe(SEED)
    raw = json.loads(json.dumps(recipe.raw))
    raw["workload"]["dataset"]["build"]["tokenizer"] = "Qwen3-32B"
    del raw["workload"]["dataset"]["revision"]
    broken = type(recipe)(path=recipe.path, raw=raw, text=recipe.text)
    spec = build_spec(broken, cache_dir="/c", hf_ckpt="/c/h", sft_data="/c/r.parquet")
    rows = next(a for a in spec["assets"] if a["name"] == "rows")
    assert "workload.dataset.build.tokenizer: no 'FILE sha256 HEX'" in rows["build_problem"]
    assert "revision are needed" in rows["build_problem"]
    assert [a["name"] for a in spec["assets"]] == ["rows", "hf_ckpt"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda a: a.update(path="relative/path"), "absolute path"),
        (lambda a: a.update(kind="rows"), "expected hf-snapshot"),
        (lambda a: a.update(repo="no-owner"), "OWNER/NAME"),
    ],
)
def test_a_malformed_spec_is_refused(tmp_path, mutate, message):
    spec, _ = seed_spec(tmp_path)
    mutate(next(a for a in spec["assets"] if a["name"] == "hf_ckpt"))
    (tmp_path / "bad.json").write_text(json.dumps(spec))
    with pytest.raises(asset_spec.SpecError, match=message):
        asset_spec.load_spec(tmp_path / "bad.json")
