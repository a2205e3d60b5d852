"""Input hardening of recipe and profile files: whatever the file, a quick, bounded, clear refusal.

- a YAML alias bomb (a few KB standing for billions of nodes) is refused before anything expands
  (anchors and aliases within the budget are read as if written out)
  it, the validation cache's key included;
- a FIFO, a device or a huge file is refused without reading it (a FIFO would hang the reader);
- schema patterns match the whole text: an env key "NCCL_DEBUG\\n" is not a variable name;
- an integer is an integer: `count: 8.0` is refused;
- text that names a cache directory on the node (the checkpoint revision, the rows' build name,
  the Hugging Face repository, the model when no repository is named) cannot climb out with `..`.
"""

from __future__ import annotations

import os
import threading
import tracemalloc
from pathlib import Path

import pytest
import yaml
from support.cli import SEED, reproduce, reproduce_here

from launcher.errors import BadInput
from launcher.inputs.recipe import TEXT_BLOCKS, load_recipe
from launcher.inputs.yamlbudget import MAX_EXPANDED_CHARS, MAX_EXPANDED_NODES
from launcher.inputs.yamlschema import MAX_FILE_BYTES


def seed() -> dict:
    return yaml.safe_load(SEED.read_text())


def write(tmp_path: Path, raw: dict | str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False))
    return path


def alias_bomb() -> str:
    """Nine levels of nine aliases each: 9 KB of text, 9**9 (387 million) leaves when expanded."""
    lines = ["schema_version: 1", "a0: &a0 [" + ", ".join(["x" * 90] * 9) + "]"]
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n" + "#" * (9000 - sum(map(len, lines))) + "\n"


def test_an_alias_bomb_is_refused_quickly_with_bounded_memory(tmp_path):
    path = write(tmp_path, alias_bomb())
    assert 8_000 < path.stat().st_size < 10_500
    tracemalloc.start()
    with pytest.raises(BadInput, match="anchors and aliases expand here to"):
        load_recipe(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 20 * 2**20  # never expanded (that is 387 million leaves), so quick too
    res = reproduce_here("validate", path)  # the CLI, cache and all
    assert res.code == 2 and "Traceback" not in res.err, res
    # the line of the first list whose expansion passes the budget (a4: 9**4 texts of 90, line 6)
    assert "line 6" in res.err and f"{MAX_EXPANDED_NODES:,} nodes" in res.err, res.err


@pytest.mark.parametrize(
    "text",
    [
        "schema_version: 1\nx: &x [a, *x]\n",  # an alias inside its own anchor
        "schema_version: 1\nx: &x {k: *x}\n",
    ],
)
def test_an_alias_that_contains_itself_is_refused(tmp_path, text):
    res = reproduce_here("validate", write(tmp_path, text))
    assert res.code == 2 and "Traceback" not in res.err, res
    assert "a value that contains itself" in res.err and "line 2" in res.err


def test_a_long_text_aliased_many_times_is_bounded_by_its_characters(tmp_path):
    text = "schema_version: 1\nt: &t " + "y" * 500_000 + "\nl: [" + ", ".join(["*t"] * 20) + "]\n"
    res = reproduce_here("validate", write(tmp_path, text))
    assert res.code == 2 and f"{MAX_EXPANDED_CHARS:,} characters" in res.err, res.err


def test_anchors_and_aliases_authors_use_are_read_as_written_out(tmp_path):
    """The seed with its gpu count, its env and a block written once and aliased (a merge key
    too): the same recipe as the seed (its slug included), every value its own object."""
    text = (
        SEED.read_text()
        .replace("  count: 8\n  per_node: 8\n", "  count: &n 8\n  per_node: *n\n")
        .replace("  tp: 1\n  pp: 1\n", "  <<: &one {tp: 1, pp: 1}\n")
    )
    assert "*n" in text and "<<: &one" in text
    res = reproduce_here("validate", write(tmp_path, text))
    assert res.code == 0, res.err
    aliased, seed = load_recipe(write(tmp_path, text, "aliased.yaml")), load_recipe(SEED)
    assert aliased.raw == seed.raw and aliased.slug == seed.slug
    shared = "defaults: &d {a: [1]}\none: *d\ntwo: *d\n"
    path = write(tmp_path, shared, "shared.yaml")
    from launcher.inputs.yamlschema import read_yaml_mapping

    data, _ = read_yaml_mapping(path, "recipe")
    data["one"]["a"].append(2)
    assert data["two"] == {"a": [1]} and data["defaults"] == {"a": [1]}


def test_a_fifo_is_refused_at_once_instead_of_hanging(tmp_path):
    fifo = tmp_path / "recipe.yaml"
    os.mkfifo(fifo)
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(_load(fifo)), daemon=True)
    worker.start()
    worker.join(5)
    assert done and isinstance(done[0], BadInput) and "not a regular file" in str(done[0])
    res = reproduce("validate", fifo, timeout=20)  # a fresh process: a hang is killed
    assert res.code == 2 and "not a regular file" in res.err


