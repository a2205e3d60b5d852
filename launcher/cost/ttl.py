"""A launched node's TTL against the time its work is estimated to take.

Why: an instance `reproduce` launches ends itself ttl_hours after launch (the shutdown in its
user data: the guard against a leaked node). That guard must not end a run it was meant to
protect. A run of K measured runs, or a nightly of several recipes on one held node, can need
longer than the TTL; the TTL would then stop training halfway, and every GPU-hour until then is
paid for nothing. So, before anything is launched:

- one run (`reproduce RECIPE`): when even its shortest estimate (a node that kept its cache and
  image) is longer than the TTL, it is refused (exit 2) with both numbers; when only the likely
  estimate (a fresh node) is, the header warns;
- a nightly group (launcher/runner/nightly_groups.py): recipes are added to a node only while
  the node's estimated time, first recipe fresh and the next ones on the warm node, stays within
  TTL_SHARE of its TTL; the next recipe starts a node of its own. And before the held node is
  lent to its next recipe, what its TTL has left is checked against that recipe's estimate (the
  night may have run longer than estimated): when it does not fit, the node is released and the
  group's remaining recipes go to a new node (launcher/runner/nightly.py).

The estimates are launcher/cost/estimate.py's (the dry run's by-stage table): each figure names
its measurement or source there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from launcher.cost.estimate import estimate
from launcher.plan.claimruns import claimed_runs

if TYPE_CHECKING:
    from launcher.inputs.recipe import Recipe

# A held node takes recipes while the estimate stays within this share of its TTL: an estimate
# is an estimate, and a run the TTL cuts is a run paid for nothing.
TTL_SHARE = 0.8


def node_hours(recipe: Recipe, *scenarios: str, runs: int = 1) -> list[float]:
    """Hours one of the recipe's nodes is held in each of SCENARIOS ("cold node", "warm store",
    "warm cache"), with K measured runs: one estimate for them all."""
    est = estimate(recipe, fresh_instance=True, runs=runs)
    return [est.total(s) / max(1, recipe.gpu_count) for s in scenarios]


def first_scenario(store: str | None) -> str:
    """A fresh node's scenario: its assets from the store when there is one, else the Hub."""
    return "warm store" if store else "cold node"


def run_check(
    recipe: Recipe, ttl_hours: float, *, store: str | None, runs: int = 1
) -> tuple[str | None, str | None]:
    """(a warning for the header, a refusal) for one run on a node launched for it."""
    shortest, likely = node_hours(recipe, "warm cache", first_scenario(store), runs=runs)
    what = f"{runs} measured runs" if runs > 1 else "the run"
    if shortest > ttl_hours:
        return None, (
            f"the profile's ttl_hours ({ttl_hours:g} h) is shorter than {what} is estimated to "
            f"take even on a node that kept its cache and image ({shortest:.2f} h): the instance "
            "would end itself before training ends, and the GPU-hours until then would be paid "
            "for nothing. Nothing was launched. Raise ttl_hours in the profile (at most 168)"
            + (", or measure fewer runs (--runs)." if runs > 1 else ".")
        )
    if likely > ttl_hours:
        return (
            f"{what} is estimated at {likely:.2f} h on a fresh node, longer than ttl_hours "
            f"{ttl_hours:g} h: the instance may end itself before training ends (raise "
            "ttl_hours in the profile)"
        ), None
    return None, None


def chunks_within_ttl(
    recipes: Sequence[Recipe], ttl_hours: float, *, store: str | None
) -> list[list[int]]:
    """The recipes' indexes in consecutive chunks, one node each: the first of a chunk on a
    fresh node, the next ones on the node it left warm, each chunk's estimate within TTL_SHARE
    of the TTL (a recipe over it alone is a chunk alone: its own run refuses or warns)."""
    budget = TTL_SHARE * ttl_hours
    chunks: list[list[int]] = []
    used = 0.0
    for i, recipe in enumerate(recipes):
        runs = claimed_runs(recipe)  # a nightly measures the claim's N
        fresh, warm = node_hours(recipe, first_scenario(store), "warm cache", runs=runs)
        if chunks and used + warm <= budget:
            chunks[-1].append(i)
            used += warm
        else:
            chunks.append([i])
            used = fresh
    return chunks


def fits_what_is_left(recipe: Recipe, ttl_hours: float, held_s: float) -> str | None:
    """Before a held node is lent to its next recipe: None when the recipe's estimate on the warm
    node fits TTL_SHARE of what the node's TTL has left, else why not (the night ran longer
    than its estimate: the group's next recipes go to a node of their own)."""
    left = ttl_hours - held_s / 3600.0
    (need,) = node_hours(recipe, "warm cache", runs=claimed_runs(recipe))
    if need <= TTL_SHARE * left:
        return None
    return (
        f"its node ends itself at its TTL in {max(0.0, left) * 60:.0f} min (ttl_hours "
        f"{ttl_hours:g}, held {held_s / 60:.0f} min), and the next recipe is estimated at "
        f"{need * 60:.0f} min on it"
    )
