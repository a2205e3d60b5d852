"""A launched node's TTL against its estimated work (launcher/cost/ttl.py): a run the TTL would
end before its training ends is refused before any launch (or warned of, when only a fresh node
would outlast it); a nightly's recipes of one shape fill a node only while the node's estimate
fits its TTL, the rest on nodes of their own. The estimates are the dry run's (cost/estimate.py).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml
from support.measure import seed_raw
from support.operator_cli import SEED, RecordingEndpoint, aws_env, no_runs, run_piped

from launcher.cost.ttl import (
    TTL_SHARE,
    chunks_within_ttl,
    first_scenario,
    fits_what_is_left,
    node_hours,
)
from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.runner.nightly_groups import group_by_shape

PRICE_READ = "AWSPriceListService.GetProducts"  # read before the cost is shown


def _profile(tmp_path: Path, ttl_hours: float, name: str = "ttl") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"kind": "aws", "region": "us-east-1", "ttl_hours": ttl_hours}))
    return path


def _recipe(tmp_path: Path, runs: int, name: str) -> Path:
    raw = seed_raw()
    raw["result"]["runs"] = runs
    path = tmp_path / "recipes" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_run_even_a_warm_node_could_not_finish_before_its_ttl_is_refused_before_launch(
    tmp_path,
):
    seed = load_recipe(SEED)
    (shortest,) = node_hours(seed, "warm cache")
    profile = _profile(tmp_path, round(shortest * 0.5, 3))
    endpoint = RecordingEndpoint().start()
    try:
        runs = tmp_path / "runs"
        result = run_piped(
            [str(SEED), "--cluster", str(profile), "--runs-dir", str(runs), "--yes"],
            aws_env(endpoint, tmp_path),
        )
    finally:
        endpoint.stop()
    assert result.returncode == 2, result.stderr
    assert "ttl_hours" in result.stderr and f"({shortest:.2f} h)" in result.stderr
    assert "Nothing was launched" in result.stderr and "Traceback" not in result.stderr
    assert all(PRICE_READ in r for r in endpoint.requests), endpoint.requests  # no launch
    assert no_runs(runs)


@pytest.mark.parametrize("where", ["between", "above"])
def test_the_dry_run_says_what_the_ttl_would_do(tmp_path, where):
    seed = load_recipe(SEED)
    shortest, likely = node_hours(seed, "warm cache", "cold node")
    ttl = (shortest + likely) / 2 if where == "between" else likely * 2
    result = run_piped(
        [str(SEED), "--cluster", str(_profile(tmp_path, round(ttl, 3))), "--dry-run"],
        aws_env(None, tmp_path),
    )
    assert result.returncode == 0, result.stderr
    ttl_lines = [ln for ln in result.stdout.splitlines() if ln.startswith("# ttl ")]
    if where == "between":
        assert len(ttl_lines) == 1 and "WARNING" in ttl_lines[0], ttl_lines
        assert f"{likely:.2f} h on a fresh node" in ttl_lines[0]
    else:
        assert ttl_lines == []


def _chunk_hours(recipes, chunk, store) -> float:
    first, *rest = (recipes[i] for i in chunk)
    runs = lambda r: int(r.raw["result"].get("runs") or 1)  # noqa: E731
    return node_hours(first, first_scenario(store), runs=runs(first))[0] + sum(
        node_hours(r, "warm cache", runs=runs(r))[0] for r in rest
    )


@pytest.mark.parametrize("seed", range(6))
def test_every_node_of_a_night_fits_its_ttl_and_takes_as_many_recipes_as_fit(tmp_path, seed):
    rng = random.Random(seed)
    recipes = [
        load_recipe(_recipe(tmp_path, rng.randint(1, 4), f"r{i}")) for i in range(rng.randint(1, 9))
    ]
    ttl = rng.uniform(0.3, 3.0)
    store = rng.choice([None, "s3://bucket/p"])
    chunks = chunks_within_ttl(recipes, ttl, store=store)
    assert [i for c in chunks for i in c] == list(range(len(recipes)))  # all, in order, once
    budget = TTL_SHARE * ttl
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert len(a) == 1 or _chunk_hours(recipes, a, store) <= budget + 1e-9
        assert _chunk_hours(recipes, a + [b[0]], store) > budget  # the next did not fit
    assert len(chunks[-1]) == 1 or _chunk_hours(recipes, chunks[-1], store) <= budget + 1e-9


def test_a_nightly_too_long_for_one_node_gets_a_node_per_part(tmp_path):
    seed = load_recipe(SEED)
    two = sum(node_hours(seed, "cold node", "warm cache"))
    profile = load_profile(str(_profile(tmp_path, round(two / TTL_SHARE * 1.01, 3))))
    recipes = [_recipe(tmp_path, 1, f"r{i}") for i in range(5)]
    groups = group_by_shape(recipes, profile)
    assert [len(g.recipes) for g in groups] == [2, 2, 1]
    assert [g.recipes for g in groups] == [recipes[0:2], recipes[2:4], recipes[4:5]]
    assert all(g.node is not None for g in groups)
    assert "node 2 of 3" in groups[1].label and "ttl_hours" in groups[1].label
    roomy = load_profile(str(_profile(tmp_path, 100.0, "roomy")))
    assert [len(g.recipes) for g in group_by_shape(recipes, roomy)] == [5]


def test_what_a_held_nodes_ttl_has_left_is_weighed_against_the_next_recipe():
    seed = load_recipe(SEED)
    (need,) = node_hours(seed, "warm cache")
    assert fits_what_is_left(seed, 6.0, held_s=0.0) is None
    edge = (6.0 - need / TTL_SHARE) * 3600  # held this long, the recipe just fits
    assert fits_what_is_left(seed, 6.0, held_s=edge - 60) is None
    why = fits_what_is_left(seed, 6.0, held_s=edge + 60)
    assert why is not None and f"estimated at {need * 60:.0f} min" in why
    assert "in 0 min" in (fits_what_is_left(seed, 6.0, held_s=7 * 3600) or "")  # past it
