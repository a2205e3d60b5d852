"""Run directories and clock constants for the history tests (records/, runner/ nightly, pages/).

Shared here, not imported from another test module: a test file runs alone too.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import yaml

from launcher.inputs.recipe import load_recipe
from launcher.records.history import History, RunRow
from support.paths import SEED as SEED_FILE

SLUG = load_recipe(SEED_FILE).slug  # model/gpu/layout-<content hash>
T0 = 1_790_000_000.0
DAY = 86_400.0


def make_run_dir(
    root: Path,
    run_id: str,
    *,
    tps: float | None = 1000.0,
    verdict: str | None = "reproduced",
    claim: float = 1000.0,
    state: str = "done",
    started: float = T0,
    slug: str = SLUG,
    cluster: str = "aws",
    image: str = "ghcr.io/x/miles@sha256:" + "a" * 64,
) -> Path:
    """A finished run directory with the files the run path and measure_run_dir write."""
    d = root / slug / run_id
    (d / "logs").mkdir(parents=True)
    (d / "recipe.yaml").write_text("model: x\n")
    (d / "run.json").write_text(
        json.dumps(
            {
                "run_id": run_id,
                "slug": slug,
                "created_at": started - 5,
                "cluster": {"kind": cluster},
            }
        )
    )
    (d / "status.json").write_text(
        json.dumps(
            {
                "state": state,
                "complete": state == "done",
                "updated_at": started + 700,
                "detail": f"{state} detail",
            }
        )
    )
    (d / "plan.json").write_text(
        json.dumps(
            {
                "run_id": run_id,
                "recipe": {"slug": slug, "sha256": "f" * 64},
                "profile": {"name": cluster, "kind": cluster},
                "image": image,
            }
        )
    )
    (d / "timeline.json").write_text(
        json.dumps({"acquired_at": started, "released_at": started + 600, "stages": []})
    )
    if verdict is not None:
        diff = None if tps is None else 100.0 * (tps - claim) / claim
        (d / "verdict.json").write_text(
            json.dumps(
                {
                    "status": verdict,
                    "difference_percent": diff,
                    "reasons": [],
                    "claimed": {"tokens_per_s_per_gpu": claim},
                    "measured": {"tokens_per_s_per_gpu": tps},
                    "tolerance": {"slower_percent": 3.0, "faster_percent": 3.0},
                }
            )
        )
        (d / "result.yaml").write_text(
            yaml.safe_dump(
                {
                    "tokens_per_s_per_gpu": None if tps is None else round(tps, 2),
                    "usd_per_million_tokens": 0.32,
                    "step_time_cv_percent": 0.5,
                    "mfu": 0.1276,
                    "gpu_hours": 1.33,
                    "provenance": {
                        "unrounded": {
                            "tokens_per_s_per_gpu": tps,
                            "usd_per_million_tokens": 0.318,
                            "step_time_cv_percent": 0.51,
                            "mfu": 0.12757,
                            "gpu_hours": 1.3333,
                        }
                    },
                }
            )
        )
    return d


def damage(db: Path, rows: int = 300) -> Path:
    """A history whose schema still reads but whose runs table is garbage (issue 19): the
    pages after the schema overwritten, as a disk or a crashed copy leaves it."""
    with History(db) as hist:
        for i in range(rows):
            hist.insert(
                RunRow(
                    run_id=f"2026{i:04d}T000000Z-{i:06x}",
                    slug=SLUG,
                    cluster_name="local",
                    started_at=T0 + i,
                    state="done",
                    detail="x" * 200,
                )
            )
    con = sqlite3.connect(db)
    page = con.execute("pragma page_size").fetchone()[0]
    assert con.execute("select count(*) from sqlite_master").fetchone()[0] >= 3  # schema reads
    con.close()
    data = bytearray(db.read_bytes())
    data[4 * page : 11 * page] = b"\xff" * (7 * page)
    db.write_bytes(bytes(data))
    return db
