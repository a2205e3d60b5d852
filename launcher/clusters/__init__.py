"""The cluster backends, by kind: the one place that maps a profile's `kind` to its code.

A new run gets its cluster from the Plan (`from_plan`); `reproduce attach`/`cancel` get the
cluster of a recorded run from run.json (`from_record`). Both go through `BACKENDS`, so a kind
is added in one line here plus its module, which exposes

    from_plan(plan: Plan, options: LaunchOptions, run_dir: Path) -> Cluster
    from_record(record: Mapping[str, Any][, run_dir: Path]) -> Cluster

Modules are imported only when a run needs them: the dry run never loads boto3 or paramiko.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from launcher.errors import BadInput

if TYPE_CHECKING:
    from launcher.clusters.base import Cluster, LaunchOptions
    from launcher.inputs.profile import Profile
    from launcher.plan.plan import Plan

BACKENDS: dict[str, str] = {
    "local": "launcher.clusters.local",
    "ssh": "launcher.clusters.ssh",
    "aws": "launcher.clusters.aws",
    "ray": "launcher.clusters.ray.cluster",
    "slurm": "launcher.clusters.slurm",
}
# Kinds a real run refuses although the dry run can show their plan (kind -> why).
DRY_RUN_ONLY: dict[str, str] = {}
# Kinds whose real runs may span several nodes (a multi-node recipe is refused on the others).
# ray: the recipe's nodes are the cluster's, and the job checks it has them before training.
# aws: the launch makes all the recipe's nodes at once (one placement group) or none.
# slurm: one job holds all the recipe's nodes at once, or none.
MULTI_NODE_KINDS: frozenset[str] = frozenset({"ssh", "ray", "aws", "slurm"})


def backend(kind: str) -> ModuleType:
    """The module of a cluster kind; BadInput for a kind this launcher cannot run."""
    if kind in DRY_RUN_ONLY:
        raise BadInput(
            f"profiles of kind {kind} are dry-run only in this version ({DRY_RUN_ONLY[kind]}); "
            "use --dry-run to see what it would do."
        )
    path = BACKENDS.get(kind)
    if path is None:
        raise BadInput(
            f"cluster kind {kind!r} is not one this launcher has ({', '.join(BACKENDS)})"
        )
    return import_module(path)


def check_ready(profile: Profile) -> None:
    """What a backend can check on this machine before a run directory exists (credentials, a
    region): BadInput when a run could not start, so a refusal leaves nothing behind. Optional:
    a backend module without `check_ready(profile)` needs nothing checked. No cloud call."""
    check = getattr(backend(profile.kind), "check_ready", None)
    if check is not None:
        check(profile)


def check_fits(recipe: Any, profile: Profile) -> None:
    """What a backend can ask its cluster about the recipe before a run directory exists and
    anything is submitted (slurm: the partition has the recipe's nodes and GPUs per node, by
    sinfo): BadInput when it cannot hold the recipe. Optional: a backend without
    `check_fits(recipe, profile)` checks this when it acquires."""
    check = getattr(backend(profile.kind), "check_fits", None)
    if check is not None:
        check(recipe, profile)


def live_price(recipe: Any, profile: Profile, fallback: Any) -> tuple[Any, str | None]:
    """The node's price looked up where the backend can (aws: AWS's own prices), and why the
    fallback (the catalog's price, or None) was kept when it could not. Optional: a backend
    without `live_price(recipe, profile, fallback)` keeps the fallback, silently."""
    look = getattr(backend(profile.kind), "live_price", None)
    if look is None:
        return fallback, None
    found: tuple[Any, str | None] = look(recipe, profile, fallback)
    return found


def node_shape(recipe: Any, profile: Profile) -> str | None:
    """What a node launched for this recipe is (`reproduce nightly` lends one node to every
    recipe of the same shape): the profile's kind, the recipe's node count and whatever else the
    backend launches differently (aws: every launch setting, instance type, region, capacity).
    None for a backend without `node_shape(recipe, profile)`: it launches nothing (local, ssh,
    ray: its nodes are there already, acquired by each run at no cost), so nothing is shared."""
    shape = getattr(backend(profile.kind), "node_shape", None)
    if shape is None:
        return None
    return f"{profile.kind} x{recipe.nodes} {shape(recipe, profile)}"


def from_plan(plan: Plan, options: LaunchOptions, run_dir: Path) -> Cluster:
    """The cluster a new run acquires its nodes from (the profile's kind decides)."""
    module = backend(plan.profile.kind)
    make = getattr(module, "from_plan", None)
    if make is None:
        raise BadInput(f"cluster kind {plan.profile.kind!r} cannot start runs (no from_plan)")
    cluster: Cluster = make(plan, options, run_dir)
    return cluster


def from_record(record: Mapping[str, Any], run_dir: Path | None = None) -> Cluster:
    """The cluster of a recorded run (run.json's `cluster`): it reaches and releases its nodes.

    `run_dir` (absolute) is the run directory the record is read from: a backend whose
    `from_record` takes it reads the paths its record holds against it, never against the
    directory the command runs in."""
    kind = record.get("kind")
    if not isinstance(kind, str) or kind not in BACKENDS:
        raise BadInput(f"run.json names no cluster kind this launcher has ({kind!r})")
    module = backend(kind)
    if not hasattr(module, "from_record"):
        raise BadInput(f"cluster kind {kind!r} cannot be reattached (no from_record)")
    import inspect

    if run_dir is not None and "run_dir" in inspect.signature(module.from_record).parameters:
        made: Cluster = module.from_record(record, run_dir=Path(run_dir).absolute())
        return made
    cluster: Cluster = module.from_record(record)
    return cluster


def to_record(cluster: Cluster) -> dict[str, Any]:
    """What run.json keeps so that `from_record` finds the cluster again (no secrets)."""
    make = getattr(cluster, "to_record", None)
    record: dict[str, Any] = make() if callable(make) else {"kind": cluster.name}
    return record
