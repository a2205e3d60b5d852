"""Recipes and profiles for running the REAL Plan against the test image (execution tests).

`write_recipe` is the seed with its image pointed at the local registry; `write_profile` is a
profile (ssh or local) with no GPUs, `--network none` containers lent this host's programs, no
preflight, no stack check and assets already in place (a real small rows parquet), so that
`build_plan(...)` renders the node script the product runs, and it runs on a host without GPUs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import yaml

from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.plan import stage_graph
from launcher.plan.plan import Plan, build_plan
from support.paths import SEED

from .ports import free_port

REPO = Path(__file__).resolve().parents[2]
ROW_TOKENS = 8192  # the seed's; the rollout's --check in the image compares the rows against it


def write_rows(path: Path, *, row_tokens: int = ROW_TOKENS, count: int = 4) -> None:
    """A small parquet of rows in build_sft_rows.py's format (token ids + a struct loss mask)."""
    spec = importlib.util.spec_from_file_location(
        "build_sft_rows", REPO / "scripts" / "build_sft_rows.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_sft_rows", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    rows = [
        (
            list(range(i, i + row_tokens)),
            [0] * (row_tokens // 2) + [1] * (row_tokens - row_tokens // 2),
        )
        for i in range(count)
    ]
    module.write_rows(rows, path)


def seed_raw() -> dict[str, Any]:
    return yaml.safe_load(SEED.read_text())


def write_recipe(
    tmp_path: Path,
    test_image=None,
    *,
    raw: dict[str, Any] | None = None,
    run_prefix: str = "",
    name: str = "standin",
) -> Path:
    """The seed (or `raw`), its image pointed at `test_image` (repo + digest), no Hugging Face download.

    `run_prefix` goes before the recipe's run block (it runs in the container, after Ray started).
    """
    raw = raw if raw is not None else seed_raw()
    if test_image is not None:
        raw["stack"]["image"] = {"repository": test_image.repo, "digest": test_image.digest}
    raw["result"]["active_params"]["source"] = "test: count taken from the seed"
    if run_prefix:
        raw["run"] = run_prefix.rstrip("\n") + "\n" + raw["run"]
    path = tmp_path / "recipes" / "qwen3-30b-a3b" / "h200" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def write_profile(
    tmp_path: Path,
    base: dict[str, Any],
    container_run_args: list[str],
    *,
    env: dict[str, str] | None = None,
    docker: dict[str, Any] | None = None,
    **overrides: Any,
) -> Path:
    """`base` ({"kind": "local"} or sshd.profile()) plus what makes the Plan run here.

    gpus null (no GPUs here), --network none (Ray binds loopback only), memlock not raised (an
    unprivileged test host may not), no host clock (the stand-in's steps take no time), assets in
    place: torch_dist marked converted, rows real.
    """
    cache = tmp_path / "cache"
    torch_dist = cache / "torch_dist"
    torch_dist.mkdir(parents=True, exist_ok=True)
    (torch_dist / "latest_checkpointed_iteration.txt").write_text(
        "release\n"
    )  # conversion already done
    (cache / "hf").mkdir(exist_ok=True)
    rows = cache / "rows.parquet"
    if not rows.exists():
        write_rows(rows)  # checked in the image by the rollout's own --check
    data = dict(base)
    data.update(
        {
            "work_dir": str(tmp_path / "work"),
            "cache_dir": str(cache),
            "price_per_hour": 63.296,
            "docker": {
                "gpus": None,
                "shm_size": "256m",
                "extra_args": list(container_run_args),
                "network_host": False,
                "memlock_unlimited": False,
                # The stand-in claims the seed's 19 s steps and prints them at once: the host's
                # clock would judge every such run mismatch (docs/measurement.md, the evidence
                # gate). The runs that test the clock turn it on (docker={"host_clock": True}).
                "host_clock": False,
                **(docker or {}),
            },
            "preflight": {"enabled": False},
            "stack_check": "skip",
            "assets": {
                "hf_ckpt": str(cache / "hf"),
                "torch_dist": str(torch_dist),
                "sft_data": str(rows),
                "verify_sha256": False,
            },
            "ray": {"node_ip_address": "127.0.0.1", "port": free_port()},
            "env": {"STANDIN_NOISE_LINES": "1", **(env or {})},
        }
    )
    data.update(overrides)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def plan_for(recipe_path: Path, profile_path: Path, **kw: Any) -> Plan:
    """The Plan the CLI would build for these files (what `--dry-run` prints and a run executes)."""
    return build_plan(load_recipe(recipe_path), load_profile(str(profile_path)), **kw)


# The node stages of a run of the Plan here, in the order they start: those of stage_graph.PARALLEL
# at once (the timeline lists them as they started, which varies), then these, in this order.
AFTER_JOIN = ["convert", "ray", "train"]


def assert_run_stages(names: list[str]) -> None:
    """A whole run's stages: every parallel one (in some order), then convert, ray and train."""
    parallel = len(stage_graph.PARALLEL)
    assert sorted(names[:parallel]) == sorted(stage_graph.PARALLEL), names
    assert names[parallel:] == AFTER_JOIN, names
