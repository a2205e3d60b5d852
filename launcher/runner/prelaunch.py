"""Before a run starts: the command line's words to a Plan, its price and checks, or a dry run.

`prepare` is shared by `--dry-run` and the real run, so what the dry run prints is what runs
(torchx's submit_dryrun -> schedule pattern). Nothing here imports boto3, paramiko or ray: the
backends do, when a real run needs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from launcher.cost.costgate import cost_line, ttl_check, worst_case_text
from launcher.errors import BadInput
from launcher.inputs.profile import Profile, load_profile
from launcher.inputs.recipe import Recipe, load_recipe
from launcher.plan.claimruns import claim_lines
from launcher.plan.plan import Plan, build_plan
from launcher.plan.stage_graph import describe
from launcher.records.atomic import write_atomic
from launcher.records.rundir import new_run_id, owner


@dataclass(frozen=True)
class RunOptions:
    """What the command line adds to a recipe and a profile."""

    cluster: str = "local"
    run_id: str | None = None
    skip_preflight: bool = False
    instance_id: str | None = None
    price_per_hour: float | None = None
    keep: bool = False
    max_usd: float | None = None
    max_hours: float | None = None
    on_interrupt: str = "ask"
    runs_dir: Path | None = None
    yes: bool = False  # the cost gate's question answered in advance (launcher/cost/costgate.py)
    runs: int | None = None  # --runs: fewer runs than the claim's mean (launcher/plan/claimruns.py)


@dataclass(frozen=True)
class StartCheck:
    """What the checks before a start found: the run's budget, and why a real run would be
    refused although its plan can be shown (the dry run prints these; the real run raises)."""

    budget: Any  # launcher.cost.budget.Budget | None
    refusals: tuple[str, ...] = ()


def check_before_start(prepared: Prepared, options: RunOptions) -> StartCheck:
    """Every check the real run applies before it starts, in one place, so that a dry run that
    passes means the real run starts: the --on-interrupt value, a reused --run-id, the budget
    (--max-usd needs a price; the claim's expected hours and cost within the limits). BadInput
    for bad input. What the real run refuses although the plan exists (a multi-node recipe, a
    dry-run-only profile kind) is returned, for the dry run to say and the real run to raise.
    Credentials and the node's own checks are not here: the dry run needs neither (--check asks
    the cloud)."""
    from launcher import clusters
    from launcher.cost.budget import Budget
    from launcher.records.rundir import RunDir, default_runs_root
    from launcher.runner.reporter import INTERRUPT_CHOICES

    recipe, profile = prepared.recipe, prepared.profile
    if options.on_interrupt not in INTERRUPT_CHOICES:
        raise BadInput(
            f"--on-interrupt must be one of {', '.join(INTERRUPT_CHOICES)}, "
            f"not {options.on_interrupt!r}"
        )
    if options.run_id:
        RunDir.refuse_existing(options.runs_dir or default_runs_root(), options.run_id)
    budget = None
    if options.max_usd is not None or options.max_hours is not None:
        price = prepared.price.value if prepared.price is not None else None
        budget = Budget.for_recipe(recipe, price, options.max_usd, options.max_hours)
        budget.refuse_if_over(Budget.expected_hours(recipe))  # BadInput: nothing launched
    refusals = []
    if profile.kind in clusters.DRY_RUN_ONLY:
        refusals.append(
            f"--cluster {profile.name}: profiles of kind {profile.kind} are dry-run only in "
            f"this version ({clusters.DRY_RUN_ONLY[profile.kind]}); use --dry-run to see the "
            "jobs it would submit."
        )
    if recipe.nodes > 1 and not clusters.multi_node(profile.kind):
        # The plan and the AWS request cover several nodes, but starting N paid nodes of which
        # N-1 would idle is worse than refusing before anything is launched.
        refusals.append(
            f"{recipe.path}: {recipe.nodes} nodes; on kind {profile.kind} this version of "
            "reproduce runs single-node recipes only (several nodes run on kind "
            f"{', '.join(clusters.multi_node_kinds())}; --dry-run shows the multi-node "
            "plan). Nothing was launched."
        )
    return StartCheck(budget, tuple(refusals))


@dataclass(frozen=True)
class Prepared:
    recipe: Recipe
    profile: Profile
    plan: Plan
    price: Any  # launcher.catalog.Price | None
    owner: str


def prepare(recipe_path: str | Path, options: RunOptions) -> Prepared:
    """Load and validate everything, build the Plan. Raises BadInput before anything starts."""
    from launcher import clusters

    recipe = load_recipe(recipe_path)
    profile = load_profile(options.cluster)
    if options.instance_id:
        profile = clusters.target_instance(profile, options.instance_id, options.cluster)
    if options.price_per_hour is not None:
        profile = profile.with_overrides(price_per_hour=options.price_per_hour)
    given = options.price_per_hour or profile.price_per_hour
    profile = clusters.with_time_limit(recipe, profile, options.max_hours, options.max_usd, given)
    run_id = options.run_id or new_run_id()
    who = owner()
    provisioning = clusters.provisioning(
        recipe, profile, run_id, owner=who, now=datetime.now(UTC), keep=options.keep
    )
    from launcher.plan import claimruns

    plan = build_plan(
        recipe,
        profile,
        run_id=run_id,
        skip_preflight=options.skip_preflight,
        provisioning=provisioning,
        runs=claimruns.check_option(recipe, options.runs),
    )
    price = node_price(recipe, profile, options.price_per_hour)
    return Prepared(recipe, profile, plan, price, who)


def node_price(recipe: Recipe, profile: Profile, option: float | None = None) -> Any:
    """The price the run starts from, offline: --price-per-hour (source "option"), else the
    profile's price_per_hour ("profile"), else the catalog's ("catalog"), or None. A real run on
    AWS then looks the catalog's up live (decide_price); the dry run shows this one."""
    from launcher import clusters
    from launcher.catalog import price_per_hour

    itype = profile.instance_type or recipe.instance_type
    region = profile.region
    if option is None and profile.price_per_hour is None and clusters.owned_nodes(profile.kind):
        return None  # nodes the user owns have a price only if the profile gives one
    if option is not None:
        return price_per_hour(itype, region, option, override_source="option")
    return price_per_hour(itype, region, profile.price_per_hour, override_source="profile")


