"""scripts/node_assets.py as the node runs it (subprocesses, host python): resolve first, then
fetch, build the rows, seal and push; against a loopback Hub and a moto S3 or directory store.

The spec is the launcher's (launcher/plan/asset_spec.py) for a recipe of tiny assets whose pins are
the real hashes of what build_sft_rows makes of them with the test encoder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.assets import CKPT_REV, OTHER_REV, aws_cli, plant_other_snapshot, tiny_recipe_raw
from support.node_assets import ENCODER, fake_conversion, make_spec, node, resolve, sources
from support.node_scripts import SCRIPTS, load_script

store_mod = load_script("asset_store")


def test_cold_node_resolves_every_source_without_downloading(hub, tiny, tmp_path):
    spec = make_spec(tmp_path, tiny_recipe_raw(*tiny))
    started = time.monotonic()
    plan, proc = resolve(spec)
    assert time.monotonic() - started < 30
    assert sources(plan) == {
        "rows": "build",
        "tokenizer": "hub",
        "dataset": "hub",
        "hf_ckpt": "hub",
        "torch_dist": "convert",
    }
    assert plan["assets"]["tokenizer"]["hub"]["repo"] == "test-org/tiny-tokenizer"  # owner inferred
    # nothing but one-byte access checks reached a file
    assert {r.range for r in hub.file_requests()} == {"bytes=0-0"}
    assert "resolve: hf_ckpt: hub" in proc.stderr


def test_cold_node_builds_the_rows_and_then_everything_is_cache(hub, tiny, tmp_path):
    spec = make_spec(tmp_path, tiny_recipe_raw(*tiny))
    plan_path = spec.with_name(spec.stem + "-plan.json")
    resolve(spec)
    node("fetch", "--spec", spec, "--plan", plan_path, "rows")
    built = json.loads(
        node("build-rows", "--spec", spec, "--plan", plan_path, "--encoder", ENCODER).stdout
    )
    assert built["parquet_sha256"] == tiny[1]["parquet_sha256"] and built["rows"] == 12
    rows = tmp_path / "cache/rows/rows.parquet"
    assert store_mod.file_sha256(rows) == tiny[1]["parquet_sha256"]
    assert "test-org/tiny-sft" in json.loads(Path(str(rows) + ".build.json").read_text())["made_of"]
    node("fetch", "--spec", spec, "--plan", plan_path, "hf_ckpt", "torch_dist")
    assert node("source", "--plan", plan_path, "torch_dist").stdout.strip() == "convert"
    fake_conversion(spec)
    node("seal", "--spec", spec, "torch_dist")
    before = len(hub.file_requests())
    plan, _ = resolve(spec)
    assert set(sources(plan).values()) == {"cache", "not-needed"}
    assert sources(plan)["rows"] == "cache" and sources(plan)["torch_dist"] == "cache"
    assert len(hub.file_requests()) == before  # a warm cache asks the Hub nothing


def test_rows_that_differ_from_the_recipe_stop_with_both_hashes_and_their_origin(
    hub, tiny, tmp_path
):
    raw = tiny_recipe_raw(*tiny)
    raw["workload"]["dataset"]["build"]["parquet_sha256"] = "e" * 64
    spec = make_spec(tmp_path, raw)
    plan_path = spec.with_name(spec.stem + "-plan.json")
    resolve(spec)
    node("fetch", "--spec", spec, "--plan", plan_path, "rows")
    proc = node("build-rows", "--spec", spec, "--plan", plan_path, "--encoder", ENCODER, ok=False)
    assert proc.returncode == 1
    err = proc.stderr
    assert f"parquet_sha256: built {tiny[1]['parquet_sha256']}" in err
    assert f"workload.dataset.build.parquet_sha256 is {'e' * 64}" in err
    assert "dataset test-org/tiny-sft" in err and "test-org/tiny-tokenizer" in err  # where from
    assert not (tmp_path / "cache/rows/rows.parquet").exists()
    assert (tmp_path / "cache/rows/rows.parquet.mismatch").exists()


def test_a_tokenizer_file_that_differs_from_its_pin_is_refused(hub, tiny, tmp_path):
    raw = tiny_recipe_raw(*tiny)
    build = raw["workload"]["dataset"]["build"]
    build["tokenizer"] = build["tokenizer"].replace(
        tiny[0].tokenizer_sha256()["tokenizer.json"], "d" * 64
    )
    spec = make_spec(tmp_path, raw)
    plan_path = spec.with_name(spec.stem + "-plan.json")
    resolve(spec)
    proc = node("fetch", "--spec", spec, "--plan", plan_path, "rows", ok=False)
    assert proc.returncode == 1
    assert (
        f"tokenizer.json: sha256 {tiny[0].tokenizer_sha256()['tokenizer.json']}, pinned {'d' * 64}"
        in proc.stderr
    )


@pytest.mark.parametrize(
    "case, needle",
    [
        ("revision", "asset hf_ckpt (result.active_params.source/revision)"),
        ("gated", "gated repository and no HF_TOKEN"),
        ("dataset-repo", "asset dataset"),
    ],
)
def test_an_asset_nobody_can_supply_fails_resolve_naming_it(hub, tiny, tmp_path, case, needle):
    raw = tiny_recipe_raw(*tiny)
    if case == "revision":
        raw["result"]["active_params"]["revision"] = "f" * 40
    elif case == "gated":
        hub.repos[("model", "test-org/tiny-model")].gated = "manual"
    else:
        raw["workload"]["dataset"]["source"] = "test-org/no-such-dataset"
    plan, proc = resolve(make_spec(tmp_path, raw), ok=False)
    assert proc.returncode == 1, proc.stderr
    assert needle in proc.stderr and "tried:" in proc.stderr
    assert "store: none configured" in proc.stderr
    if case == "revision":
        assert "revision does not exist" in proc.stderr
    assert {r.range for r in hub.file_requests()} <= {"bytes=0-0"}  # nothing downloaded


def test_a_store_without_the_object_and_no_hub_is_an_infra_failure(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    store = tmp_path / "store"
    store.mkdir()
    plan, proc = resolve(make_spec(tmp_path, tiny_recipe_raw(*tiny), store=str(store)), ok=False)
    assert proc.returncode == 3
    assert f"store: no manifest at {store}/hf/models/test-org--tiny-model@{CKPT_REV}" in proc.stderr
    assert "unreachable" in proc.stderr


def test_a_cache_holding_another_revision_is_named_and_left_alone(hub, tiny, tmp_path):
    spec = make_spec(tmp_path, tiny_recipe_raw(*tiny))
    ckpt = tmp_path / "cache/hf/tiny-model"
    plant_other_snapshot(ckpt)
    plan, proc = resolve(spec, ok=False)
    assert proc.returncode == 1
    assert (
        "holds" in proc.stderr
        and OTHER_REV in proc.stderr
        and "nothing was overwritten" in proc.stderr
    )
    assert (ckpt / "config.json").read_text() == "{}"


def test_a_cache_whose_bytes_changed_is_not_trusted(hub, tiny, tmp_path):
    spec = make_spec(tmp_path, tiny_recipe_raw(*tiny))
    plan_path = spec.with_name(spec.stem + "-plan.json")
    resolve(spec)
    node("fetch", "--spec", spec, "--plan", plan_path, "hf_ckpt")
    shard = tmp_path / "cache/hf/tiny-model/model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[0] ^= 1
    shard.write_bytes(bytes(data))  # same size: a marker or a size check would not see it
    plan, _ = resolve(spec)
    assert plan["assets"]["hf_ckpt"]["source"] == "hub"
    assert "differ from its manifest" in plan["assets"]["hf_ckpt"]["tried"][0]
    node("fetch", "--spec", spec, "--plan", plan_path, "hf_ckpt")  # repairs the one file
    assert store_mod.verify_tree(shard.parent, store_mod.read_local_manifest(shard.parent)) == []


@pytest.mark.parametrize("kind", ["dir", "s3-boto3", "s3-aws-cli"])
def test_warm_store_second_node_downloads_nothing_from_the_hub_and_converts_nothing(
    hub, tiny, tmp_path, kind, request, monkeypatch
):
    if kind == "s3-aws-cli":  # the DLAMI host's client, first on the node's PATH
        monkeypatch.setenv("PATH", f"{Path(aws_cli()).parent}:{os.environ['PATH']}")
    if kind.startswith("s3"):
        monkeypatch.setenv("REPRODUCE_S3_CLIENT", kind[3:])
    store = str(tmp_path / "store") if kind == "dir" else request.getfixturevalue("s3")
    raw = tiny_recipe_raw(*tiny)
    # node A: cold store; it builds the rows, converts, and keeps both in the store
    spec_a = make_spec(tmp_path, raw, store=store, cache="node-a")
    plan_a = spec_a.with_name(spec_a.stem + "-plan.json")
    plan, _ = resolve(spec_a)
    assert sources(plan)["torch_dist"] == "convert" and sources(plan)["rows"] == "build"
    node("fetch", "--spec", spec_a, "--plan", plan_a, "rows")
    node("build-rows", "--spec", spec_a, "--plan", plan_a, "--encoder", ENCODER)
    node("push", "--spec", spec_a, "rows")
    node("fetch", "--spec", spec_a, "--plan", plan_a, "hf_ckpt")
    node("push", "--spec", spec_a, "hf_ckpt")
    fake_conversion(spec_a)
    node("seal", "--spec", spec_a, "torch_dist")
    node("push", "--spec", spec_a, "torch_dist")
    # node B: a fresh cache and the warm store
    hub.requests.clear()
    spec_b = make_spec(tmp_path, raw, store=store, cache="node-b")
    plan_b = spec_b.with_name(spec_b.stem + "-plan.json")
    plan, _ = resolve(spec_b)
    assert sources(plan) == {
        "rows": "store",
        "hf_ckpt": "store",
        "torch_dist": "store",
        "tokenizer": "not-needed",
        "dataset": "not-needed",
    }
    node("fetch", "--spec", spec_b, "--plan", plan_b, "rows", "hf_ckpt", "torch_dist")
    assert (
        node("build-rows", "--spec", spec_b, "--plan", plan_b).stdout.strip()
        == '{"status": "not built"}'
    )
    # no file from the Hub: only the listing the store's checkpoint is checked against (its LFS
    # sha256 for the pinned commit, docs/assets.md)
    assert hub.file_requests() == []
    assert all(r.path.startswith("/api/models/test-org/tiny-model/revision/") for r in hub.requests)
    b = tmp_path / "node-b"
    assert store_mod.file_sha256(b / "rows/rows.parquet") == tiny[1]["parquet_sha256"]
    assert (b / "torch_dist/tiny-model/latest_checkpointed_iteration.txt").read_text() == "release"
    assert store_mod.read_local_manifest(b / "hf/tiny-model")["origin"].startswith(store)


def test_cli_usage_errors_exit_2(tmp_path):
    (tmp_path / "bad.json").write_text('{"format": "nope"}')
    proc = node("resolve", "--spec", tmp_path / "bad.json", ok=False)
    assert proc.returncode == 2 and "reproduce-asset-spec/1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_tokenizer_comes_from_the_byte_identical_checkpoint_when_its_own_repo_is_gone(
    hub, tiny, tmp_path
):
    del hub.repos[("model", "test-org/tiny-tokenizer")]
    spec = make_spec(tmp_path, tiny_recipe_raw(*tiny))
    plan_path = spec.with_name(spec.stem + "-plan.json")
    plan, proc = resolve(spec)
    tok = plan["assets"]["tokenizer"]
    assert tok["source"] == "hub" and tok["hub"]["repo"] == "test-org/tiny-model"
    assert "repository not found" in tok["tried"][-2]
    node("fetch", "--spec", spec, "--plan", plan_path, "rows")
    manifest = store_mod.read_local_manifest(Path(tok["path"]))
    assert sorted(e["path"] for e in manifest["files"]) == [
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert "tiny-model" in manifest["origin"]  # only the pinned files, from the second source


def test_the_tokenizer_is_taken_from_a_cached_checkpoint(hub, tiny, tmp_path):
    spec = make_spec(tmp_path, tiny_recipe_raw(*tiny))
    plan_path = spec.with_name(spec.stem + "-plan.json")
    resolve(spec)
    node("fetch", "--spec", spec, "--plan", plan_path, "hf_ckpt")
    hub.requests.clear()
    plan, _ = resolve(spec)
    assert plan["assets"]["tokenizer"]["source"] == "cache"
    assert plan["assets"]["tokenizer"]["copy_from"].endswith("hf/tiny-model")
    node("fetch", "--spec", spec, "--plan", plan_path, "rows")
    assert not [r for r in hub.file_requests() if "tiny-tokenizer" in r.path]


def test_rows_are_built_from_a_tokenizer_and_dataset_kept_in_the_store(hub, tiny, tmp_path):
    store = str(tmp_path / "store")
    raw = tiny_recipe_raw(*tiny)
    spec_a = make_spec(tmp_path, raw, store=store, cache="node-a")
    plan_a = spec_a.with_name(spec_a.stem + "-plan.json")
    resolve(spec_a)
    node("fetch", "--spec", spec_a, "--plan", plan_a, "rows")
    node("push", "--spec", spec_a, "tokenizer")
    node("push", "--spec", spec_a, "dataset")
    hub.requests.clear()
    spec_b = make_spec(tmp_path, raw, store=store, cache="node-b")
    plan_b = spec_b.with_name(spec_b.stem + "-plan.json")
    plan, _ = resolve(spec_b)
    assert sources(plan)["tokenizer"] == "store" and sources(plan)["dataset"] == "store"
    node("fetch", "--spec", spec_b, "--plan", plan_b, "rows")
    built = json.loads(
        node("build-rows", "--spec", spec_b, "--plan", plan_b, "--encoder", ENCODER).stdout
    )
    assert built["parquet_sha256"] == tiny[1]["parquet_sha256"]
    assert store in built["made_of"]  # the inputs' origin is the store
    asked = hub.file_requests()  # only the checkpoint's one-byte probe (it is not in this store)
    assert {r.range for r in asked} == {"bytes=0-0"} and all("tiny-model" in r.path for r in asked)


def test_a_fetch_inside_a_stage_prints_progress_the_launcher_reads(hub, tiny, tmp_path):
    """In node.sh's stage assets (REPRODUCE_STAGE), a download prints the protocol's progress
    lines: bytes of the whole asset, never going back, the last one at its total (the live bar's
    ETA); a second fetch of the same files (kept) still reaches 100%."""
    from launcher.plan.protocol import parse_progress

    spec = make_spec(tmp_path, tiny_recipe_raw(*tiny))
    plan_path = spec.with_name(spec.stem + "-plan.json")
    plan, _ = resolve(spec)
    size = plan["assets"]["hf_ckpt"]["bytes"]
    env = {**os.environ, "REPRODUCE_STAGE": "assets"}  # the hub fixture's HF_ENDPOINT too

    def fetch() -> list:
        proc = subprocess.run(
            [sys.executable, str(SCRIPTS / "node_assets.py"), "fetch", "--spec", str(spec),
             "--plan", str(plan_path), "hf_ckpt"],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return [p for ln in proc.stderr.splitlines() if (p := parse_progress(ln)) is not None]

    lines = fetch()
    assert lines and {p.stage for p in lines} == {"assets"} and lines[0].unit == "bytes"
    assert [p.done for p in lines] == sorted(p.done for p in lines)
    assert lines[-1].done == lines[-1].total == size > 0
    assert "hf_ckpt" in lines[-1].item
    again = fetch()  # everything kept: no download, the bar still ends full
    assert again[-1].done == again[-1].total == size
