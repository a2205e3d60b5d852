"""Run directories for the page tests, made the way a real run makes them.

The training log comes from the stand-in miles (tests/standin_miles/train.py), and steps.jsonl,
result.yaml and verdict.json from launcher/results/evaluate.py itself, so the pages are tested on the files
the launcher really writes; the files the node would send back (timeline, plan, image, stack,
preflight) are written here in the shapes docs/architecture.md describes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from launcher.inputs.stack import expected_versions
from support.measure import SEED, START, run_standin, step_times_for_tps

SLUG = "qwen3-30b-a3b/h200/attune-tp1-pp1-ep8-mt16k"
IMAGE = "radixark/miles@sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca"
CLAIMED_TPS = 6913.23
CARD_STEP = step_times_for_tps(CLAIMED_TPS)  # 18.96 s


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def timeline(
    *, failed_stage: str | None = None, released: bool = True, steps_s: float = 420.0
) -> dict:
    """Stage times around the stand-in's log (which starts at START)."""
    acquired = START - 900.0
    plan = [
        ("preflight", 4.0),
        ("image", 380.0),
        ("preflight-gpu", 150.0),
        ("stack", 22.0),
        ("assets", 260.0),
        ("ray", 34.0),
        ("train", steps_s),
    ]
    t = acquired + 25.0
    stages = []
    for name, secs in plan:
        status = "failed" if name == failed_stage else "ok"
        stages.append({"name": name, "start": t, "end": t + secs, "status": status})
        t += secs + 1.0
        if status == "failed":
            break
    return {
        "acquired_at": acquired,
        "released_at": (t + 40.0) if released else None,
        "stages": stages,
    }


def stack_report(differ: str | None = None) -> dict:
    """stack.json as scripts/stack_probe.py writes it: every expectation of the seed, found."""
    raw = yaml.safe_load(SEED.read_text())
    checks = []
    for name, expected in expected_versions(raw["stack"]).items():
        value = expected + ("-other" if name == differ else "")
        if name.endswith("_commit"):
            value = (expected + "0123456789abcdef")[:40] if name != differ else "deadbeef"
        ok = name != differ
        checks.append(
            {
                "name": name,
                "expected": expected,
                "value": value,
                "ok": ok,
                "note": "" if ok else f"expected {expected}",
            }
        )
    return {"schema": 1, "policy": "fail", "ok": differ is None, "skipped": False, "checks": checks}


def preflight_report() -> dict:
    """preflight.json as scripts/preflight.py writes it (a few of its checks)."""
    return {
        "schema": 1,
        "ok": True,
        "duration_s": 3.2,
        "checks": [
            {"name": "gpu count", "value": 8, "expected": "8", "ok": True, "unit": None},
            {"name": "gpu model", "value": "NVIDIA H200", "expected": "H200", "ok": True},
            {
                "name": "efa devices",
                "value": 16,
                "expected": ">= 16",
                "ok": True,
                "unit": None,
            },
            {
                "name": "disk free",
                "value": 812.5,
                "expected": ">= 500",
                "ok": True,
                "unit": "GiB",
                "warning": "the cache is on the root volume",
            },
        ],
    }


def make_run(
    root: Path,
    name: str = "20261021T094500Z-abc123",
    *,
    measure: bool = True,
    reference: Path | None = None,
    stack_differs: str | None = None,
    state: str = "done",
    failed_stage: str | None = None,
    slug: str = SLUG,
    runs_root: Path | None = None,
    kind: str = "aws",
    **standin: Any,
) -> Path:
    """A run directory under root/runs/<slug>/<name> (or runs_root/<slug>/<name>), measured by
    launcher/results/evaluate.py.

    `kind`: the cluster kind run.json and plan.json record. `standin` goes to the stand-in miles
    (step_time_s, step_times, nan_at, cut_at, ...).
    """
    rd = (runs_root if runs_root is not None else root / "runs") / slug / name
    (rd / "logs").mkdir(parents=True)
    shutil.copyfile(SEED, rd / "recipe.yaml")
    run_standin(rd / "logs" / "train.log", steps=20, **standin)
    _write_json(rd / "timeline.json", timeline(failed_stage=failed_stage))
    _write_json(
        rd / "run.json",
        {"run_id": name, "slug": slug, "created_at": START - 930.0, "cluster": {"kind": kind}},
    )
    _write_json(
        rd / "status.json",
        {
            "state": state,
            "complete": state == "done",
            "updated_at": START + 1000.0,
            "detail": "the node script finished; logs collected"
            if state == "done"
            else f"stage {failed_stage} failed",
            "exit_code": 0 if state == "done" else 3,
        },
    )
    _write_json(
        rd / "plan.json",
        {
            "run_id": name,
            "recipe": {
                "path": str(SEED),
                "slug": slug,
                "sha256": hashlib.sha256(SEED.read_bytes()).hexdigest(),
            },
            "profile": {"name": f"{kind}-p5en", "kind": kind, "path": f"env/{kind}-p5en.yaml"},
            "image": IMAGE,
            "nodes": 1,
            "gpus_per_node": 8,
            "assets": {
                "hf_repo": "Qwen/Qwen3-30B-A3B",
                "hf_revision": "ad44e777bcd18fa416d9da3bd8f70d33ebb85d39",
                "parquet_sha256": "7ea7f5dca51f6be280e2f7cd7ee786ac05f546570e5ac1b07236c920338241fe",
            },
        },
    )
    _write_json(rd / "image.json", {"image": IMAGE, "digest": IMAGE.split("@", 1)[1]})
    _write_json(rd / "stack.json", stack_report(stack_differs))
    _write_json(rd / "preflight.json", preflight_report())
    if measure:
        from launcher.results.evaluate import measure_run_dir

        measure_run_dir(rd, write_plots=False, reference=reference)
    return rd


def set_verdict(rd: Path, status: str, **extra: Any) -> dict:
    """Rewrite verdict.json's status (the statuses the verdict may give beyond today's code)."""
    data = json.loads((rd / "verdict.json").read_text())
    data["status"] = status
    data.update(extra)
    _write_json(rd / "verdict.json", data)
    return data
