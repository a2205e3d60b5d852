"""The asset node program (scripts/node_assets.py) run as node.sh runs it: a spec, resolve, its plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from launcher.inputs.recipe import load_recipe
from launcher.plan.asset_spec import build_spec, converter_identity
from support.assets import write_recipe
from support.node_scripts import SCRIPTS

ENCODER = "builtin:whitespace-test"


def make_spec(tmp: Path, raw: dict, *, store: str | None = None, cache: str = "cache") -> Path:
    recipe = load_recipe(write_recipe(tmp / f"{cache}-recipe.yaml", raw))
    c = tmp / cache
    spec = build_spec(
        recipe,
        cache_dir=str(c),
        hf_ckpt=str(c / "hf/tiny-model"),
        sft_data=str(c / "rows/rows.parquet"),
        torch_dist=str(c / "torch_dist/tiny-model"),
        converter=converter_identity(recipe, "tiny"),
        store=store,
    )
    path = tmp / f"{cache}-spec.json"
    path.write_text(json.dumps(spec))
    return path


def node(*args: str | Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "node_assets.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def resolve(spec: Path, ok: bool = True) -> tuple[dict, subprocess.CompletedProcess[str]]:
    plan_path = spec.with_name(spec.stem + "-plan.json")
    proc = node("resolve", "--spec", spec, "--out", plan_path, ok=ok)
    return (json.loads(proc.stdout) if proc.stdout else {}), proc


def sources(plan: dict) -> dict[str, str | None]:
    return {name: step["source"] for name, step in plan["assets"].items()}


def fake_conversion(spec: Path) -> Path:
    """What convert_hf_to_torch_dist.py leaves behind, near enough for the asset path."""
    td = Path(
        next(a for a in json.loads(spec.read_text())["assets"] if a["name"] == "torch_dist")["path"]
    )
    (td / "release").mkdir(parents=True)
    (td / "latest_checkpointed_iteration.txt").write_text("release")
    (td / "release/__0_0.distcp").write_bytes(b"weights" * 1000)
    return td
