"""The cost gate: a run's cost is on screen before anything is paid for, and someone said yes.

Why a gate of its own: a launched p5en node costs about $63 an hour from the moment it is asked
for, and runs until it is released or its TTL ends it. So before the first cloud call a real run
shows the plan's header (recipe, target, nodes, image), the expected GPU-hours and dollars, the
worst case until the TTL (ttl_hours x nodes x price: what a run costs when the launcher dies and
nothing but the instance's own shutdown ends it), and the budget flags. Then:

- a launch (a kind in PAID_KINDS, not targeting an existing instance) asks the person at the
  terminal; `--yes` answers for them; without a terminal (a pipe, cron, `nightly`) it needs
  `--yes` or a `--max-usd` budget, else it is refused (exit 2) before any cloud call;
- a targeted host (SSH, local, Ray, or an existing instance by --instance-id) is not launched or
  ended by this tool: its cost per hour is shown and no question asked; a budget given for it is
  checked before the start (launcher/runner/prelaunch.py, check_before_start) and while it runs.

`Runner.run` (launcher/runner/runner.py) applies it: `reproduce RECIPE` and `nightly` both go
through there, so no paid launch has another way in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from launcher.cost.estimate import likely_lines, target_args
from launcher.errors import BadInput
from launcher.inputs.profile import AwsProfile, RayProfile, SshProfile
from launcher.plan.claimruns import claim_lines

if TYPE_CHECKING:
    from launcher.catalog import Price
    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe

# `prepared` and `options` below are launcher.runner.prelaunch's Prepared and RunOptions, typed
# loosely:
# prelaunch imports this module (the dry run prints the same cost lines).
Prepared = Any
RunOptions = Any

# Kinds whose backend launches the nodes it runs on, billed by the hour until it ends them.
PAID_KINDS = frozenset({"aws"})


def _ttl_hours(profile: Profile) -> float | None:
    """How long a launched node may live before it ends itself (aws only)."""
    return profile.ttl_hours if isinstance(profile, AwsProfile) else None


def _target_address(profile: Profile) -> str | None:
    """What a run on an existing target reaches: the ssh host or the Ray job server."""
    if isinstance(profile, SshProfile):
        return profile.host
    if isinstance(profile, RayProfile):
        return profile.address
    return None


QUESTION = "Launch it and start paying? [y/N] "
# `reproduce capacity --buy` (launcher/clusters/aws/capacity.py) asks with the same rule.
BUY_QUESTION = "Buy this Capacity Block? It cannot be cancelled. [y/N] "


class NotConfirmed(BadInput):
    """The person at the terminal said no (or nothing): nothing was launched (exit 2)."""


@dataclass(frozen=True)
class CostGate:
    """The decision, and everything shown with it (also kept in run.json as `cost`)."""

    header: tuple[str, ...]
    launches: bool  # this run launches nodes that bill until released (or their TTL)
    price_per_hour: float | None  # one node, $/h; None: unknown
    price_source: str | None
    nodes: int
    gpus_per_node: int
    ttl_hours: float | None  # launches only: when the instance ends itself
    ask: bool  # a person at the terminal must say yes first
    refusal: str | None  # why it may not start (exit 2, before any cloud call)
    tokens_per_step: int | None = None  # for the live tokens/s while training

    @property
    def usd_per_hour(self) -> float | None:
        return None if self.price_per_hour is None else self.price_per_hour * self.nodes

    @property
    def worst_case_usd(self) -> float | None:
        if not self.launches or self.ttl_hours is None or self.usd_per_hour is None:
            return None
        return self.ttl_hours * self.usd_per_hour

    def to_record(self) -> dict[str, Any]:
        """run.json's `cost`: what `reproduce runs` and `status` count the cost so far with."""
        return {
            "price_per_hour": self.price_per_hour,
            "price_source": self.price_source,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "launches": self.launches,
            "ttl_hours": self.ttl_hours,
            "worst_case_usd": self.worst_case_usd,
            "tokens_per_step": self.tokens_per_step,
        }


