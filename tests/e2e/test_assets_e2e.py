"""The whole asset path of a run, end to end on this machine: `reproduce RECIPE --cluster <ssh
profile>` against a real sshd (the node), a real dockerd and the test image, a loopback Hub
stand-in (tests/support/assets.py, which counts every request), moto's S3 server on 127.0.0.1 as
the store, and a recipe of tiny real assets whose pins are their real hashes.

The node's host is this machine reached over SSH: its sessions carry what a GPU node's would
(sshd `SetEnv`: the Hub and S3 endpoints, S3 credentials as an instance role would give them, a
PATH with the `aws` CLI ahead of the system's python3, and REPRODUCE_S3_CLIENT=aws-cli: the
node's S3 client is the aws CLI, as on the DLAMI). Containers get the stand-in torchrun and converter
(tests/standin_miles/bin, tools/), so the conversion runs for real, and converts nothing.

What is shown: a cold node builds the rows in the image and converts, and fills the store; after
`reproduce prepare`, a run converts once and the next run downloads nothing from the Hub and
converts nothing; an asset nobody can supply fails in stage resolve, in seconds, before any
download (the image pull beside it ends or is stopped), naming the asset and every source tried;
rows that differ from the recipe stop the run and the checkpoint download beside them; a cache
holding another revision is named and left alone; a store object whose bytes changed, or that is missing, is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.assets import OTHER_REV, plant_other_snapshot
from support.assets_e2e import (
    BESIDE_RESOLVE,
    Run,
    ok,
    profile_file,
    recipe_file,
    s3_manifests,
)
from support.docker import docker
from support.helpers import cli
from support.node_scripts import load_script

from launcher.plan import stage_graph

pytestmark = [pytest.mark.docker, pytest.mark.ssh]
store_mod = load_script("asset_store")


def test_a_cold_node_builds_the_rows_in_the_image_converts_and_fills_the_store(
    node, hub, tiny, s3, test_image, container_run_args, tmp_path
):
    recipe = recipe_file(
        tmp_path,
        test_image,
        tiny,
        run_prefix='echo "token-in-training=$(printenv HF_TOKEN || echo absent)"',
    )
    run = Run(
        recipe, profile_file(tmp_path, node, container_run_args, "a", store=s3), tmp_path / "runs"
    )
    ok(run)
    assert run.sources() == {
        "rows": "build",
        "tokenizer": "hub",
        "dataset": "hub",
        "hf_ckpt": "hub",
        "torch_dist": "convert",
    }
    cache = tmp_path / "cache-a"
    (rows,) = (cache / "rows").glob("*.parquet")
    assert store_mod.file_sha256(rows) == tiny[1]["parquet_sha256"]  # built in the image, checked
    assert "built on this node" in json.loads(Path(f"{rows}.build.json").read_text())["made_of"]
    assert run.converted()
    # where the GPU-hours went: every stage, the window inside training, collect and release,
    # adding up to the run's GPU-hours (result.yaml and report.md)
    result = yaml.safe_load((run.rd / "result.yaml").read_text())
    split = result["provenance"]["gpu_hours_by_stage"]
    # the stages that ran at once are parts `parallel: a+b`, their wall time counted once
    parts = [k for k in split if k != "between"]
    node = parts[1 : parts.index("convert")]
    members = [n for p in node for n in p.removeprefix("parallel: ").split("+")]
    assert parts[0] == "acquire" and sorted(members) == sorted(stage_graph.PARALLEL), split
    assert any(p.startswith("parallel: ") for p in node), split
    want = ["convert", "ray", "train", "window", "push", "collect", "release"]
    assert parts[parts.index("convert") :] == want, split
    assert sum(split.values()) == pytest.approx(result["provenance"]["unrounded"]["gpu_hours"])
    report = (run.rd / "report.md").read_text()
    assert "## Where the GPU-hours went" in report and "| convert |" in report
    # the node kept what it built and converted, and the checkpoint it fetched, in the store
    keys = sorted(s3_manifests(s3))
    assert [k.split("/")[0] for k in keys] == ["hf", "rows", "torch_dist"], keys
    assert "warning" not in run.node_log
    # HF_TOKEN reached the host's Hub requests, never the CDN, and no container
    assert {r.auth for r in hub.requests if r.server == "hub"} == {"Bearer hf_canary"}
    assert {r.auth for r in hub.requests if r.server == "cdn"} == {None}
    assert "token-in-training=absent" in (run.rd / "logs" / "train.log").read_text()
    assert "-e HF_TOKEN" not in (run.rd / "node.sh").read_text()
    # the rows (fetched and built after resolve and the image) and the checkpoint (after resolve)
    at = {s["name"]: s for s in run.timeline["stages"]}
    assert at["rows"]["start"] >= max(at["resolve"]["end"], at["image"]["end"])
    assert at["assets"]["start"] >= at["resolve"]["end"]


def test_prepare_then_a_run_converts_once_and_the_next_downloads_and_converts_nothing(
    node, hub, tiny, s3, test_image, container_run_args, tmp_path
):
    recipe = recipe_file(tmp_path, test_image, tiny)
    prepared = cli(
        "prepare", str(recipe), "--store", s3, "--work-dir", str(tmp_path / "prepare"),
        "--test-encoder", "builtin:whitespace-test",
    )  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr
    assert "torch_dist" not in "".join(s3_manifests(s3))  # prepare converts nothing (no GPU)
    hub.requests.clear()

    first = Run(
        recipe, profile_file(tmp_path, node, container_run_args, "a", store=s3), tmp_path / "runs"
    )
    ok(first)
    assert first.sources() == {
        "rows": "store",
        "hf_ckpt": "store",
        "torch_dist": "convert",
        "tokenizer": "not-needed",
        "dataset": "not-needed",
    }
    assert first.converted() and hub.file_requests() == []  # the Hub's listing only (below)
    assert all(r.path.startswith("/api/models/test-org/tiny-model/revision/") for r in hub.requests)
    assert any(k.startswith("torch_dist/") for k in s3_manifests(s3))  # kept for the next run

    second = Run(
        recipe, profile_file(tmp_path, node, container_run_args, "b", store=s3), tmp_path / "runs"
    )
    ok(second)
    assert second.sources()["torch_dist"] == "store"
    # no file from the Hub: only the listing the store's checkpoint is checked against (its LFS
    # sha256 for the pinned commit, docs/assets.md)
    assert hub.file_requests() == []
    assert all(r.path.startswith("/api/models/test-org/tiny-model/revision/") for r in hub.requests)
    assert not second.converted()
    converted = tmp_path / "cache-b" / "torch_dist"
    (done,) = converted.iterdir()
    assert (done / "latest_checkpointed_iteration.txt").read_text() == "release"


# ---- failing early, and cheaply


@pytest.mark.parametrize(
    "case, code, needle",
    [
        ("no-such-revision", 1, "the revision does not exist"),
        ("gated-without-token", 1, "gated repository and no HF_TOKEN"),
        ("hub-down-store-empty", 3, "no manifest"),
    ],
)
def test_an_asset_nobody_can_supply_fails_in_resolve_before_any_download(
    node, hub, tiny, s3, test_image, container_run_args, tmp_path, monkeypatch, case, code, needle
):
    def edit(raw):
        if case == "no-such-revision":
            raw["result"]["active_params"]["revision"] = "f" * 40

    if case == "gated-without-token":
        hub.repos[("model", "test-org/tiny-model")].gated = "manual"
        monkeypatch.delenv("HF_TOKEN")
    if case == "hub-down-store-empty":
        hub.stop()  # nothing answers at HF_ENDPOINT any more
    docker("rmi", "-f", test_image.ref, check=False)
    recipe = recipe_file(tmp_path, test_image, tiny, edit)
    run = Run(
        recipe, profile_file(tmp_path, node, container_run_args, "a", store=s3), tmp_path / "runs"
    )
    assert run.result.returncode == code, run.why()
    err = run.result.stderr
    assert (
        "in stage resolve" in err and "asset hf_ckpt (result.active_params.source/revision)" in err
    )
    assert "tried:" in err and "at s3://" in err and needle in err
    # the pull ran beside it (ended or stopped); nothing that needs the asset plan began
    status = run.status
    assert status.pop("resolve") == "failed" and set(status) <= BESIDE_RESOLVE, run.stages
    assert set(status.values()) <= {"ok", "stopped"}, run.stages
    assert run.stage_seconds("resolve") < 60
    assert {r.range for r in hub.file_requests()} <= {"bytes=0-0"}  # nothing downloaded
    assert not any((tmp_path / "cache-a").rglob("*.safetensors"))


def test_rows_that_differ_from_the_recipe_stop_the_run_and_the_download_beside_them(
    node, hub, tiny, test_image, container_run_args, tmp_path
):
    def edit(raw):
        raw["workload"]["dataset"]["build"]["parquet_sha256"] = "e" * 64

    run = Run(
        recipe_file(tmp_path, test_image, tiny, edit),
        profile_file(tmp_path, node, container_run_args, "a"),
        tmp_path / "runs",
    )
    assert run.result.returncode == 1, run.why()
    assert "in stage rows" in run.result.stderr
    log = (run.rd / "logs" / "rows.log").read_text()
    assert f"parquet_sha256: built {tiny[1]['parquet_sha256']}" in log and "e" * 64 in log
    status = run.status
    assert status.pop("rows") == "failed" and not {"convert", "ray"} & set(status), run.stages
    assert set(status.values()) <= {"ok", "stopped"}, run.stages  # the checkpoint's download too
    # the build's own directory keeps what it made; nothing took $SFT_DATA's name
    cache = tmp_path / "cache-a"
    assert len(list(cache.glob(".incoming/*/rows/rows.parquet.mismatch"))) == 1
    assert not list((cache / "rows").glob("*.parquet*"))
    assert not run.converted()


def test_a_cache_holding_another_revision_is_named_and_left_alone(
    node, hub, tiny, test_image, container_run_args, tmp_path
):
    other = tmp_path / "elsewhere" / "tiny-model"
    plant_other_snapshot(other)
    before = sorted((p.name, p.read_bytes()) for p in other.iterdir())
    profile = profile_file(tmp_path, node, container_run_args, "a", assets={"hf_ckpt": str(other)})
    run = Run(recipe_file(tmp_path, test_image, tiny), profile, tmp_path / "runs")
    assert run.result.returncode == 1, run.why()
    status = run.status
    assert status.pop("resolve") == "failed" and set(status) <= BESIDE_RESOLVE, run.stages
    assert "holds" in run.result.stderr and OTHER_REV in run.result.stderr
    assert sorted((p.name, p.read_bytes()) for p in other.iterdir()) == before


# ---- a store that lies


@pytest.fixture
def prepared_dir_store(hub, tiny, test_image, tmp_path):
    """A directory store filled by `reproduce prepare` (tampered with by the tests below)."""
    store = tmp_path / "store"
    recipe = recipe_file(tmp_path, test_image, tiny)
    done = cli(
        "prepare", str(recipe), "--store", str(store), "--work-dir", str(tmp_path / "prepare"),
        "--test-encoder", "builtin:whitespace-test",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    hub.requests.clear()
    return recipe, store


@pytest.mark.parametrize("how, code", [("bytes-changed", 1), ("object-missing", 3)])
def test_a_store_object_that_differs_or_is_missing_is_refused(
    node, hub, prepared_dir_store, test_image, container_run_args, tmp_path, how, code
):
    recipe, store = prepared_dir_store
    (shard,) = store.glob("hf/models/*/model-00001-of-00002.safetensors")
    if how == "bytes-changed":
        data = bytearray(shard.read_bytes())
        data[100] ^= 1
        shard.write_bytes(bytes(data))  # same size: only the sha256 tells
    else:
        shard.unlink()
    profile = profile_file(tmp_path, node, container_run_args, "a", store=str(store))
    run = Run(recipe, profile, tmp_path / "runs")
    assert run.result.returncode == code, run.why()
    assert "in stage assets" in run.result.stderr and run.status["assets"] == "failed"
    assert "model-00001-of-00002.safetensors" in (run.rd / "logs" / "assets.log").read_text()
    for ckpt in (tmp_path / "cache-a" / "hf").glob("test-org--tiny-model@*"):
        assert store_mod.read_local_manifest(ckpt) is None  # the cache was not made to trust it
    assert hub.file_requests() == []  # the store was the plan: no silent fall-back to the Hub
    assert not run.converted()
