"""The cluster backends, by kind: the one place that maps a profile's `kind` to its code.

A new run gets its cluster from the Plan (`from_plan`); `reproduce attach`/`cancel` get the
cluster of a recorded run from run.json (`from_record`). Both go through `BACKENDS`, so a kind
is added in one line here plus its module, whose `BACKEND` is a `contract.Backend`: its
`from_plan` and `from_record`, and the optional capabilities it declares (`WithReadyCheck`,
`WithLivePrice`, `WithNodeShape`, `WithMultiNode`, `WithJobTimeLimit`, `WithOwnedNodes`), which
the functions below ask for by isinstance.

Modules are imported only when a run needs them: the dry run never loads boto3 or paramiko.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.errors import BadInput

if TYPE_CHECKING:
    from datetime import datetime

    from launcher.catalog import Price
    from launcher.clusters.base import Cluster, LaunchOptions
    from launcher.clusters.contract import Backend
    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe
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


def backend(kind: str) -> Backend:
    """The backend of a cluster kind; BadInput for a kind this launcher cannot run."""
    if kind in DRY_RUN_ONLY:
        raise BadInput(
            f"profiles of kind {kind} are dry-run only in this version ({DRY_RUN_ONLY[kind]}); "
            "use --dry-run to see what it would do."
        )
    return declared(kind)


def declared(kind: str) -> Backend:
    """The backend of a cluster kind, a dry-run-only one included: what it declares, asked by
    the dry run as by a real run."""
    from launcher.clusters.contract import Backend

    path = BACKENDS.get(kind)
    if path is None:
        raise BadInput(
            f"cluster kind {kind!r} is not one this launcher has ({', '.join(BACKENDS)})"
        )
    found = import_module(path).BACKEND
    if not isinstance(found, Backend):
        raise BadInput(f"cluster kind {kind!r}: {path} holds no BACKEND (a contract.Backend)")
    if not isinstance(getattr(type(found), "record_fields", None), Mapping):
        raise TypeError(f"cluster kind {kind!r}: its Backend declares no record_fields")
    return found


def check_ready(profile: Profile) -> None:
    """What a backend can check on this machine before a run directory exists (credentials, a
    region): BadInput when a run could not start, so a refusal leaves nothing behind. A backend
    that does not declare `WithReadyCheck` needs nothing checked. No cloud call."""
    from launcher.clusters.contract import WithReadyCheck

    found = backend(profile.kind)
    if isinstance(found, WithReadyCheck):
        found.check_ready(profile)


def check_fits(recipe: Recipe, profile: Profile) -> None:
    """What a backend can ask its cluster about the recipe before a run directory exists and
    anything is submitted (slurm: the partition has the recipe's nodes and GPUs per node, by
    sinfo): BadInput when it cannot hold the recipe. A backend that does not declare
    `WithFitCheck` checks this when it acquires."""
    from launcher.clusters.contract import WithFitCheck

    found = backend(profile.kind)
    if isinstance(found, WithFitCheck):
        found.check_fits(recipe, profile)


def live_price(
    recipe: Recipe, profile: Profile, fallback: Price | None
) -> tuple[Price | None, str | None]:
    """The node's price looked up where the backend can (aws: AWS's own prices), and why the
    fallback (the catalog's price, or None) was kept when it could not. A backend that does not
    declare `WithLivePrice` keeps the fallback, silently."""
    from launcher.clusters.contract import WithLivePrice

    found = backend(profile.kind)
    if not isinstance(found, WithLivePrice):
        return fallback, None
    return found.live_price(recipe, profile, fallback)


def node_shape(recipe: Recipe, profile: Profile) -> str | None:
    """What a node launched for this recipe is (`reproduce nightly` lends one node to every
    recipe of the same shape): the profile's kind, the recipe's node count and whatever else the
    backend launches differently (aws: every launch setting, instance type, region, capacity).
    None for a backend that does not declare `WithNodeShape`: it launches nothing (local, ssh,
    ray: its nodes are there already, acquired by each run at no cost), so nothing is shared."""
    from launcher.clusters.contract import WithNodeShape

    found = backend(profile.kind)
    if not isinstance(found, WithNodeShape):
        return None
    return f"{profile.kind} x{recipe.nodes} {found.node_shape(recipe, profile)}"


def multi_node(kind: str) -> bool:
    """Whether a real run of this kind may span several nodes (the backend declares
    `WithMultiNode`); a multi-node recipe is refused on the others before anything starts."""
    from launcher.clusters.contract import WithMultiNode

    return isinstance(declared(kind), WithMultiNode)


def multi_node_kinds() -> list[str]:
    """The kinds that declare `WithMultiNode`, sorted: what a refusal names instead."""
    return sorted(k for k in BACKENDS if k not in DRY_RUN_ONLY and multi_node(k))


def with_time_limit(
    recipe: Recipe,
    profile: Profile,
    max_hours: float | None,
    max_usd: float | None,
    price: float | None,
) -> Profile:
    """The profile whose job carries the run's budget as its time limit, where the backend
    declares `WithJobTimeLimit` (slurm); the profile as it is elsewhere."""
    from launcher.clusters.contract import WithJobTimeLimit

    found = declared(profile.kind)
    if not isinstance(found, WithJobTimeLimit):
        return profile
    return found.with_time_limit(recipe, profile, max_hours, max_usd, price)


def provisioning(
    recipe: Recipe, profile: Profile, run_id: str, *, owner: str, now: datetime, keep: bool
) -> tuple[Any, ...]:
    """The launch requests the plan carries (`WithProvisioning`); none for a kind whose nodes
    are there already."""
    from launcher.clusters.contract import WithProvisioning

    found = declared(profile.kind)
    if not isinstance(found, WithProvisioning):
        return ()
    return found.provisioning(recipe, profile, run_id, owner=owner, now=now, keep=keep)


def target_instance(profile: Profile, instance_id: str, given: str) -> Profile:
    """--instance-id: the profile of a run on that existing machine; BadInput for a kind that
    launches nothing (`given`: the --cluster the user gave)."""
    from launcher.clusters.contract import WithProvisioning

    found = declared(profile.kind)
    if not isinstance(found, WithProvisioning):
        raise BadInput(
            f"--instance-id targets an instance a kind launches, but --cluster {given} is of "
            f"kind {profile.kind}, which launches none."
        )
    return found.target_instance(profile, instance_id)


def dry_run_section(plan: Plan, price: Price | None) -> tuple[list[str], str]:
    """What the kind shows of its own before node.sh (`WithDryRunSection`), and where node.sh
    runs, in the dry run's words."""
    from launcher.clusters.contract import WithDryRunSection

    found = declared(plan.profile.kind)
    if not isinstance(found, WithDryRunSection):
        return [], "run detached on the node"
    return found.dry_run_section(plan, price), found.node_script_where


def owned_nodes(kind: str) -> bool:
    """Whether the kind's nodes are the user's own, with no list price (`WithOwnedNodes`)."""
    from launcher.clusters.contract import WithOwnedNodes

    return isinstance(declared(kind), WithOwnedNodes)


def from_plan(plan: Plan, options: LaunchOptions, run_dir: Path) -> Cluster:
    """The cluster a new run acquires its nodes from (the profile's kind decides)."""
    return backend(plan.profile.kind).from_plan(plan, options, run_dir)


def from_record(record: Mapping[str, Any], run_dir: Path | None = None) -> Cluster:
    """The cluster of a recorded run (run.json's `cluster`): it reaches and releases its nodes.

    `run_dir` (made absolute) is the run directory the record is read from: a backend whose
    record holds paths reads them against it, never against the directory the command runs in."""
    where = Path(run_dir).absolute() / "run.json" if run_dir is not None else Path("run.json")
    kind = record.get("kind")
    if not isinstance(kind, str) or kind not in BACKENDS:
        raise BadInput(f"{where}: run.json names no cluster kind this launcher has ({kind!r})")
    found = backend(kind)
    check_record(found, record, where)
    return found.from_record(
        record, run_dir=Path(run_dir).absolute() if run_dir is not None else None
    )


def check_record(found: Backend, record: Mapping[str, Any], where: Path) -> None:
    """BadInput (exit 2) naming the field when a recorded cluster lacks a field its kind needs,
    or holds one of the wrong type: a command that reads it must not take the absence for
    "nothing was acquired" and end nothing."""
    for key, field in found.record_fields.items():
        if key not in record:
            if field.optional:
                continue
            problem = "lacks it"
        elif field.holds(record[key]):
            continue
        else:
            problem = f"holds {type(record[key]).__name__}"
        wanted = " or ".join("null" if t is type(None) else t.__name__ for t in field.types)
        raise BadInput(
            f"{where}: the run's cluster record (kind {found.kind}) field `cluster.{key}` "
            f"{problem}; expected {wanted}. Without it the launcher cannot tell what the run "
            "acquired, so nothing is ended or reported as ended; the record is damaged or was "
            "written by an older reproduce.",
            hint="Look at run.json by hand; what the run acquired may still be running.",
        )


def to_record(cluster: Cluster) -> dict[str, Any]:
    """What run.json keeps so that `from_record` finds the cluster again (no secrets)."""
    return cluster.to_record()
