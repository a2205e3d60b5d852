"""The real run: the Plan's node script on the cluster's node, then measurement and the verdict.

The cluster comes from the profile's kind; everything after acquiring a node is the shared runner
(launcher/execute.py), the same for this host, SSH hosts, AWS and Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.reproduction import Options, Prepared


def make_cluster(prepared: Prepared, options: Options, state_path: Path) -> Any:
    """The backend for the profile's kind (imports its heavy libraries only now)."""
    profile, plan = prepared.profile, prepared.plan
    kind = profile.kind
    if kind == "local":
        from launcher.clusters.local import LocalCluster

        return LocalCluster(profile.raw)
    if kind == "ssh":
        from launcher.clusters.ssh import SSHCluster

        return SSHCluster.from_profile(profile.raw)
    if kind == "aws":
        from launcher.clusters.aws import AwsCluster

        return AwsCluster(prepared.recipe, profile, plan.run_id, keep=options.keep,
                          instance_id=profile.get("instance_id"), owner=prepared.owner, state_path=state_path)
    if kind == "ray":
        from launcher.clusters.local import LocalCluster

        # The node script runs here and submits its stages as Ray jobs to the profile's cluster.
        return LocalCluster(profile.raw)
    raise AssertionError(kind)


def run_plan(prepared: Prepared, options: Options) -> int:
    """Execute the Plan; return the exit code (0 reproduced, 1 not, 3 infra errors raise)."""
    from launcher.execute import execute
    from launcher.rundir import RunDir, default_runs_root

    recipe, profile, plan = prepared.recipe, prepared.profile, prepared.plan
    root = options.runs_dir or default_runs_root()
    run_dir = RunDir.create(root, recipe.slug, plan.run_id)
    run_dir.write_inputs(recipe_text=recipe.text, profile=profile.path.read_text(encoding="utf-8"),
                         plan=plan.to_dict(), node_script=plan.node_script)
    cluster = make_cluster(prepared, options, run_dir.path / "aws.json")
    outcome = execute(
        cluster, node_script=plan.node_script, run_id=plan.run_id, node_run_dir=plan.node_run_dir,
        container=plan.container, run_dir=run_dir, recipe_raw=recipe.raw, on_interrupt=options.on_interrupt,
    )
    return exit_code_of(outcome)


def exit_code_of(outcome: Any) -> int:
    """0 only for a finished run judged reproduced; a detached run is not a failure (it goes on)."""
    if outcome.state == "detached":
        return 0
    if outcome.state == "cancelled":
        return 130
    verdict = outcome.measurement[1] if outcome.measurement else None
    if outcome.state == "done" and verdict is not None and getattr(verdict, "status", None) == "reproduced":
        return 0
    return 1