def decide_price(prepared: Prepared, warn: Callable[[str], object] | None = None) -> Prepared:
    """The price of this run, decided once, before the cost is shown: the user's word (option,
    profile) as it is; else the backend's live price (aws: the Price List API, the spot price
    history or a Capacity Block offering), the catalog's when a lookup fails (`warn` says why;
    a lookup never stops a run). Everything after (the cost gate, the budget, run.json,
    result.yaml, the report, status) uses the price returned here."""
    from dataclasses import replace

    from launcher import clusters

    price = prepared.price
    if price is not None and price.source in ("option", "profile"):
        return prepared
    found, why = clusters.live_price(prepared.recipe, prepared.profile, price)
    if why and warn is not None:
        warn(f"warning: {why}")
    return prepared if found is price else replace(prepared, price=found)


def dry_run_text(
    prepared: Prepared, refusals: tuple[str, ...] = (), *, max_usd: float | None = None
) -> str:
    """The header, the provisioning request (clouds) and the node script, byte for byte; a
    real run's refusals (check_before_start) are printed first, where nobody can miss them."""
    from launcher import clusters

    r, p, plan = prepared.recipe, prepared.profile, prepared.plan
    where = p.region or "-"
    instance = p.instance_type or r.instance_type or "unknown instance type"
    lines = [
        "# reproduce --dry-run: nothing is provisioned, started or paid for.",
        f"# recipe    {r.slug}  ({r.path})",
        f"# cluster   {p.name}  ({p.path}; kind {p.kind}; region {where})",
        f"# nodes     {r.nodes} x {r.gpus_per_node} {r.gpu_type}  ({instance})",
        f"# image     {plan.image_ref}  "
        f"({plan.built_image.describe(r) if plan.built_image else 'from ' + r.image.source_field})",
        f"# expected  {cost_line(r, prepared.price)}",
        *[f"# {line}" for line in likely_lines(prepared, max_usd)],
        *_worst_lines(prepared),
        f"# claim     {r.claim.tokens_per_s_per_gpu:g} tokens/s/GPU over steps "
        f"{r.window[0]}-{r.window[1]} of {r.steps_per_run}",
        *[
            f"# {line}" for line in claim_lines(plan.recipe, plan.runs.get("accepted"))
        ],  # result.runs, patches
        f"# run id    {plan.run_id}; node run dir {plan.node_run_dir}",
        f"# stages    {describe([s.name for s in plan.stages], plan.profile.kind)}",
    ]
    lines += [f"# REFUSED   a real run would not start: {why}" for why in refusals]
    lines += ["", *expected_split_lines(prepared)]
    section, where = clusters.dry_run_section(plan, prepared.price)
    lines += section
    lines += ["", f"# ---- node script (node.sh), {where} ----", plan.node_script]
    return "\n".join(lines)


def expected_split_lines(prepared: Prepared) -> list[str]:
    """Where a cold node, a warm store and a warm cache would spend their GPU-hours."""
    from launcher.cost.estimate import disk_lines, dry_run_lines, target_args

    args = target_args(prepared.profile, prepared.price)
    lines = dry_run_lines(prepared.recipe, **args, runs=prepared.plan.runs.get("measured") or 1)
    disk = prepared.profile.preflight.disk_min_gb
    return lines + disk_lines(prepared.recipe, float(disk) if disk is not None else None)


def likely_lines(prepared: Prepared, max_usd: float | None = None) -> list[str]:
    """This run's likely cost, every stage included (header lines, without '# ')."""
    from launcher.cost.estimate import likely_lines as lines
    from launcher.cost.estimate import target_args

    args = target_args(prepared.profile, prepared.price)
    runs = prepared.plan.runs.get("measured") or 1  # K measured runs: training K times
    return lines(prepared.recipe, **args, max_usd=max_usd, runs=runs)


def _worst_lines(prepared: Prepared) -> list[str]:
    """A launch's worst case (until its TTL), shown before anything is paid for."""
    worst = worst_case_text(prepared)
    warning, refusal = ttl_check(prepared)
    lines = [] if worst is None else [f"# worst     {worst}"]
    if warning is not None:
        lines.append(f"# ttl       WARNING: {warning}")
    if refusal is not None:
        lines.append(f"# ttl       A REAL RUN IS REFUSED: {refusal}")
    return lines


def write_script(plan: Plan, path: Path) -> None:
    try:
        write_atomic(path, plan.node_script, chmod=0o755)
    except OSError as err:
        raise BadInput(f"--script-out {path}: cannot write: {err.strerror}.") from None
