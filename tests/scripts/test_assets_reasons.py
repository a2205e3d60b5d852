"""Every reason resolve gives reaches the person whole (scripts/asset_resolve.py `reason`).

The launcher bounds each line it quotes from a node (launcher/excerpt.py cuts a long line in the
middle). A reason that put a path on the same line as a revision or a hash lost the fact that
tells two snapshots apart whenever the path was long (a CI worker's tmp path was). The adversary
here is a cache and a store under a path of several hundred characters, each way resolve can
refuse; whatever the way, every revision and hash the node's plan names is in what the user is
shown, uncut.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.assets import OTHER_REV, plant_other_snapshot, tiny_recipe_raw
from support.node_assets import make_spec, resolve
from support.node_scripts import load_script

from launcher.records.rundir import Files, RunDir
from launcher.runner.outcome import check_detail

spec_mod = load_script("asset_spec")
HEX = re.compile(r"\b[0-9a-f]{40}(?:[0-9a-f]{24})?\b")  # a commit or a sha256


def _asset(spec: Path, name: str) -> dict:
    return next(a for a in json.loads(spec.read_text())["assets"] if a["name"] == name)


def cache_holds_another_revision(spec: Path, store: Path) -> None:
    plant_other_snapshot(Path(_asset(spec, "hf_ckpt")["path"]))


def cached_rows_differ_from_the_pin(spec: Path, store: Path) -> None:
    rows = Path(_asset(spec, "rows")["path"])
    rows.parent.mkdir(parents=True)
    rows.write_bytes(b"PAR1 other rows PAR1")


def store_holds_another_snapshot_under_the_key(spec: Path, store: Path) -> None:
    plant_other_snapshot(store / spec_mod.store_key(_asset(spec, "hf_ckpt")))


@pytest.mark.parametrize(
    "plant",
    [
        cache_holds_another_revision,
        cached_rows_differ_from_the_pin,
        store_holds_another_snapshot_under_the_key,
    ],
)
def test_every_revision_and_hash_a_refusal_names_is_shown_whole_under_a_long_path(
    tiny, tmp_path, monkeypatch, plant
):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # only the cache and the store
    deep = tmp_path.joinpath(*(c * 120 for c in "abc"))  # a path longer than a quoted line
    store = deep / "store"
    store.mkdir(parents=True)
    spec = make_spec(deep, tiny_recipe_raw(*tiny), store=str(store))
    plant(spec, store)
    plan, proc = resolve(spec, ok=False)
    assert proc.returncode in (1, 3), proc.stderr
    lines = [ln for p in plan["problems"] for ln in p.splitlines()]
    assert any(OTHER_REV in ln or re.search(r"\b[0-9a-f]{64}\b", ln) for ln in lines), lines
    where = tmp_path / "logs"
    where.mkdir()
    (where / Files.ASSET_PLAN).write_text(json.dumps(plan))
    head, *shown = (check_detail(RunDir(tmp_path), "resolve", where) or "").splitlines()
    assert head == "the run's assets cannot all be supplied:"
    if shown[-1].startswith("  [... "):  # lines left out whole are counted, and named
        assert f"more lines in {Files.ASSET_PLAN}" in shown.pop()
    assert len(shown) <= len(lines)
    for said, quoted in zip(lines[: len(shown)], shown, strict=True):  # no fact cut in a line
        assert set(HEX.findall(said)) <= set(HEX.findall(quoted)), (said, quoted)
    assert any("characters left out" in q for q in shown)  # the path was long enough to be cut
