"""A verdict says how strong its evidence is, on every surface that shows it (docs/measurement.md,
"Assurance levels"; launcher/judge/assurance.py decides, launcher/clusters/trust.py supplies
whether the run's cluster vouched for itself).

The adversary: one run directory of each kind of evidence (a host-verified run, a log-only one,
a Ray run whose cluster vouched for itself, a verdict of an older launcher with no level), each
read back through every surface that shows a verdict: verdict.json, `measure`'s summary, report.md,
the history row and `history` (text and --json), nightly's summary table, the run page, the
history page, and `compare`. On each, a "reproduced" never stands without its level beside it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.measure import REPO, run_standin, seed_raw

from launcher.judge.assurance import (
    CLUSTER_VOUCHED,
    HOST_VERIFIED,
    LEVELS,
    LOG_ONLY,
    decide,
    shown,
    weakest,
)
from launcher.records.history_rows import row_from_run_dir
from launcher.results.evaluate import measure_run_dir


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_level_is_decided_from_the_checks_that_ran_and_the_clusters_word():
    both = ["the host's clock: steps 5-19 ...", "the GPUs at work: the host's samples ..."]
    assert decide(both, vouched=False).level == HOST_VERIFIED
    assert decide(both[:1], vouched=False).level == LOG_ONLY
    assert decide([], vouched=False).level == LOG_ONLY
    assert decide(both, vouched=True).level == CLUSTER_VOUCHED
    levels = [decide(both, vouched=False), decide([], vouched=False)]
    assert weakest(levels) == levels[1]
    assert weakest([levels[0], None]) is None
    assert shown("reproduced", None) == "reproduced (assurance not recorded)"
    assert LEVELS == (HOST_VERIFIED, LOG_ONLY, CLUSTER_VOUCHED)


def make_run(root: Path, name: str, kind: str) -> Path:
    d = root / name
    raw = seed_raw()
    run_standin(d / "logs" / "train.log", 20, raw=raw)
    d.joinpath("run.json").write_text(
        json.dumps({"run_id": name, "cluster": {"kind": kind, "name": kind}})
    )
    d.joinpath("recipe.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    d.joinpath("status.json").write_text(json.dumps({"state": "done"}))
    return d


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("assurance")
    out = {"local": make_run(root, "local-run", "local"), "ray": make_run(root, "ray-run", "ray")}
    for d in out.values():
        measure_run_dir(d, write_page=True)
    return out


@pytest.mark.parametrize(("kind", "level"), [("local", LOG_ONLY), ("ray", CLUSTER_VOUCHED)])
def test_every_surface_shows_the_level_beside_the_verdict(runs, kind, level):
    d = runs[kind]
    verdict = json.loads((d / "verdict.json").read_text())
    assert verdict["status"] == "reproduced"
    assert verdict["assurance"]["level"] == level
    assert f"Assurance: {level}:" in (d / "report.md").read_text()
    assert f'data-assurance="{level}"' in (d / "report.html").read_text()
    row = row_from_run_dir(d)
    assert row.assurance == level
    summary = cli("measure", d)
    assert f"assurance: {level}:" in summary.stdout, summary.stdout


def test_history_and_nightly_never_show_reproduced_alone(runs, tmp_path):
    from launcher.pages.report import history_report
    from launcher.records.history import History
    from launcher.runner.nightly import summary_text

    db = tmp_path / "history.sqlite"
    with History(db) as hist:
        for d in runs.values():
            hist.insert(row_from_run_dir(d))
    rows = [row_from_run_dir(d) for d in runs.values()]
    text = history_report(rows[0].slug, rows, None)
    assert f"reproduced ({LOG_ONLY})" in text and f"reproduced ({CLUSTER_VOUCHED})" in text
    assert "reproduced " not in text.replace(f"reproduced ({LOG_ONLY})", "").replace(
        f"reproduced ({CLUSTER_VOUCHED})", ""
    )
    listed = cli("history", "--history", db, rows[0].slug, "--json")
    levels = {r["run_id"]: r["assurance"] for r in json.loads(listed.stdout)["runs"]}
    assert levels == {"local-run": LOG_ONLY, "ray-run": CLUSTER_VOUCHED}, listed.stdout
    plain = cli("history", "--history", db, rows[0].slug)
    assert f"reproduced ({CLUSTER_VOUCHED})" in plain.stdout, plain.stdout

    from launcher.records.history import check_regression
    from launcher.runner.nightly import NightlyEntry, RecipeRun

    entries = [
        NightlyEntry(
            Path("r.yaml"), RecipeRun(Path("r.yaml"), 0), row, check_regression(row, []), "ok"
        )
        for row in rows
    ]
    table = summary_text(entries)
    assert f"reproduced ({LOG_ONLY})" in table and f"reproduced ({CLUSTER_VOUCHED})" in table


def test_compare_shows_both_runs_figures_and_verdicts_above_the_loss_check(runs, tmp_path):
    proc = cli("compare", runs["local"], runs["ray"], "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)["runs"]
    assert data["candidate"]["assurance"] == LOG_ONLY
    assert data["reference"]["assurance"] == CLUSTER_VOUCHED
    assert data["candidate"]["figures"]["tokens_per_s_per_gpu"] == pytest.approx(6913.23, 1e-3)
    text = cli("compare", runs["local"], runs["ray"]).stdout
    head, _, rest = text.partition("convergence:")
    assert "tokens/s per GPU" in head and "$ per 1M tokens" in head and "GPU-hours" in head
    assert f"reproduced ({CLUSTER_VOUCHED})" in head and "MFU" in head
    # a bare log beside a run directory is measured against its recipe: log only, by nature
    bare = cli("compare", runs["local"] / "logs" / "train.log", runs["ray"], "--json")
    side = json.loads(bare.stdout)["runs"]["candidate"]
    assert side["verdict"] == "reproduced" and side["assurance"] == LOG_ONLY
