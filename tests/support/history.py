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
from support.pages import SLUG as PAGE_SLUG  # the page tests' run dirs (support/pages.py)
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
    assurance: str | None = "host-verified",
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
                    "assurance": {"level": assurance, "why": "test"} if assurance else None,
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


CLAIM = 6913.23


def row(i: int, tps: float | None, verdict: str | None, cluster: str = "aws-p5en") -> RunRow:
    """Night i's row of the seed's history: its throughput against CLAIM, and what follows."""
    diff = None if tps is None else 100 * (tps - CLAIM) / CLAIM
    return RunRow(
        run_id=f"2026{i:04d}T000000Z-{i:06x}",
        slug=PAGE_SLUG,
        cluster_name=cluster,
        started_at=T0 + i * DAY,
        state="done" if verdict != "failed" else "failed",
        verdict=verdict,
        difference_percent=diff,
        claimed_tokens_per_s_per_gpu=CLAIM,
        tolerance_percent=3.0,
        tokens_per_s_per_gpu=tps,
        mfu=None if tps is None else tps * 6 * 3_041_656_832 / 989e12,
        usd_per_million_tokens=None if tps is None else 63.296 / (tps * 8 * 3600 / 1e6),
        gpu_hours=1.3,
    )


def history_rows() -> list[RunRow]:
    """Twelve nightly runs: steady, one failed, two misses in a row (9: suspect, 10: the
    regression), then back."""
    tps = [6905, 6921, 6899, 6930, 6910, None, 6915, 6902, 6924, 6512, 6490, 6918]
    return [
        row(i, t, "failed" if t is None else ("slower" if t < 6700 else "reproduced"))
        for i, t in enumerate(tps)
    ]
