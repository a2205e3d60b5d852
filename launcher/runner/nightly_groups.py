"""A nightly's recipes by node shape, and where each group's GPU-hours went.

Recipes whose nodes would be the same (clusters.node_shape: the profile's kind and the recipe's
node count, and for aws every launch setting: instance type, region, capacity type, AMI...) run
one after another on one node (launcher/runner/held.py); recipes of another shape get a group and
a node of their own. A recipe that cannot be read, or that the profile could not launch, is a
group alone without a node: its run refuses it as `reproduce RECIPE` would, and it costs nothing.
On slurm the group's node is an allocation, each recipe one job step of it. A recipe alone is
every recipe on a backend that launches nothing (local, ssh, ray: node_shape None): its
nodes are there already, each run acquires them as a single run does. A launched node ends
itself at its TTL, so a group takes recipes only while their estimated time fits it
(launcher/cost/ttl.py): a night too long for one node gets several, one after another.

The split: each recipe is charged its own run (its timeline, acquired_at to released_at, as for
any run) less the provisioning, which the group's first run waited for and which is the group's;
what the node was held beyond the recipes' own time (provisioning, the moments between two runs,
the one release) is shown as shared, once, and what it comes to per recipe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import ReproduceError
from launcher.judge.timeline import RunTimeline
from launcher.records import jsonread
from launcher.runner.held import HeldNode

if TYPE_CHECKING:
    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe
    from launcher.pages import NodeGroupView


@dataclass(frozen=True)
class Ran:
    """One run of the group, as the split needs it."""

    run_id: str
    slug: str
    run_dir: Path | None  # None: no run directory (refused, or not run)


@dataclass
class Group:
    """Recipes of one node shape, in the order given; `node` None: each runs alone (unreadable)."""

    label: str
    recipes: list[Path]
    gpus: int = 0
    node: HeldNode | None = None
    runs: list[Ran] = field(default_factory=list)


def group_by_shape(recipes: Sequence[Path], profile: Profile) -> list[Group]:
    """Groups in the order of their first recipe; within a group, the recipes' order. On a
    profile that launches its nodes, a group takes recipes only while its node's estimated time
    stays within its TTL (launcher/cost/ttl.py); the rest start a node of their own."""
    from launcher import clusters
    from launcher.inputs.recipe import load_recipe

    groups: dict[str, Group] = {}
    loaded: dict[str, list[Recipe]] = {}
    order: list[tuple[Group, str | None]] = []  # a key: a group of one shape, with a node
    for path in recipes:
        try:
            recipe = load_recipe(path)
            key = clusters.node_shape(recipe, profile)
        except ReproduceError:  # refused by its own run, with the whole reason
            key = None
        if key is None:
            order.append((Group(path.name, [path]), None))  # alone, without a node
            continue
        if key not in groups:
            what = recipe.instance_type or f"{recipe.gpus_per_node} GPUs"
            label = f"{profile.kind} {what} x{recipe.nodes}"
            taken = {g.label for g in groups.values()}
            if label in taken:  # same type and count, other settings (region, capacity...)
                label = f"{label} #{len(groups) + 1}"
            groups[key] = Group(label, [], gpus=recipe.gpu_count)
            loaded[key] = []
            order.append((groups[key], key))
        groups[key].recipes.append(path)
        loaded[key].append(recipe)
    out: list[Group] = []
    for group, key in order:
        if key is None:
            out.append(group)
            continue
        for part in _within_ttl(group, loaded[key], profile):
            part.node = HeldNode(part.label, len(part.recipes), part.recipes)
            out.append(part)
    return out


def _within_ttl(group: Group, recipes: list[Recipe], profile: Profile) -> list[Group]:
    """The group as nodes whose estimated time fits their TTL (one part when it all fits, or
    when the profile launches nothing and so sets no TTL)."""
    from launcher.cost.costgate import launches
    from launcher.cost.ttl import TTL_SHARE, chunks_within_ttl
    from launcher.inputs.profile import AwsProfile

    if not isinstance(profile, AwsProfile) or not launches(profile):
        return [group]
    chunks = chunks_within_ttl(recipes, profile.ttl_hours, store=profile.assets.store)
    if len(chunks) == 1:
        return [group]
    return [
        Group(
            f"{group.label} (node {n} of {len(chunks)}: {TTL_SHARE:.0%} of ttl_hours "
            f"{profile.ttl_hours:g} each)",
            [group.recipes[i] for i in chunk],
            gpus=group.gpus,
        )
        for n, chunk in enumerate(chunks, start=1)
    ]


def _timeline(run_dir: Path | None) -> RunTimeline:
    if run_dir is None:
        return RunTimeline()
    try:
        data = jsonread.load_file(run_dir / "timeline.json")  # bounded: the node's times
    except jsonread.NodeJSONError:
        return RunTimeline()
    return RunTimeline.of(data) if isinstance(data, dict) else RunTimeline()


def _held_s(timeline: RunTimeline) -> float | None:
    a, r = timeline.acquired_at, timeline.released_at
    if a is not None and r is not None and r >= a:
        return r - a
    return None


def _provisioning_in(timeline: RunTimeline, node: HeldNode) -> float:
    """The part of the holder's own time that was the group's provisioning (shared): its run's
    clock may start at the acquire (aws) or only where a scheduler started it (slurm: the job
    step, after the allocation was granted), so only the overlap is taken out."""
    if node.acquire_started is None or node.acquire_s is None or timeline.acquired_at is None:
        return node.acquire_s or 0.0
    acquired = node.acquire_started + node.acquire_s
    return max(0.0, acquired - max(timeline.acquired_at, node.acquire_started))


def split(group: Group) -> dict[str, float] | None:
    """GPU-hours of a group's node: `held` (acquire started to release ended), each recipe's own
    (by run id), `shared` (held less the recipes' own) and `per_recipe` (shared / recipes run).
    None when the node was never acquired or not released."""
    node = group.node
    if node is None or node.acquire_started is None or node.released_at is None:
        return None
    gpus = group.gpus
    out: dict[str, float] = {"held": gpus * (node.released_at - node.acquire_started) / 3600.0}
    own_total = 0.0
    ran = 0
    for one in group.runs:
        seconds = _held_s(_timeline(one.run_dir))
        if seconds is None:
            continue
        if one.run_dir is not None and one.run_dir == node.holder:
            seconds = max(0.0, seconds - _provisioning_in(_timeline(one.run_dir), node))
        own = gpus * seconds / 3600.0
        out[one.run_id] = own
        own_total += own
        ran += 1
    out["shared"] = max(0.0, out["held"] - own_total)
    out["per_recipe"] = out["shared"] / ran if ran else out["shared"]
    return out


def group_lines(group: Group) -> list[str]:
    """The group's part of the nightly summary (plain lines, markdown-safe)."""
    node = group.node
    if node is None:
        return []
    lines = [f"node group {group.label}: {len(group.recipes)} recipe(s) on one node"]
    if node.acquire_s is None:
        lines.append("  no node was acquired" + (f" ({node.broken})" if node.broken else ""))
    else:
        released = (
            f"released once in {node.released_at - node.release_started:.0f} s"
            if node.released_at is not None and node.release_started is not None
            else f"NOT released: {node.release_error}"
        )
        lines.append(
            f"  acquired once in {node.acquire_s:.0f} s (held by {node.holder}); {released}"
        )
    if node.broken and node.acquire_s is not None:
        lines.append(f"  the group ended early: {node.broken}")
    hours = split(group)
    if hours is not None:
        own = ", ".join(f"{r.slug} {hours[r.run_id]:.3f}" for r in group.runs if r.run_id in hours)
        lines.append(
            f"  GPU-hours: held {hours['held']:.3f} = own stages ({own or 'none'}) + shared "
            f"{hours['shared']:.3f} (provisioning, between runs, release; "
            f"{hours['per_recipe']:.3f} per recipe run)"
        )
    return lines


def view(group: Group) -> NodeGroupView | None:
    """The group as the nightly page shows it (None: its recipe ran alone, without a node)."""
    from launcher.pages import NodeGroupView

    if group.node is None:
        return None
    hours = split(group) or {}
    return NodeGroupView(
        label=group.label,
        run_ids=[r.run_id for r in group.runs],
        lines=group_lines(group),
        held_gpu_hours=hours.get("held"),
        shared_gpu_hours=hours.get("shared"),
        own={r.run_id: hours[r.run_id] for r in group.runs if r.run_id in hours},
    )
