"""`reproduce prepare` end to end, as a user runs it: a fresh process against a loopback Hub and a
moto S3 (or a directory) store, with the tiny recipe whose pins are real.

Cheapest first (the rows before the checkpoint), every file verified and uploaded with its
manifest, a re-run that moves nothing, a broken download resumed, Ctrl-C stopping the transfers.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.assets import CKPT_REV, DATA_REV, tiny_recipe_raw, write_recipe
from support.cli import REPO, reproduce
from support.node_scripts import load_script

from launcher.prepare.assets import docker_rows_argv

store_mod = load_script("asset_store")
ENCODER = ("--test-encoder", "builtin:whitespace-test")
SHARD = "model-00001-of-00002.safetensors"


def prepare(recipe: Path, store: str, work: Path, *extra: str):
    return reproduce(
        "prepare", recipe, "--store", store, "--work-dir", work, *ENCODER, *extra, timeout=300
    )


def s3_objects(url: str) -> dict[str, bytes]:
    import boto3

    bucket, prefix = url[5:].split("/", 1)
    client = boto3.client("s3")
    out = {}
    for obj in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        out[obj["Key"][len(prefix) + 1 :]] = client.get_object(Bucket=bucket, Key=obj["Key"])[
            "Body"
        ].read()
    return out


def test_prepare_fills_the_store_cheapest_first_and_a_rerun_moves_nothing(hub, tiny, tmp_path, s3):
    recipe = write_recipe(tmp_path / "tiny.yaml", tiny_recipe_raw(*tiny))
    res = prepare(recipe, s3, tmp_path / "work")
    assert res.code == 0, res.err
    for name in ("tokenizer", "dataset", "rows", "hf_ckpt"):
        assert f"  {name}: " in res.out and "uploaded" in res.out
    objects = s3_objects(s3)
    manifests = {k: json.loads(v) for k, v in objects.items() if k.endswith(store_mod.MANIFEST)}
    keys = sorted(k[: -len("/" + store_mod.MANIFEST)] for k in manifests)
    assert [k.split("/")[0] for k in keys] == ["files", "hf", "hf", "rows"]  # files: tokenizer
    assert keys[1].startswith(f"hf/datasets/test-org--tiny-sft@{DATA_REV}.only-")
    assert keys[2] == f"hf/models/test-org--tiny-model@{CKPT_REV}"
    assert keys[3] == f"rows/{tiny[1]['parquet_sha256']}"
    for key, manifest in manifests.items():  # every stored byte is what its manifest says
        base = key[: -len(store_mod.MANIFEST)]
        assert manifest["files"]
        for e in manifest["files"]:
            assert hashlib.sha256(objects[base + e["path"]]).hexdigest() == e["sha256"]
    # cheapest first: the tokenizer and the dataset (and so the rows) before any checkpoint shard
    order = [r for r in hub.file_requests() if r.range != "bytes=0-0"]
    blob = {hashlib.sha256(d).hexdigest(): n for n, d in tiny[0].checkpoint.items()}
    shards = [i for i, r in enumerate(order) if r.server == "cdn" and r.path[6:] in blob]
    inputs = [i for i, r in enumerate(order) if "tiny-sft" in r.path or "tiny-tokenizer" in r.path]
    assert shards and inputs and max(inputs) < min(shards)
    # plain progress lines (stderr is not a terminal)
    assert f"hf_ckpt: {SHARD}: 0.3 of 0.3 MB (100%)" in res.err

    hub.requests.clear()
    again = prepare(recipe, s3, tmp_path / "other-work")
    assert again.code == 0, again.err
    assert again.out.count("already in the store") == 2  # rows and hf_ckpt; the rest not needed
    assert hub.requests == []


def test_rows_that_differ_stop_prepare_before_the_checkpoint_download(hub, tiny, tmp_path, s3):
    raw = tiny_recipe_raw(*tiny)
    raw["workload"]["dataset"]["build"]["parquet_sha256"] = "e" * 64
    res = prepare(write_recipe(tmp_path / "tiny.yaml", raw), s3, tmp_path / "work")
    assert res.code == 1, res.err
    assert f"parquet_sha256: built {tiny[1]['parquet_sha256']}" in res.err
    assert "e" * 64 in res.err and "Traceback" not in res.err
    blob = {
        hashlib.sha256(d).hexdigest()
        for n, d in tiny[0].checkpoint.items()
        if n.endswith(".safetensors")
    }
    assert not [r for r in hub.requests if r.server == "cdn" and r.path[6:] in blob]
    assert not any(k.startswith(("rows/", "hf/models/")) for k in s3_objects(s3))


def test_a_broken_download_fails_and_the_rerun_resumes_it(hub, tiny, tmp_path):
    recipe = write_recipe(tmp_path / "tiny.yaml", tiny_recipe_raw(*tiny))
    store = str(tmp_path / "store")
    hub.cut_always[SHARD] = 50_000  # every attempt stops after 50 kB: 5 attempts, then exit 3
    res = prepare(recipe, store, tmp_path / "work")
    assert res.code == 3, res.err
    assert "unreachable" in res.err or "connection closed" in res.err
    assert (Path(store) / f"rows/{tiny[1]['parquet_sha256']}" / store_mod.MANIFEST).is_file()
    partial = next((tmp_path / "work/hf").glob(f"*/{SHARD}.partial"))
    assert partial.stat().st_size == 250_000
    hub.cut_always.clear()
    hub.requests.clear()
    res = prepare(recipe, store, tmp_path / "work")
    assert res.code == 0, res.err
    assert [r.range for r in hub.requests if r.server == "cdn"] == ["bytes=250000-"]
    manifest = json.loads(
        (
            Path(store) / f"hf/models/test-org--tiny-model@{CKPT_REV}" / store_mod.MANIFEST
        ).read_text()
    )
    assert {e["path"] for e in manifest["files"]} == set(tiny[0].checkpoint)


def test_rows_built_elsewhere_are_accepted_only_with_the_pinned_hash(hub, tiny, tmp_path, s3):
    recipe = write_recipe(tmp_path / "tiny.yaml", tiny_recipe_raw(*tiny))
    wrong = tmp_path / "wrong.parquet"
    wrong.write_bytes(b"PAR1 not these rows")
    res = prepare(recipe, s3, tmp_path / "work", "--rows", str(wrong))
    assert res.code == 1 and "the recipe's workload.dataset.build.parquet_sha256 is" in res.err
    good = tmp_path / "good.parquet"
    good.write_bytes((Path(tiny[1]["parquet"])).read_bytes())
    hub.requests.clear()
    res = prepare(recipe, s3, tmp_path / "work2", "--rows", str(good))
    assert res.code == 0, res.err
    assert "tokenizer" not in res.out and "dataset" not in res.out  # not needed: nothing built
    assert not [r for r in hub.requests if "tiny-sft" in r.path]


def test_ctrl_c_stops_the_transfers_and_says_how_to_resume(hub, tiny, tmp_path):
    recipe = write_recipe(tmp_path / "tiny.yaml", tiny_recipe_raw(*tiny))
    hub.slow.add(SHARD)  # 300 kB in 4 kB steps: ~4 s
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "prepare", str(recipe), "--store", str(tmp_path / "store"),
         "--work-dir", str(tmp_path / "work"), *ENCODER],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not any(
        r.server == "cdn" and r.path[6:] == hashlib.sha256(tiny[0].checkpoint[SHARD]).hexdigest()
        for r in hub.requests
    ):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(0.3)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert time.monotonic() - sent < 3  # the transfer stopped; it did not run to its end
    assert "run the same command again to resume" in err and "Traceback" not in err
    assert next((tmp_path / "work/hf").glob(f"*/{SHARD}.partial")).stat().st_size < 300_000


def test_usage_errors_exit_2(tmp_path, tiny):
    recipe = write_recipe(tmp_path / "tiny.yaml", tiny_recipe_raw(*tiny))
    res = reproduce("prepare", recipe)
    assert res.code == 2 and "give --store" in res.err
    res = reproduce("prepare", recipe, "--store", "gs://bucket/x")
    assert res.code == 2 and "expected s3://BUCKET/PREFIX or a directory" in res.err
    profile = tmp_path / "p.yaml"
    profile.write_text("kind: local\nassets:\n  store: s3://Not_A_Bucket/x\n")
    res = reproduce("prepare", recipe, "--cluster", str(profile))
    assert res.code == 2 and "assets.store" in res.err
    res = reproduce("prepare", recipe, "--store", str(tmp_path / "s"), "--rows-builder", "gpu")
    assert res.code == 2 and "--rows-builder" in res.err


def test_the_store_comes_from_the_profile(hub, tiny, tmp_path):
    recipe = write_recipe(tmp_path / "tiny.yaml", tiny_recipe_raw(*tiny))
    profile = tmp_path / "p.yaml"
    profile.write_text(f"kind: local\nassets:\n  store: {tmp_path / 'store'}\n")
    res = reproduce(
        "prepare",
        recipe,
        "--cluster",
        str(profile),
        "--work-dir",
        tmp_path / "w",
        *ENCODER,
        timeout=300,
    )
    assert res.code == 0, res.err
    assert f"-> {tmp_path / 'store'}" in res.out


def test_the_rows_build_in_the_image_runs_without_network_token_or_gpu(tmp_path):
    argv = docker_rows_argv(
        "reg/miles@sha256:" + "a" * 64, tmp_path, "/opt/s", tmp_path / "spec.json"
    )
    assert argv[:6] == ["docker", "run", "--rm", "--network", "none", "--user"]
    assert "HF_TOKEN" not in " ".join(argv) and "--gpus" not in argv
    # the work dir (what the host downloads into and trusts next) is read-only in the image; the
    # build writes only its own fresh directory, named by --out (docs/architecture.md)
    volumes = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    assert f"{tmp_path}:{tmp_path}:ro" in volumes
    writable = [v for v in volumes if not v.endswith(":ro")]
    out = str(tmp_path / ".incoming" / "rows")
    assert writable == [f"{out}:{out}"] and argv[argv.index("--out") + 1] == out
    assert argv[argv.index("reg/miles@sha256:" + "a" * 64) + 1 :][:3] == [
        "python3",
        "/opt/reproduce/scripts/node_assets.py",
        "build-rows",
    ]


def test_offline_the_one_cause_is_said_once(tmp_path, tiny, monkeypatch):
    import socket

    with socket.socket() as sock:  # a loopback port nobody listens on: the Hub is unreachable
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("REPRODUCE_RETRY_BASE_S", "0")
    recipe = write_recipe(tmp_path / "tiny.yaml", tiny_recipe_raw(*tiny))
    res = prepare(recipe, str(tmp_path / "store"), tmp_path / "work")
    assert res.code == 3 and "Traceback" not in res.err
    assert "the Hugging Face Hub cannot be reached from here" in res.err
    assert res.err.count("unreachable") == 1 and "Nothing was downloaded" in res.err
    assert len(res.err.strip().splitlines()) <= 2  # the resolving line, then one paragraph
    assert (tmp_path / "work" / "plan.json").is_file()  # every place tried, for who asks


def test_the_training_image_is_never_pulled_without_asking(hub, tiny, tmp_path):
    """No miles here and the image not on this machine: without a terminal, refused with its
    size and the options, before anything is downloaded; `--rows-builder docker` would pull."""
    recipe = write_recipe(tmp_path / "tiny.yaml", tiny_recipe_raw(*tiny))
    work = tmp_path / "work"
    res = reproduce("prepare", recipe, "--store", tmp_path / "store", "--work-dir", work)
    assert res.code == 2, res.err
    assert "not on this machine: pulling it downloads about 20 GB" in res.err
    assert "--rows-builder docker" in res.err and "--rows FILE" in res.err
    assert not any(p.is_file() and p.stat().st_size > 0 for p in (work / "hf").rglob("*"))
    fetched = [r for r in hub.requests if r.server == "cdn" or "/resolve/" in r.path]
    assert fetched and all(r.range == "bytes=0-0" for r in fetched)  # probes, no download


@pytest.mark.parametrize("planted", [".ssh", ".bashrc", "notes.txt"])
def test_a_work_dir_that_holds_anything_else_is_refused_before_any_download(
    hub, tiny, tmp_path, planted
):
    """The rows build's container mounts --work-dir whole, as a run's containers mount the
    cache: `--work-dir ~` would have shown the recipe's code the user's keys. What prepare puts
    there itself (a second prepare into the same directory) is its own."""
    recipe = write_recipe(tmp_path / "tiny.yaml", tiny_recipe_raw(*tiny))
    work = tmp_path / "home"
    work.mkdir()
    (work / planted).write_text("secret")
    hub.requests.clear()
    res = prepare(recipe, str(tmp_path / "store"), work)
    assert res.code == 2, res.err
    assert f"--work-dir {work}: it holds what prepare did not put there ('{planted}')" in res.err
    assert hub.requests == []  # refused before the Hub was asked anything
    assert sorted(p.name for p in work.iterdir()) == [planted]
