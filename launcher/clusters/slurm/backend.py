"""`kind: slurm`'s backend: a new run's cluster (its own batch job, or a step of a nightly group's
allocation), a recorded run's, and what is asked before anything is submitted."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from launcher.clusters.base import LaunchOptions
from launcher.clusters.contract import (
    NULL,
    Backend,
    RecordField,
    WithDryRunSection,
    WithFitCheck,
    WithJobTimeLimit,
    WithLivePrice,
    WithMultiNode,
    WithNodeShape,
    WithOwnedNodes,
)
from launcher.clusters.slurm import script
from launcher.clusters.slurm.cluster import SlurmCluster, recorded_job, refuse_misfit
from launcher.clusters.slurm.step import SlurmStep, step_from_record
from launcher.errors import BadInput
from launcher.inputs.profile import SlurmProfile

if TYPE_CHECKING:
    from launcher.catalog import Price
    from launcher.clusters.ssh import SSHSettings
    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe
    from launcher.plan.plan import Plan


def _login_of(profile: Mapping[str, Any]) -> SSHSettings | None:
    if not profile.get("login_host"):
        return None
    from launcher.clusters.ssh import SSHSettings

    fields = {k: v for k, v in profile.items() if k in SSHSettings.__dataclass_fields__}
    fields["host"] = profile["login_host"]
    fields.pop("work_dir", None)
    return SSHSettings.from_mapping(fields)


class SlurmBackend(
    Backend,
    WithFitCheck,
    WithLivePrice,
    WithMultiNode,
    WithJobTimeLimit,
    WithOwnedNodes,
    WithNodeShape,
    WithDryRunSection,
):
    """`kind: slurm`: a run as one batch job, submitted from the login node; in a nightly
    group, one job step of the group's allocation (launcher/clusters/slurm/step.py)."""

    kind = "slurm"
    record_fields: ClassVar[Mapping[str, RecordField]] = {
        "login": RecordField((dict, NULL)),  # null: the launcher ran on the login node
        "job_id": RecordField((str, NULL)),  # null: sbatch's answer never came back
        "user": RecordField((str,)),
        "nodes": RecordField((int,)),
        "job_nodes": RecordField((list,)),
        "started_at": RecordField((int, float, NULL)),
        "job_name": RecordField((str,)),  # how a job whose id was lost is found again
        # a run inside a nightly group's allocation (job_id, job_name: the allocation's)
        "step_name": RecordField((str,), optional=True),  # the run's step, by its name
        "step_id": RecordField((str, NULL), optional=True),  # null: not seen by squeue -s yet
        "body_pid": RecordField((int, NULL), optional=True),  # the step's body on the login node
    }

    def from_plan(self, plan: Plan, options: LaunchOptions, run_dir: Path) -> SlurmCluster:
        """The cluster of a new run (launcher.clusters.from_plan): its own job, or, lent a
        nightly group's nodes (`options.shared`), a step of the group's allocation."""
        if options.shared:
            login = _login_of(plan.profile.raw)
            return SlurmStep(login, plan=plan, run_dir=run_dir, options=options)
        return SlurmCluster(_login_of(plan.profile.raw), plan=plan, run_dir=run_dir)

    def node_shape(self, recipe: Recipe, profile: Profile) -> str:
        """What the allocation's `#SBATCH` header asks (besides the node count): two recipes
        share one allocation only when their own jobs would have asked for the same nodes."""
        if not isinstance(profile, SlurmProfile):
            raise BadInput(f"{profile.path}: not a slurm profile")
        import json

        return json.dumps(
            {
                "gpus_per_node": recipe.gpus_per_node,
                "partition": profile.partition,
                "account": profile.account,
                "qos": profile.qos,
                "reservation": profile.reservation,
                "constraint": profile.constraint,
                "gpu_option": profile.gpu_option,
                "login_host": profile.login_host,
                "container_runtime": profile.container_runtime,
            },
            sort_keys=True,
        )

    def from_record(self, record: Mapping[str, Any], run_dir: Path | None = None) -> SlurmCluster:
        """The cluster of a recorded run (launcher.clusters.from_record)."""
        login = record.get("login")
        settings = None
        if isinstance(login, Mapping):
            from launcher.clusters.ssh import SSHSettings

            settings = SSHSettings.from_mapping(login)
        if isinstance(record.get("step_name"), str):  # a step of a nightly group's allocation
            return step_from_record(settings, record)
        cluster = SlurmCluster(settings, **recorded_job(record), job_name=record["job_name"])
        # A recorded run may have been stopped between sbatch and its answer: nothing proves it
        # submitted nothing, so a release without a job id still looks for one by its name.
        cluster.submitting = True
        return cluster

    def check_fits(self, recipe: Recipe, profile: Profile) -> None:
        """Before the run directory (launcher.clusters.check_fits): the partition can hold the
        recipe, asked on the login node."""
        if not isinstance(profile, SlurmProfile):
            return
        cluster = SlurmCluster(_login_of(profile.raw))
        try:
            refuse_misfit(cluster._run, recipe, profile)  # noqa: SLF001 - the backend's own cluster
        finally:
            cluster.release()

    def live_price(
        self, recipe: Recipe, profile: Profile, fallback: Price | None
    ) -> tuple[Price | None, str | None]:
        """A cluster the user owns has no list price: only the profile's (or --price-per-hour)."""
        del recipe, profile, fallback
        return None, None

    def with_time_limit(
        self,
        recipe: Recipe,
        profile: Profile,
        max_hours: float | None,
        max_usd: float | None,
        price: float | None,
    ) -> Profile:
        """--max-hours/--max-usd become the job's `--time` too (script.with_time_limit)."""
        return script.with_time_limit(recipe, profile, max_hours, max_usd, price)

    def dry_run_section(self, plan: Plan, price: Price | None) -> list[str]:
        """The batch script the run submits, byte for byte (script.dry_run_section)."""
        del price
        return ["", script.dry_run_section(plan)]


BACKEND = SlurmBackend()