def launches(profile: Profile) -> bool:
    """Does a run on this profile launch (and pay for) its own nodes?"""
    return isinstance(profile, AwsProfile) and not profile.instance_id


def cost_line(recipe: Recipe, price: Price | None) -> str:
    """The expected cost: the claim's GPU-hours at the node's price (launcher/catalog.py)."""
    hours = recipe.claimed_gpu_hours
    if hours is None:
        return "no GPU-hours in the recipe's result; cost unknown"
    node_hours = hours / recipe.gpus_per_node
    if price is None:
        from launcher.catalog import no_price_reason

        return (
            f"{hours:g} GPU-hours (recipe result.gpu_hours); NO PRICE: "
            f"{no_price_reason(recipe.instance_type)}, so no cost; "
            "set price_per_hour in the profile or pass --price-per-hour"
        )
    return (
        f"{hours:g} GPU-hours (recipe result.gpu_hours) = {node_hours:.3f} node-hours x "
        f"${price.value:g}/h = ${node_hours * price.value:.2f}  [price: {price.describe()}]"
    )


def worst_case_text(prepared: Prepared) -> str | None:
    """The most a launch can cost: until its TTL, when nothing but the instance's own shutdown
    ends it (the launcher died, the laptop closed). None for a host that is not launched."""
    if not launches(prepared.profile):
        return None
    ttl = _number(_ttl_hours(prepared.profile))
    nodes = int(prepared.recipe.nodes)
    if prepared.price is None or ttl is None:
        return "unknown (no price or no ttl_hours): the instance still ends itself at its TTL"
    per_hour = prepared.price.value
    return (
        f"${ttl * per_hour * nodes:.2f} until the TTL: {ttl:g} h x {nodes} node(s) x "
        f"${per_hour:g}/h (if the launcher dies, the instance ends itself then)"
    )


def ttl_check(prepared: Prepared) -> tuple[str | None, str | None]:
    """(a warning, a refusal) when a launch's TTL would end it before its training ends
    (launcher/cost/ttl.py); (None, None) for a host that is not launched."""
    ttl = _number(_ttl_hours(prepared.profile)) if launches(prepared.profile) else None
    if ttl is None:
        return None, None
    from launcher.cost.ttl import run_check

    runs = prepared.plan.runs.get("measured") or 1
    return run_check(prepared.recipe, ttl, store=prepared.profile.assets.store, runs=runs)


def refuse_unattended(profile: Profile, *, yes: bool, max_usd: float | None, who: str) -> None:
    """BadInput when runs nobody watches would launch paid nodes without consent or a budget.

    `nightly` calls this once before its first recipe (so a refused night leaves no rows), and
    the gate applies the same rule to every run without a terminal.
    """
    if launches(profile) and not yes and max_usd is None:
        raise BadInput(
            f"{who} on --cluster {profile.name} launches paid {profile.kind} nodes and nobody is "
            "at a terminal to confirm the cost, so nothing was launched.",
            hint="Pass --max-usd N (each run stops at N dollars), or --yes to accept the cost "
            "shown without a budget (the instance still ends itself at its TTL).",
        )


def refused_unattended(profile: Profile, options: RunOptions, *, unattended: bool) -> bool:
    """Will the gate refuse this run for want of consent (no terminal, no --yes, no budget)?
    Then nothing is asked of the cloud before the refusal, not even the price."""
    return unattended and launches(profile) and not options.yes and options.max_usd is None