def _load(path: Path) -> object:
    try:
        return load_recipe(path)
    except BadInput as err:
        return err


def test_a_file_over_the_size_cap_is_refused_unread(tmp_path):
    path = tmp_path / "recipe.yaml"
    with open(path, "wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing to read, and nothing is read
    res = reproduce_here("validate", path)
    assert res.code == 2 and f"at most {MAX_FILE_BYTES} bytes" in res.err
    res = reproduce_here(SEED, "--cluster", path, "--dry-run")  # profiles are read the same way
    assert res.code == 2 and f"at most {MAX_FILE_BYTES} bytes" in res.err


def test_an_env_key_with_a_trailing_newline_is_not_a_variable_name(tmp_path):
    raw = seed()
    raw["env"]["NCCL_DEBUG\n"] = "WARN"
    res = reproduce_here("validate", write(tmp_path, raw))
    assert res.code == 2 and "not a shell variable name" in res.err


def test_a_digest_with_a_trailing_newline_is_refused(tmp_path):
    raw = seed()
    raw["stack"]["image"] = {"repository": "radixark/miles", "digest": "sha256:" + "a" * 64 + "\n"}
    res = reproduce_here("validate", write(tmp_path, raw))
    assert res.code == 2 and "- stack.image.digest:" in res.err


@pytest.mark.parametrize(
    "where, value",
    [(("gpu", "count"), 8.0), (("gpu", "per_node"), 8.0), (("result", "steps_per_run"), 20.0)],
)
def test_a_float_with_no_fraction_is_not_an_integer(tmp_path, where, value):
    raw = seed()
    raw[where[0]][where[1]] = value
    res = reproduce_here("validate", write(tmp_path, raw))
    assert res.code == 2 and f"- {'.'.join(where)}: expected an integer" in res.err, res.err


@pytest.mark.parametrize(
    "where, value, field",
    [
        (("result", "active_params", "revision"), "../../../etc", "result.active_params.revision"),
        (("result", "active_params", "revision"), "main/../x", "result.active_params.revision"),
        (("result", "active_params", "source"), "https://huggingface.co/../..", None),
        (("workload", "dataset", "build", "name"), "../rows", "workload.dataset.build.name"),
    ],
)
def test_names_that_reach_cache_paths_cannot_climb_out(tmp_path, where, value, field):
    raw = seed()
    node = raw
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    res = reproduce_here("validate", write(tmp_path, raw))
    assert res.code == 2 and "Traceback" not in res.err, res
    assert f"- {field or '.'.join(where)}:" in res.err, res.err


def test_the_model_names_the_cache_directory_when_no_repository_does(tmp_path):
    raw = seed()
    raw["result"]["active_params"]["source"] = "measured by hand"
    raw["model"] = "../../qwen"
    res = reproduce_here("validate", write(tmp_path, raw))
    assert res.code == 2 and "- model:" in res.err
    raw["model"] = "Qwen3-30B-A3B"
    assert reproduce_here("validate", write(tmp_path, raw)).code == 0


def test_a_commit_revision_and_a_tag_are_accepted(tmp_path):
    raw = seed()
    for revision in ("ad44e777bcd18fa416d9da3bd8f70d33ebb85d39", "v1.0", None):
        raw["result"]["active_params"]["revision"] = revision
        assert reproduce_here("validate", write(tmp_path, raw)).code == 0, revision


def test_a_pass_remembered_before_a_stricter_validator_is_not_reused(tmp_path, monkeypatch):
    """The validation cache is keyed on the validator's version: 8.0 once passed as an integer."""
    from launcher.inputs import yamlschema

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("REPRODUCE_NO_CACHE", raising=False)
    raw = seed()
    raw["gpu"]["count"] = 8.0
    old = yamlschema._VALIDATOR_VERSION
    monkeypatch.setattr(yamlschema, "_VALIDATOR_VERSION", old - 1)
    cache = yamlschema._cache_dir()
    assert cache is not None
    cache.mkdir(parents=True)
    from launcher.inputs.recipe import recipe_schema

    (cache / yamlschema._validity_key(raw, recipe_schema(), TEXT_BLOCKS)).touch()  # an older pass
    monkeypatch.setattr(yamlschema, "_VALIDATOR_VERSION", old)
    with pytest.raises(BadInput, match="expected an integer"):
        load_recipe(write(tmp_path, raw))


@pytest.mark.parametrize(
    "field, odd",
    [
        (("result", "measured"), "!!timestamp 2026-10-21"),  # a date, not the text of one
        (("gpu", "count"), "8.0"),  # a float, not the integer
        (("gpu", "count"), "'8'"),  # text, not the integer
    ],
)
def test_a_value_that_only_prints_like_a_valid_one_is_refused_after_a_valid_one_passed(
    tmp_path, monkeypatch, field, odd
):
    """The cache of passes is keyed on the document with its types (found 2026-12-04: keyed on
    json's `default=str`, a date passed once the seed with the same text had been validated)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("REPRODUCE_NO_CACHE", raising=False)
    load_recipe(SEED)  # the valid one, remembered
    parent, key = field
    text = SEED.read_text()
    value = seed()[parent][key]
    shown = str(value) if not isinstance(value, str) else value
    line = f"  {key}: {shown}\n"
    assert line in text, line
    odd_file = tmp_path / "odd.yaml"
    odd_file.write_text(text.replace(line, f"  {key}: {odd}\n", 1))
    with pytest.raises(BadInput, match=f"{parent}.{key}"):
        load_recipe(odd_file)


# --- a recipe's env may not set what the launcher uses to check or control the run (issue 19) ---

RESERVED = [
    "REPRODUCE_IMAGE_DIGEST",  # the Ray nodes' word on their image
    "REPRODUCE_OUT_DIR",
    "REPRODUCE_ROW_TOKENS",  # what the rollout checks the rows against
    "REPRODUCE_ANYTHING_NEW",  # the whole prefix, not a list of today's names
    "SFT_DATA",
    "HF_CKPT",
    "NODE_RUN_DIR",
    "RAY_ADDRESS",
    "RAY_DEDUP_LOGS",
    "CUDA_VISIBLE_DEVICES",
    "HF_ENDPOINT",
    "AWS_ENDPOINT_URL",
]


@pytest.mark.parametrize("name", RESERVED)
def test_a_recipe_env_that_sets_a_launcher_variable_is_refused(tmp_path, name):
    raw = seed()
    raw["env"][name] = "sha256:" + "4" * 64
    path = write(tmp_path, raw)
    with pytest.raises(BadInput, match=rf"env\.{name}: sets {name}, ") as info:
        load_recipe(path)
    assert str(path) in str(info.value) and "removed from env" in str(info.value)


@pytest.mark.parametrize(
    "profile", sorted(p.name for p in (SEED.parents[3] / "env").glob("*.yaml"))
)
def test_every_target_refuses_it_with_exit_2_naming_the_field(tmp_path, profile):
    raw = seed()
    raw["env"]["REPRODUCE_IMAGE_DIGEST"] = raw["stack"].get("image", {}).get("digest", "x")
    path = write(tmp_path, raw)
    res = reproduce_here(path, "--cluster", SEED.parents[3] / "env" / profile, "--dry-run")
    assert res.code == 2, res.err
    assert "env.REPRODUCE_IMAGE_DIGEST" in res.err and "Traceback" not in res.err
    res = reproduce_here("validate", path)
    assert res.code == 2 and "env.REPRODUCE_IMAGE_DIGEST" in res.err


def test_the_variable_a_ray_profile_names_for_the_digest_is_refused_too(tmp_path):
    from support.ray_cluster import ray_profile

    from launcher.inputs.profile import load_profile
    from launcher.plan.plan import build_plan

    raw = seed()
    raw["env"]["CLUSTER_IMAGE_SHA"] = "sha256:" + "4" * 64
    recipe = load_recipe(write(tmp_path, raw))  # another profile may use the name freely
    profile = load_profile(ray_profile(tmp_path, image_digest_env="CLUSTER_IMAGE_SHA"))
    with pytest.raises(BadInput, match=r"env\.CLUSTER_IMAGE_SHA: .*image_digest_env"):
        build_plan(recipe, profile)


def test_the_seed_and_every_shipped_recipe_still_load():
    for path in sorted(SEED.parents[3].glob("recipes/**/*.yaml")):
        load_recipe(path)


def test_a_command_of_a_long_word_is_read_and_the_commands_around_it_too():
    """shlex read one long word in quadratic time (a 900 KB word made `validate` take 44 s):
    the block's reader goes through a word once, so a 100 KB word is read like any other and
    the commands around it are still read."""
    from launcher.inputs.runargs import read_run_block

    script = "A=1\n: " + "x" * (100 * 1024) + "\nexport B=2\npython3 train.py --lr 1\n"
    block = read_run_block(script)
    assert block.problems == [] and block.exports["B"][1] == "2"
    assert block.invocations == [(4, ["--lr", "1"])]


def test_a_run_block_over_one_arguments_limit_is_refused_unread(tmp_path):
    """It could never start (the container's script is one argument of at most 128 KiB), and
    reading 1 MiB of commands would cost seconds: validate refuses it by its size, exit 2."""
    raw = yaml.safe_load(SEED.read_text())
    raw["run"] = "a;" * 70_000 + "\n" + raw["run"]
    res = reproduce_here("validate", write(tmp_path, raw))
    assert res.code == 2 and "Traceback" not in res.err, res
    assert "- run: is 141,465 bytes, over the 131,072 bytes Linux passes as one argument" in res.err
