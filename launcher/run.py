"""The real run: the Plan's node script on the cluster's node, then measurement and the verdict.

The cluster comes from the profile's kind; everything after acquiring a node is the shared runner
(launcher/execute.py), the same for this host, SSH hosts, AWS and Ray.
"""

from __future__ import annotations

import json
import os
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

        return AwsCluster(
            prepared.recipe,
            profile,
            plan.run_id,
            keep=options.keep,
            instance_id=profile.get("instance_id"),
            owner=prepared.owner,
            state_path=state_path,
        )
    raise AssertionError(kind)


def run_plan(prepared: Prepared, options: Options) -> int:
    """Execute the Plan; return the exit code (0 reproduced, 1 not, 3 infra errors raise)."""
    from launcher.budget import Budget
    from launcher.execute import execute
    from launcher.rundir import RunDir, default_runs_root

    recipe, profile, plan = prepared.recipe, prepared.profile, prepared.plan
    from launcher.errors import BadInput

    if profile.kind == "ray":
        raise BadInput(
            f"--cluster {profile.name}: profiles of kind ray are dry-run only in this version (the job "
            "submission path is not tested yet); use --dry-run to see the jobs it would submit."
        )
    if recipe.nodes > 1:
        # The plan and the AWS request cover several nodes, but the runner follows one node; starting
        # N paid nodes of which N-1 would idle is worse than refusing before anything is launched.
        raise BadInput(
            f"{recipe.path}: {recipe.nodes} nodes; this version of reproduce runs single-node recipes only "
            f"(--dry-run shows the multi-node plan). Nothing was launched."
        )
    budget = None
    if options.max_usd is not None or options.max_hours is not None:
        price = prepared.price.value if prepared.price is not None else None
        budget = Budget.for_recipe(recipe, price, options.max_usd, options.max_hours)
        budget.refuse_if_over(Budget.expected_hours(recipe))  # BadInput: nothing launched
    root = options.runs_dir or default_runs_root()
    run_dir = RunDir.create(root, recipe.slug, plan.run_id)
    run_dir.write_inputs(
        recipe_text=recipe.text,
        profile=profile.path.read_text(encoding="utf-8"),
        plan=plan.to_dict(),
        node_script=plan.node_script,
    )
    cluster = make_cluster(prepared, options, run_dir.path / "aws.json")
    try:
        outcome = execute(
            cluster,
            node_script=plan.node_script,
            run_id=plan.run_id,
            node_run_dir=plan.node_run_dir,
            container=plan.container,
            run_dir=run_dir,
            recipe_raw=recipe.raw,
            on_interrupt=options.on_interrupt,
            secrets=secrets_for(profile),
            budget=budget,
        )
    finally:
        record_history(run_dir.path, root)
    return exit_code_of(outcome)


def record_history(run_dir: Path, runs_root: Path | None = None) -> None:
    """Every finished run joins its recipe's history (launcher/history.py); a detached one later, on attach.

    The history lives in the runs root the run directory belongs to (<root>/<slug>/<run id>).
    """
    import sys

    from launcher.history import default_history_path, record

    try:
        if runs_root is None:
            slug = json.loads((run_dir / "run.json").read_text())["slug"]
            runs_root = run_dir.parents[len(slug.split("/"))]
        status = json.loads((run_dir / "status.json").read_text())
        if status.get("state") in ("done", "failed", "cancelled"):
            record(run_dir, default_history_path(runs_root))
    except Exception as err:  # noqa: BLE001 - the run's own outcome matters more than its history row
        print(f"warning: the run was not added to the history: {err}", file=sys.stderr)


def check_plan(prepared: Prepared) -> int:
    """`--check`: ask the cloud whether the launch would be accepted (DryRun=True); nothing is created."""
    if prepared.profile.kind != "aws":
        from launcher.errors import BadInput

        raise BadInput(
            f"--check asks AWS about a launch; --cluster {prepared.profile.name} is of kind "
            f"{prepared.profile.kind}. Use --dry-run to see what would run."
        )
    from launcher.clusters.aws import check

    for line in check(
        prepared.recipe, prepared.profile, prepared.plan.run_id, owner=prepared.owner
    ):
        print(line)
    return 0


def secrets_for(profile: Any) -> dict[str, str]:
    """Secrets read from the launcher's environment; they travel to the node only (a 0600 file)."""
    name = profile.get("secrets.hf_token_env")
    value = os.environ.get(name) if name else None
    return {"HF_TOKEN": value} if value else {}


def exit_code_of(outcome: Any) -> int:
    """The CLI contract (failed runs raise CheckFailed or InfraError inside execute)."""
    from launcher.execute import outcome_exit_code

    return outcome_exit_code(outcome)