def decide(prepared: Prepared, options: RunOptions, *, attended: bool) -> CostGate:
    """The gate for one run: its header, and whether to ask, go, or refuse."""
    recipe, profile, plan = prepared.recipe, prepared.profile, prepared.plan
    price = prepared.price
    paid = launches(profile)
    ttl = _number(_ttl_hours(profile)) if paid else None
    instance = profile.instance_type or recipe.instance_type or "unknown instance"
    where = profile.region or "-"
    per_hour = price.value if price is not None else None
    if paid:
        target = (
            f"{profile.name} (kind {profile.kind}, region {where}): LAUNCHES {recipe.nodes} x "
            f"{instance}, billed from launch until released"
        )
    else:
        host = (
            "this machine" if profile.kind == "local" else _target_address(profile) or "its hosts"
        )
        target = f"{profile.name} (kind {profile.kind}; {host}): a host reproduce does not launch"
    lines = [
        f"recipe    {recipe.slug}  ({recipe.path})",
        f"target    {target}",
        f"nodes     {recipe.nodes} x {recipe.gpus_per_node} {recipe.gpu_type}  ({instance})",
        f"image     {plan.image_ref}",
        f"expected  {cost_line(recipe, price)}",
    ]
    if per_hour is None:
        lines.append("price     NO PRICE known: the cost is not counted (set price_per_hour)")
    elif not paid:
        lines.append(
            f"cost      ${per_hour * recipe.nodes:.2f}/h for {recipe.nodes} node(s) while it "
            f"runs  [price: {price.describe()}]"
        )
    worst = worst_case_text(prepared)
    if worst is not None:
        lines.append(f"worst     {worst}")
    warning, refusal = ttl_check(prepared)
    if warning is not None:
        lines.append(f"ttl       WARNING: {warning}")
    lines.append(f"budget    {_budget_words(options)}")
    lines += claim_lines(
        plan.recipe, plan.runs.get("accepted")
    )  # result.runs and patches: what the verdict will say of them
    lines[5:5] = likely_lines(  # after "expected": what it costs with everything included
        recipe,
        **target_args(profile, price),
        max_usd=options.max_usd,
        runs=plan.runs.get("measured") or 1,  # K measured runs train K times
    )
    ask = paid and not options.yes and attended and refusal is None
    if paid and not attended and refusal is None:
        try:
            refuse_unattended(profile, yes=options.yes, max_usd=options.max_usd, who="this run")
        except BadInput as err:
            refusal = str(err)
    return CostGate(
        header=tuple(lines),
        launches=paid,
        price_per_hour=per_hour,
        price_source=price.describe() if price is not None else None,
        nodes=int(recipe.nodes),
        gpus_per_node=int(recipe.gpus_per_node),
        ttl_hours=ttl,
        ask=ask,
        refusal=refusal,
        tokens_per_step=_tokens_per_step(recipe),
    )


def _budget_words(options: RunOptions) -> str:
    words = []
    if options.max_usd is not None:
        words.append(f"--max-usd {options.max_usd:g} (the run is stopped there)")
    if options.max_hours is not None:
        words.append(f"--max-hours {options.max_hours:g}")
    if options.yes:
        words.append("--yes (no question asked)")
    return "; ".join(words) if words else "none (--max-usd N stops a run at N dollars)"


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _tokens_per_step(recipe: Recipe) -> int | None:
    try:
        return int(recipe.tokens_per_step)
    except (AttributeError, KeyError, TypeError, ValueError, BadInput):
        return None


class CostReporter(Protocol):
    """What the gate asks of whoever shows the run (the runner's reporter, the console)."""

    def cost(self, gate: CostGate) -> None: ...

    def confirm(self, question: str) -> bool: ...


def pass_gate(
    prepared: Prepared, options: RunOptions, reporter: CostReporter, *, attended: bool
) -> CostGate:
    """Show the cost, then go, ask, or refuse; BadInput (exit 2) when the run may not start.

    Called before the run directory exists and before any cloud call, so a refusal or a "no"
    leaves nothing behind: no run directory, no history row, nothing launched.
    """
    gate = decide(prepared, options, attended=attended)
    reporter.cost(gate)
    if gate.refusal:
        raise BadInput(gate.refusal)
    if gate.ask and not reporter.confirm(QUESTION):
        raise NotConfirmed("not confirmed, so nothing was launched.")
    return gate
