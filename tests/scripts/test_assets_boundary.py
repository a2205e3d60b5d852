"""The host side of the trust boundary (docs/architecture.md, "The trust boundary"), one finding of
issue 19 at a time, as the node runs its programs (subprocesses on the host python, a loopback
Hub, directory and moto S3 stores): a link planted where the host writes next is never written
through; rows and checkpoints from a store are checked against the recipe's and the Hub's pins,
not only against the store's own manifest; the push hashes what it uploads and repairs what a
manifest alone would call complete; every container mount of the cache is read-only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from support.assets import tiny_recipe_raw
from support.node_assets import ENCODER, fake_conversion, make_spec, node, resolve, sources
from support.node_scripts import load_script

store_mod = load_script("asset_store")
safe_io = load_script("safe_io")
CANARY = "ssh-ed25519 AAAAC3Nza canary@outside\n"


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    path = tmp_path / "home" / ".ssh" / "authorized_keys"
    path.parent.mkdir(parents=True)
    path.write_text(CANARY)
    return path


def asset_path(spec: Path, name: str) -> Path:
    return Path(
        next(a for a in json.loads(spec.read_text())["assets"] if a["name"] == name)["path"]
    )


# ---- a link planted in the cache where the next download writes (run A plants, run B writes)


def test_a_partial_download_linked_to_authorized_keys_is_removed_never_written_through(
    hub, tiny, tmp_path, canary
):
    spec = make_spec(tmp_path, tiny_recipe_raw(*tiny))
    plan_path = spec.with_name(spec.stem + "-plan.json")
    resolve(spec)
    ckpt = asset_path(spec, "hf_ckpt")
    ckpt.mkdir(parents=True)
    asset = next(a for a in json.loads(spec.read_text())["assets"] if a["name"] == "hf_ckpt")
    identity = load_script("asset_spec").identity(asset)
    (ckpt / ".reproduce-pending").write_text(json.dumps(identity, sort_keys=True))  # run A's
    names = list(tiny[0].checkpoint)
    for name in names:  # what a container with the cache writable left behind for this download
        (ckpt / f"{name}.partial").symlink_to(canary)
    proc = node("fetch", "--spec", spec, "--plan", plan_path, "hf_ckpt")
    assert canary.read_text() == CANARY
    for name, data in tiny[0].checkpoint.items():
        assert (ckpt / name).read_bytes() == data and not (ckpt / name).is_symlink()
    assert "removed it and started again" in proc.stderr


def test_a_cached_file_replaced_by_a_link_is_not_trusted(hub, tiny, tmp_path, canary):
    spec = make_spec(tmp_path, tiny_recipe_raw(*tiny))
    plan_path = spec.with_name(spec.stem + "-plan.json")
    resolve(spec)
    node("fetch", "--spec", spec, "--plan", plan_path, "hf_ckpt")
    ckpt = asset_path(spec, "hf_ckpt")
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").symlink_to(canary)  # bytes the host would hash, then hand to training
    plan, _ = resolve(spec)
    assert plan["assets"]["hf_ckpt"]["source"] == "hub"
    assert "config.json: refusing" in plan["assets"]["hf_ckpt"]["tried"][0]
    node("fetch", "--spec", spec, "--plan", plan_path, "hf_ckpt")
    assert not (ckpt / "config.json").is_symlink() and canary.read_text() == CANARY


# ---- rows and checkpoints from the store: the recipe's and the Hub's pins, not the store's word


def _forged_rows_store(tmp_path: Path, raw: dict, store: Path) -> None:
    """A store whose rows key is the recipe's, holding other bytes under a manifest that agrees
    with them (a writer of a shared store forging it)."""
    pin = raw["workload"]["dataset"]["build"]["parquet_sha256"]
    key = store / "rows" / pin
    key.mkdir(parents=True)
    (key / "rows.parquet").write_bytes(b"PAR1 forged rows PAR1")
    store_mod.write_local_manifest(
        key, store_mod.make_manifest(key, {"kind": "rows", "parquet_sha256": pin}, origin="forger")
    )


def test_rows_from_the_store_are_checked_against_the_recipes_pin_not_the_stores_manifest(
    hub, tiny, tmp_path
):
    raw = tiny_recipe_raw(*tiny)
    store = tmp_path / "store"
    _forged_rows_store(tmp_path, raw, store)
    spec = make_spec(tmp_path, raw, store=str(store))
    plan, _ = resolve(spec)
    assert plan["assets"]["rows"]["source"] == "build"  # the forged store is passed over
    assert any("the recipe's pin" in t for t in plan["assets"]["rows"]["tried"])
    # and a plan that says "store" anyway (made before the forgery) is refused at fetch
    plan["assets"]["rows"].update(source="store", key=f"rows/{tiny[1]['parquet_sha256']}")
    plan_path = spec.with_name("forced-plan.json")
    plan_path.write_text(json.dumps(plan))
    proc = node("fetch", "--spec", spec, "--plan", plan_path, "rows", ok=False)
    assert proc.returncode == 1 and "MISMATCH" in proc.stderr and "parquet_sha256" in proc.stderr
    assert not asset_path(spec, "rows").exists()


@pytest.mark.parametrize("hub_up", [True, False])
def test_a_checkpoint_from_the_store_is_checked_against_the_hubs_lfs_sha256(
    hub, tiny, tmp_path, hub_up
):
    raw = tiny_recipe_raw(*tiny)
    store = tmp_path / "store"
    spec_a = make_spec(tmp_path, raw, store=str(store), cache="a")
    plan_a = spec_a.with_name(spec_a.stem + "-plan.json")
    resolve(spec_a)
    node("fetch", "--spec", spec_a, "--plan", plan_a, "hf_ckpt")
    node("push", "--spec", spec_a, "hf_ckpt")
    (key,) = (store / "hf" / "models").iterdir()
    manifest = json.loads((key / store_mod.MANIFEST).read_text())
    assert manifest["hub_lfs_sha256"]  # the Hub's pins, recorded with the store's copy
    # a writer of the store swaps a weight file and its manifest entry, consistently
    shard = next(p for p in key.glob("*.safetensors"))
    forged = b"forged weights" * 100
    shard.write_bytes(forged)
    for e in manifest["files"]:
        if e["path"] == shard.name:
            e.update(bytes=len(forged), sha256=hashlib.sha256(forged).hexdigest())
    (key / store_mod.MANIFEST).write_text(json.dumps(manifest))
    spec_b = make_spec(tmp_path, raw, store=str(store), cache="b")
    plan_b = spec_b.with_name(spec_b.stem + "-plan.json")
    plan, _ = resolve(spec_b)
    assert sources(plan)["hf_ckpt"] == "store"
    if not hub_up:
        hub.stop()
    proc = node("fetch", "--spec", spec_b, "--plan", plan_b, "hf_ckpt", ok=False)
    assert proc.returncode == 1, proc.stderr
    assert shard.name in proc.stderr and "differs from the Hub's listing" in proc.stderr
    assert ("recorded by prepare" in proc.stderr) == (not hub_up)
    assert not (asset_path(spec_b, "hf_ckpt") / shard.name).exists()


# ---- the push: hashes what it reads, repairs what the manifest alone calls complete


def _sealed_conversion(tmp_path: Path, raw: dict, store: str) -> tuple[Path, Path]:
    spec = make_spec(tmp_path, raw, store=store)
    resolve(spec)
    td = fake_conversion(spec)
    node("seal", "--spec", spec, "torch_dist")
    return spec, td


@pytest.mark.parametrize("client", ["boto3", "aws-cli"])
def test_a_push_of_bytes_changed_after_the_seal_uploads_nothing_under_the_sealed_hash(
    hub, tiny, tmp_path, s3, monkeypatch, client
):
    monkeypatch.setenv("REPRODUCE_S3_CLIENT", client)
    if client == "aws-cli":
        from support.assets import aws_cli

        monkeypatch.setenv("PATH", f"{Path(aws_cli()).parent}:{os.environ['PATH']}")
    spec, td = _sealed_conversion(tmp_path, tiny_recipe_raw(*tiny), s3)
    weights = td / "release/__0_0.distcp"
    data = bytearray(weights.read_bytes())
    data[10] ^= 1
    weights.write_bytes(bytes(data))  # what a writer did after the seal: same size
    proc = node("push", "--spec", spec, "torch_dist", ok=False)
    assert proc.returncode == 1, proc.stderr
    assert "changed after it was sealed" in proc.stderr
    import boto3

    bucket, prefix = s3[5:].split("/", 1)
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert not any(k.endswith("__0_0.distcp") for k in keys), keys
    assert not any(k.endswith(store_mod.MANIFEST) for k in keys), keys


def test_a_re_push_repairs_a_stored_object_whose_bytes_differ_from_its_manifest(
    hub, tiny, tmp_path
):
    store = tmp_path / "store"
    spec, td = _sealed_conversion(tmp_path, tiny_recipe_raw(*tiny), str(store))
    node("push", "--spec", spec, "torch_dist")
    (stored,) = store.glob("torch_dist/*/*/release/__0_0.distcp")
    good = stored.read_bytes()
    broken = bytearray(good)
    broken[0] ^= 1
    stored.write_bytes(bytes(broken))  # the manifest still lists the right sha256
    proc = node("push", "--spec", spec, "torch_dist")
    assert "already complete" not in proc.stderr
    assert stored.read_bytes() == good


def test_a_push_into_a_shared_store_never_writes_through_another_writers_link(
    hub, tiny, tmp_path, canary
):
    store = tmp_path / "store"
    spec, td = _sealed_conversion(tmp_path, tiny_recipe_raw(*tiny), str(store))
    key = store / "torch_dist"
    # another writer of the shared store knows the key, and plants links where we write next
    manifest = store_mod.read_local_manifest(td)
    identity_key = load_script("asset_spec").store_key(
        next(a for a in json.loads(spec.read_text())["assets"] if a["name"] == "torch_dist")
    )
    target = store / identity_key
    (target / "release").mkdir(parents=True)
    for e in manifest["files"]:
        (target / f"{e['path']}.partial").symlink_to(canary)
    (target / "latest_checkpointed_iteration.txt").symlink_to(canary)
    node("push", "--spec", spec, "torch_dist")
    assert canary.read_text() == CANARY
    assert (
        store_mod.verify_tree(target, store_mod.read_local_manifest(target) or {"files": []}) == []
    )
    assert not (target / "latest_checkpointed_iteration.txt").is_symlink()
    assert key.exists()


# ---- what a container made: adopted only after the host's check


def test_adopt_takes_only_regular_files_and_the_recipes_rows(hub, tiny, tmp_path, canary):
    spec = make_spec(tmp_path, tiny_recipe_raw(*tiny))
    plan_path = spec.with_name(spec.stem + "-plan.json")
    resolve(spec)
    node("fetch", "--spec", spec, "--plan", plan_path, "rows")
    out = tmp_path / "new-rows"
    out.mkdir()
    (out / "rows.parquet").symlink_to(canary)  # a build that "made" the operator's keys
    proc = node("adopt", "--spec", spec, "rows", "--from", out, ok=False)
    assert proc.returncode == 1 and "symlink" in proc.stderr
    (out / "rows.parquet").unlink()
    node("build-rows", "--spec", spec, "--plan", plan_path, "--encoder", ENCODER, "--out", out)
    assert not asset_path(spec, "rows").exists()  # the build wrote only its own directory
    (out / "stray.partial").symlink_to(canary)
    node("adopt", "--spec", spec, "rows", "--from", out)
    rows = asset_path(spec, "rows")
    assert store_mod.file_sha256(rows) == tiny[1]["parquet_sha256"]
    assert canary.read_text() == CANARY
    # a conversion's directory: links dropped (never followed), the rest sealed by the host
    conv = tmp_path / "new-conv"
    (conv / "release").mkdir(parents=True)
    (conv / "release/__0_0.distcp").write_bytes(b"w" * 100)
    (conv / store_mod.MANIFEST).symlink_to(canary)
    proc = node("adopt", "--spec", spec, "torch_dist", "--from", conv)
    td = asset_path(spec, "torch_dist")
    assert store_mod.verify_tree(td, store_mod.read_local_manifest(td)) == []
    assert canary.read_text() == CANARY and "never followed" in proc.stderr
