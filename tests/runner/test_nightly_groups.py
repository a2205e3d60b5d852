"""A nightly's recipes by node shape, and the estimate of a nightly of N recipes on one node.

The runs themselves (one launch, one release) are tests/runner/test_nightly_node.py; here the
two pure parts: which recipes may share a node (every launch setting equal, whatever the order
they are given in) and what N recipes on one node are expected to cost.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml
from support.aws import seed_on_nodes, write_profile
from support.measure import SEED

from launcher.cost.estimate import NIGHTLY_SIZES, estimate, nightly_lines, nightly_split
from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.runner.nightly_groups import group_by_shape

# what a recipe may vary that changes the node it needs (gpu.instance, node count)
INSTANCES = ("AWS p5en.48xlarge", "AWS p5e.48xlarge")
NODES = (1, 2)


def recipe_file(root: Path, name: str, instance: str, nodes: int) -> Path:
    raw = seed_on_nodes(nodes)
    raw["layout"]["label"] = name
    raw["gpu"]["instance"] = instance
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("seed", range(4))
def test_recipes_share_a_node_exactly_when_their_launch_is_the_same(tmp_path, seed):
    import random

    rng = random.Random(seed)
    profile = load_profile(str(write_profile(tmp_path, ami="ami-12345678", price_per_hour=63.0)))
    shapes = list(itertools.product(INSTANCES, NODES))
    picked = [rng.choice(shapes) for _ in range(7)]
    paths = [recipe_file(tmp_path, f"r{i}", *shape) for i, shape in enumerate(picked)]
    groups = group_by_shape(paths, profile)

    by_path = dict(zip(paths, picked, strict=True))
    assert sorted(p for g in groups for p in g.recipes) == sorted(paths)  # each once
    assert len(groups) == len(set(picked))  # one group (one node) per shape
    for g in groups:
        assert len({by_path[p] for p in g.recipes}) == 1  # never two shapes on a node
        assert g.recipes == [p for p in paths if by_path[p] == by_path[g.recipes[0]]]  # in order
        assert g.node is not None and g.node.recipes == len(g.recipes)
    firsts = [g.recipes[0] for g in groups]
    assert firsts == sorted(firsts, key=paths.index)  # groups in the order of first appearance
    assert len({g.label for g in groups}) == len(groups)


def test_a_profile_setting_the_recipe_cannot_launch_or_an_unreadable_recipe_runs_alone(tmp_path):
    profile = load_profile(str(write_profile(tmp_path, ami="ami-12345678", price_per_hour=63.0)))
    good = recipe_file(tmp_path, "good", INSTANCES[0], 1)
    broken = tmp_path / "broken.yaml"
    broken.write_text("schema_version: [not, a, recipe\n")
    groups = group_by_shape([broken, good, broken], profile)
    assert [(g.recipes, g.node is None) for g in groups] == [
        ([broken], True),
        ([good], False),
        ([broken], True),
    ]


@pytest.mark.parametrize("first", ["cold node", "warm store"])
def test_a_nightly_of_n_recipes_shares_the_provisioning_and_one_release(first):
    est = estimate(load_recipe(SEED), fresh_instance=True)
    one = nightly_split(est, 1, first)
    assert one["total"] == pytest.approx(est.total(first))  # one recipe: a single run
    cold, kept = est.gpu_hours(first), est.gpu_hours("warm cache")
    assert one["shared"] == pytest.approx(
        cold["acquire"] - kept["acquire"] + cold["release"] - kept["release"]
    )
    assert one["shared"] > 0
    per = []
    for n in range(1, 9):
        x = nightly_split(est, n, first)
        assert x["total"] == pytest.approx(x["shared"] + x["first"] + (n - 1) * x["each_next"])
        assert x["each_next"] == pytest.approx(est.total("warm cache"))
        per.append(x["per_recipe"])
    assert all(a > b for a, b in itertools.pairwise(per))  # the more recipes, the less each


def test_the_dry_run_shows_the_nightly_split_only_where_a_node_is_launched():
    recipe = load_recipe(SEED)
    [line] = nightly_lines(recipe, fresh_instance=True, store=None)
    for n in NIGHTLY_SIZES:
        assert f"N={n}: " in line
    assert "cold node first" in line
    assert "warm store first" in nightly_lines(recipe, fresh_instance=True, store="s3://b/p")[0]
    assert nightly_lines(recipe, fresh_instance=False, store=None) == []


def test_a_backend_that_launches_nothing_shares_nothing(tmp_path):
    """local (ssh, ray): the nodes are there already; each run acquires them itself."""
    paths = [recipe_file(tmp_path, n, INSTANCES[0], 1) for n in ("a", "b")]
    groups = group_by_shape(paths, load_profile("local"))
    assert [(g.recipes, g.node) for g in groups] == [([paths[0]], None), ([paths[1]], None)]


@pytest.mark.parametrize(
    ("acquired_at", "own_s"),
    [
        (100.0, 70.0),  # the run's clock started at the acquire (aws): its provisioning is shared
        (140.0, 60.0),  # it started after the allocation was granted (a slurm step): all its own
        (120.0, 70.0),  # started mid-provisioning: only the overlap is shared
    ],
)
def test_the_holders_own_time_loses_only_the_provisioning_inside_it(tmp_path, acquired_at, own_s):
    from launcher.runner.held import HeldNode
    from launcher.runner.nightly_groups import Group, Ran, split

    holder = tmp_path / "first"
    holder.mkdir()
    (holder / "timeline.json").write_text(
        json.dumps({"acquired_at": acquired_at, "released_at": 200.0, "stages": []})
    )
    node = HeldNode("slurm 8 GPUs x1", 1)
    node.holder, node.acquire_started, node.acquire_s, node.released_at = holder, 100.0, 30.0, 210.0
    group = Group("g", [holder], gpus=8, node=node, runs=[Ran("r1", "s", holder)])
    hours = split(group)
    assert hours is not None
    assert hours["r1"] == pytest.approx(8 * own_s / 3600)
    assert hours["held"] == pytest.approx(8 * 110 / 3600)
    assert hours["shared"] == pytest.approx(hours["held"] - hours["r1"])
