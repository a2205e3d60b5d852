"""End to end through the real Plan: `reproduce RECIPE --cluster <ssh profile>` against the sshd
fixture, a real dockerd, the image pulled by digest from the local registry, Ray and the stand-in
miles inside the container, logs streamed back, measured and judged. And the fast failures: an
unreachable host and an unknown host key give exit 3 with the cause, and leave nothing behind."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest
import yaml

from infra.docker import containers_named
from infra.helpers import cli
from infra.ports import free_port


def write_rows(path: Path, *, row_tokens: int, count: int) -> None:
    """A small parquet of rows in build_sft_rows.py's format (token ids + a struct loss mask)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_sft_rows", Path(__file__).resolve().parents[1] / "scripts" / "build_sft_rows.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_sft_rows", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    rows = [(list(range(i, i + row_tokens)), [0] * (row_tokens // 2) + [1] * (row_tokens - row_tokens // 2))
            for i in range(count)]
    module.write_rows(rows, path)

pytestmark = [pytest.mark.docker, pytest.mark.ssh]
SEED = Path(__file__).resolve().parents[1] / "recipes" / "qwen3-30b-a3b" / "h200" / "attune-tp1-pp1-ep8-mt16k.yaml"


def _test_recipe(tmp_path: Path, test_image) -> Path:
    """The seed, with its image pointed at the test registry and no Hugging Face download."""
    raw = yaml.safe_load(SEED.read_text())
    raw["stack"]["image"] = {"repository": test_image.repo, "digest": test_image.digest}
    raw["result"]["active_params"]["source"] = "test: count taken from the seed"
    path = tmp_path / "recipes" / "qwen3-30b-a3b" / "h200" / "standin.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _profile(tmp_path: Path, sshd, container_run_args, **overrides) -> Path:
    cache = tmp_path / "cache"
    torch_dist = cache / "torch_dist"
    torch_dist.mkdir(parents=True)
    (torch_dist / "latest_checkpointed_iteration.txt").write_text("release\n")  # conversion already done
    (cache / "hf").mkdir()
    rows = cache / "rows.parquet"
    write_rows(rows, row_tokens=8192, count=4)  # checked in the image by the rollout's own --check
    data = sshd.profile()
    data.update({
        "work_dir": str(tmp_path / "work"),
        "cache_dir": str(cache),
        "price_per_hour": 63.296,
        "docker": {"gpus": None, "shm_size": "256m", "extra_args": container_run_args, "network_host": False,
                   "memlock_unlimited": False},  # an unprivileged test host may not raise RLIMIT_MEMLOCK
        "preflight": {"enabled": False},
        "stack_check": "skip",
        "assets": {"hf_ckpt": str(cache / "hf"), "torch_dist": str(torch_dist), "sft_data": str(rows),
                   "verify_sha256": False},
        "ray": {"node_ip_address": "127.0.0.1", "port": free_port()},
        "env": {"STANDIN_NOISE_LINES": "1"},
    })
    data.update(overrides)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_reproduce_recipe_over_ssh_end_to_end(sshd, test_image, container_run_args, tmp_path):
    recipe = _test_recipe(tmp_path, test_image)
    profile = _profile(tmp_path, sshd, container_run_args)
    runs = tmp_path / "runs"
    result = cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), "--on-interrupt", "cancel",
                 timeout=400)
    run_dirs = list(runs.glob("**/run.json"))
    assert len(run_dirs) == 1, result.stderr
    rd = run_dirs[0].parent
    assert result.returncode == 0, result.stderr + (rd / "logs" / "node.log").read_text()[-4000:]
    assert "verdict: reproduced" in result.stderr
    for name in ("recipe.yaml", "profile.yaml", "plan.json", "node.sh", "timeline.json", "steps.jsonl",
                 "result.yaml", "verdict.json"):
        assert (rd / name).is_file(), name
    assert (rd / "recipe.yaml").read_bytes() == recipe.read_bytes()
    node_dir = json.loads((rd / "run.json").read_text())["node_run_dir"]
    assert (rd / "logs" / "node.log").read_bytes() == Path(node_dir, "node.log").read_bytes()
    stages = json.loads((rd / "timeline.json").read_text())["stages"]
    assert [s["name"] for s in stages] == ["preflight", "image", "preflight-gpu", "stack", "assets", "ray", "train"]
    assert all(s["status"] == "ok" for s in stages)
    assert " - step 19: " in (rd / "logs" / "train.log").read_text()
    # --network none: the container has only loopback, so Ray cannot bind anything else
    assert "Local node IP: 127.0.0.1" in (rd / "logs" / "ray.log").read_text()
    assert json.loads((rd / "verdict.json").read_text())["status"] == "reproduced"
    assert json.loads((rd / "status.json").read_text())["state"] == "done"
    assert containers_named(f"reproduce-{json.loads((rd / 'run.json').read_text())['run_id']}") == []


def test_unreachable_host_is_exit_3_within_the_connect_timeout(sshd, test_image, container_run_args, tmp_path):
    recipe = _test_recipe(tmp_path, test_image)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)  # accepts TCP, never speaks SSH: a black hole that must not hang the launcher
        profile = _profile(tmp_path, sshd, container_run_args, port=s.getsockname()[1], connect_timeout_s=2)
        t0 = time.monotonic()
        result = cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(tmp_path / "runs"))
        elapsed = time.monotonic() - t0
    assert result.returncode == 3, result.stderr
    assert "connect_timeout_s=2" in result.stderr and "Traceback" not in result.stderr
    assert elapsed < 20  # interpreter start-up included


def test_unknown_host_key_is_exit_3_and_names_the_cause(sshd, test_image, container_run_args, tmp_path):
    recipe = _test_recipe(tmp_path, test_image)
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    profile = _profile(tmp_path, sshd, container_run_args, known_hosts=str(empty))
    result = cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(tmp_path / "runs"))
    assert result.returncode == 3, result.stderr
    assert "unknown host" in result.stderr and sshd.host_fingerprint in result.stderr
    assert not (tmp_path / "work").exists()  # nothing was staged on the node
