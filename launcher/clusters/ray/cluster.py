"""An existing Ray cluster (KubeRay, Anyscale, one started by hand): `kind: ray` profiles.

The launcher has no shell on such a cluster, only its job server (the dashboard's Jobs API). So the
run is ONE Ray job: node.sh is its entrypoint, run by the job's driver on the cluster, where the
nodes already are the recipe's image (no docker); the job's runtime env carries node.sh and the
launcher's node programs (its working_dir, which Ray puts on every worker's PYTHONPATH) and the
recipe's environment (its env_vars, which reach every worker of the job on every node, where
miles' actors run). Before any training the job checks that the cluster is the recipe's: its nodes
and GPUs, and the image digest every GPU node says it runs (scripts/ray_cluster.py).

`submission_request` is the one definition of what is submitted: the dry run prints it, the real
run sends it (with the working_dir it stages), run.json keeps it. Acquiring finds the job server
and the cluster's nodes; releasing ends nothing, ever: the cluster is not ours, and stopping the
job (on cancel, the budget, Ctrl-C) is the execution's business (launcher/clusters/ray/jobs.py).
Nothing here imports ray; the execution does, when a real run needs it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from launcher.clusters.base import LaunchOptions, Node
from launcher.clusters.contract import (
    Backend,
    RecordField,
    WithDryRunSection,
    WithMultiNode,
    WithNodeHealth,
    WithOwnExecution,
)
from launcher.errors import BadInput, InfraError
from launcher.inputs.profile import RayProfile
from launcher.plan.node_script import MILES_PYTHONPATH, container_env
from launcher.records.rundir import Files

if TYPE_CHECKING:
    from launcher.catalog import Price
    from launcher.clusters.execution import Place
    from launcher.clusters.ray.jobs import RayJobExecution
    from launcher.plan.plan import Plan

# node.sh runs from the job's working_dir (where Ray unpacks it), which holds the node programs.
ENTRYPOINT = 'REPRODUCE_SCRIPTS="$PWD" bash node.sh'
WORKING_DIR = "<node.sh and the launcher's node programs (scripts/), uploaded by the Ray client>"


def job_env(plan: Plan) -> dict[str, str]:
    """The runtime env's env_vars: what every process of the job gets, on every node (Ray adds
    the working_dir in front of PYTHONPATH). Never a secret: a submission is readable by everyone
    who reaches the dashboard."""
    env = {
        "PYTHONPATH": MILES_PYTHONPATH,
        # every step line must reach the log: Ray's dedup folds lines differing only in numbers
        "RAY_DEDUP_LOGS": "0",
    }
    env.update(container_env(plan.recipe, plan.profile))
    return env


def submission_request(plan: Plan) -> dict[str, Any]:
    """Exactly what the run submits (JobSubmissionClient.submit_job's arguments), with the
    working_dir as the dry run shows it; the real run puts the staged directory there."""
    from launcher.clusters.ray.jobs import job_id

    return {
        "submission_id": job_id(plan.run_id),
        "entrypoint": ENTRYPOINT,
        "runtime_env": {"working_dir": WORKING_DIR, "env_vars": job_env(plan)},
        "metadata": {
            "reproduce_run_id": plan.run_id,
            "recipe": plan.recipe.slug,
            "image": plan.image_ref,
        },
    }


def request_text(plan: Plan) -> str:
    """The dry run's section: the job server and the submission, as JSON."""
    return (
        f"# ---- Ray job submission to {_profile_address(plan)} (Jobs API; no secrets) ----\n"
        + json.dumps(submission_request(plan), indent=2)
    )


def _profile_address(plan: Plan) -> str | None:
    """The job server a `kind: ray` profile names (None on any other kind: refused later)."""
    return plan.profile.address if isinstance(plan.profile, RayProfile) else None


def _address(value: object, where: str) -> str:
    address = str(value or "").rstrip("/")
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(
            f"{where}: address {value!r} is not a Ray job server's URL (http://HOST:8265, the "
            "dashboard's address)."
        )
    return address


class RayCluster(WithOwnExecution, WithNodeHealth):
    """The job server of a Ray cluster that exists without us; release never touches it."""

    name = "ray"

    def __init__(self, address: str, plan: Plan | None = None, run_dir: Path | None = None) -> None:
        self.address = address
        self.plan = plan  # a new run's; None for a run found again from run.json
        self.run_dir = run_dir
        self.started_with: list[dict[str, Any]] = []  # GPU nodes alive when the run started

    def acquire(self) -> list[Node]:
        """The job server answers and the cluster is listed; one Node stands for the job."""
        from launcher.clusters.ray.jobs import cluster_nodes

        alive = [n for n in cluster_nodes(self.address) if n["state"] == "ALIVE"]
        self.started_with = [
            {"node_id": n["node_id"], "ip": n["ip"], "gpus": n["gpus"]} for n in alive if n["gpus"]
        ]
        meta: dict[str, Any] = {"address": self.address, "nodes_at_start": self.started_with}
        if self.plan is not None:
            request = submission_request(self.plan)
            meta["submission_id"] = request["submission_id"]
            if self.run_dir is not None:  # what is submitted, as the dry run showed it
                from launcher.records.rundir import RunDir

                RunDir(self.run_dir).update_record(ray_job=request)
        host = urlsplit(self.address).hostname or self.address
        return [Node(name="ray-job", host=host, meta=meta)]

    def transport(self, node: Node) -> Any:
        raise InfraError(
            f"a Ray cluster is reached through its job server ({self.address}), not a shell"
        )

    def execution(self, node: Node, place: Place) -> RayJobExecution:
        """The run as a Ray job (`WithOwnExecution`: the runner drives it, not a shell)."""
        from launcher.clusters.ray.jobs import RayJobExecution

        if not self.started_with:  # a run found again: the nodes it started with are recorded
            self.started_with = list(node.meta.get("nodes_at_start") or [])
        request = submission_request(self.plan) if self.plan is not None else None
        return RayJobExecution(node, place, self.address, request)

    def lost_nodes(self, *, now: bool = False) -> list[str]:
        """A GPU node that was alive when the run started and is dead now, in a sentence each
        (Ray's own reason included); the runner stops the run on it. Nodes an autoscaler ended
        for idleness are not counted: the run was not using them. Always asked anew (`now` is
        the same)."""
        from launcher.clusters.ray.jobs import cluster_nodes

        del now
        alive = {n["node_id"]: n for n in cluster_nodes(self.address)}
        lost = []
        for node in self.started_with:
            current = alive.get(node["node_id"])
            if current is not None and current["state"] == "ALIVE":
                continue
            why = (current or {}).get("state_message") or "it is gone from the cluster"
            if "idle" in why.lower():
                continue
            lost.append(
                f"Ray node {node['ip']} (id {node['node_id'][:12]}, {node['gpus']:g} GPUs) is "
                f"dead: {why}"
            )
        return lost

    def release(self) -> None:
        """Nothing to end: the cluster is not ours (the job was stopped or has ended)."""

    def to_record(self) -> dict[str, Any]:
        """What attach and cancel need to find the cluster again (kept in run.json)."""
        return {"kind": "ray", "address": self.address}


class RayBackend(Backend, WithMultiNode, WithDryRunSection):
    """`kind: ray`: an existing Ray cluster's job server."""

    kind = "ray"
    record_fields: ClassVar[Mapping[str, RecordField]] = {"address": RecordField((str,))}

    def from_plan(self, plan: Plan, options: LaunchOptions, run_dir: Path) -> RayCluster:
        address = _address(_profile_address(plan), str(plan.profile.path))
        return RayCluster(address, plan, run_dir)

    def from_record(self, record: Mapping[str, Any], run_dir: Path | None = None) -> RayCluster:
        return RayCluster(_address(record.get("address"), Files.RUN))

    node_script_where = "the Ray job's entrypoint"

    def dry_run_section(self, plan: Plan, price: Price | None) -> list[str]:
        """The job server and the submission, as JSON."""
        del price
        return ["", request_text(plan)]


BACKEND = RayBackend()
