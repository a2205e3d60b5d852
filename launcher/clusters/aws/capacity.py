"""Capacity Blocks for ML: list the offerings for a recipe, and buy one only when told to.

Why so careful: a Capacity Block cannot be cancelled once bought, and costs thousands of dollars.
So listing is the default, a purchase needs the offering's id as an explicit flag, its price and
start time are printed before the purchase call, `--max-usd` refuses a block that costs more, and
the purchase needs the consent a launch needs (a yes at the terminal, --yes, or a covering
--max-usd when nobody is at a terminal).
After buying, the reservation id goes into the profile (capacity: {type: capacity-block, ...}).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from launcher.clusters.aws.requests import TAG_RECIPE
from launcher.clusters.aws.session import make_session, translate
from launcher.clusters.aws.settings import settings_from
from launcher.cost.costgate import BUY_QUESTION, NotConfirmed
from launcher.errors import BadInput, InfraError

if TYPE_CHECKING:
    from boto3.session import Session
    from types_boto3_ec2.type_defs import CapacityBlockOfferingTypeDef

    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe


@dataclass(frozen=True)
class Offering:
    id: str
    instance_type: str
    instance_count: int
    zone: str
    start: datetime
    end: datetime
    hours: int
    upfront_usd: float
    currency: str

    @property
    def usd_per_instance_hour(self) -> float:
        return self.upfront_usd / max(1, self.hours * self.instance_count)

    def line(self) -> str:
        return (
            f"{self.id}  {self.instance_count} x {self.instance_type}  {self.zone}  "
            f"{self.start:%Y-%m-%d %H:%M} -> {self.end:%Y-%m-%d %H:%M} UTC ({self.hours} h)  "
            f"{self.upfront_usd:,.2f} {self.currency} upfront "
            f"(${self.usd_per_instance_hour:.2f}/instance-hour)"
        )


def _parse(item: CapacityBlockOfferingTypeDef) -> Offering:
    def when(value: datetime | str) -> datetime:
        if isinstance(value, datetime):
            return value.astimezone(UTC)
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(UTC)

    return Offering(
        id=item["CapacityBlockOfferingId"],
        instance_type=item.get("InstanceType", "?"),
        instance_count=int(item.get("InstanceCount", 0)),
        zone=item.get("AvailabilityZone", "?"),
        start=when(item["StartDate"]),
        end=when(item["EndDate"]),
        hours=int(item.get("CapacityBlockDurationHours", 0)),
        upfront_usd=float(item.get("UpfrontFee", "0") or 0),
        currency=item.get("CurrencyCode", "USD"),
    )


def _target(recipe: Recipe, profile: Profile, nodes: int | None) -> tuple[str, int, str | None]:
    s = settings_from(recipe, profile)
    return s.instance_type, nodes or s.nodes, s.region


def list_offerings(
    recipe: Recipe,
    profile: Profile,
    *,
    hours: int = 24,
    nodes: int | None = None,
    start_after: datetime | None = None,
    end_before: datetime | None = None,
    session: Session | None = None,
) -> list[Offering]:
    """Capacity Block offerings for the recipe's instance type and node count, cheapest first."""
    if hours < 24 or hours % 24:
        raise BadInput(
            f"--hours {hours}: Capacity Blocks last whole days; expected 24, 48, ... hours."
        )
    instance_type, count, region = _target(recipe, profile, nodes)
    session = make_session(region, session)
    ec2 = session.client("ec2", region_name=region or session.region_name)
    params: dict[str, Any] = {
        "InstanceType": instance_type,
        "InstanceCount": count,
        "CapacityDurationHours": hours,
    }
    if start_after:
        params["StartDateRange"] = start_after
    if end_before:
        params["EndDateRange"] = end_before
    try:
        items = ec2.describe_capacity_block_offerings(**params).get("CapacityBlockOfferings", [])
    except Exception as err:  # noqa: BLE001
        raise translate(
            err, f"listing Capacity Block offerings for {count} x {instance_type}"
        ) from err
    return sorted((_parse(i) for i in items), key=lambda o: (o.upfront_usd, o.start))


def format_offerings(offerings: list[Offering], on_demand_per_hour: float | None = None) -> str:
    if not offerings:
        return (
            "no Capacity Block offerings for this request; try other --hours, dates, or a region."
        )
    lines = [o.line() for o in offerings]
    if on_demand_per_hour:
        lines.append(f"(on-demand list price: ${on_demand_per_hour:.2f}/instance-hour)")
    lines.append(
        "A Capacity Block cannot be cancelled. "
        "To buy one: reproduce capacity RECIPE --buy <offering id>"
    )
    return "\n".join(lines)


def buy(
    recipe: Recipe,
    profile: Profile,
    offering_id: str,
    *,
    hours: int = 24,
    nodes: int | None = None,
    max_usd: float | None = None,
    start_after: datetime | None = None,
    end_before: datetime | None = None,
    session: Session | None = None,
    log: Callable[[str], Any] = lambda _line: None,
    yes: bool = False,
    confirm: Callable[[str], bool] | None = None,
) -> str:
    """Buy the listed offering `offering_id`; return the cr-... id.

    A purchase cannot be cancelled, so it needs the consent a launch needs
    (launcher/cost/costgate.py): the person at the terminal says yes (`confirm`, asked after the
    price is shown), `yes` (--yes) answers for them, or, with nobody at a terminal, a --max-usd that
    covers the price. Without a terminal and without either it is refused (exit 2) before any AWS
    call. In this order: the offering and its price are shown, --max-usd is checked, the question
    asked, and only then is "buying" said and the purchase sent. A refusal never reads as a
    purchase.
    """
    if max_usd is not None and not 0 < max_usd < math.inf:
        raise BadInput(f"--max-usd must be a positive number, got {max_usd:g}; nothing was bought.")
    if not yes and confirm is None and max_usd is None:
        raise BadInput(
            f"a Capacity Block ({offering_id}) cannot be cancelled once bought, and nobody is at "
            "a terminal to confirm its price, so nothing was bought.",
            hint="Pass --max-usd N (the purchase is refused above N dollars), or --yes to buy it "
            "at the price shown.",
        )
    offerings = list_offerings(
        recipe,
        profile,
        hours=hours,
        nodes=nodes,
        start_after=start_after,
        end_before=end_before,
        session=session,
    )
    match = [o for o in offerings if o.id == offering_id]
    if not match:
        raise BadInput(
            f"offering {offering_id} is not among the current offerings for this request "
            "(offerings change often); list them again and pick one."
        )
    offer = match[0]
    log(f"offering (a purchase cannot be cancelled): {offer.line()}")
    if max_usd is not None and not offer.upfront_usd <= max_usd:
        raise BadInput(
            f"offering {offer.id} costs {offer.upfront_usd:,.2f} {offer.currency}, "
            f"more than --max-usd {max_usd:g}; nothing was bought."
        )
    if not yes and confirm is not None and not confirm(BUY_QUESTION):
        raise NotConfirmed(f"not confirmed, so {offer.id} was not bought.")
    log(f"buying {offer.id} for {offer.upfront_usd:,.2f} {offer.currency}")
    _, _, region = _target(recipe, profile, nodes)
    session = make_session(region, session)
    ec2 = session.client("ec2", region_name=region or session.region_name)
    try:
        resp = ec2.purchase_capacity_block(
            CapacityBlockOfferingId=offer.id,
            InstancePlatform="Linux/UNIX",
            TagSpecifications=[
                {
                    "ResourceType": "capacity-reservation",
                    "Tags": [{"Key": TAG_RECIPE, "Value": str(recipe.slug)[:255]}],
                }
            ],
        )
    except Exception as err:  # noqa: BLE001
        raise translate(err, f"buying Capacity Block offering {offer.id}") from err
    reservation = (resp.get("CapacityReservation") or {}).get("CapacityReservationId")
    if not reservation:
        raise InfraError(
            f"the purchase of {offer.id} returned no capacity reservation id; "
            "check the EC2 console."
        )
    log(
        f"bought {reservation}: it starts {offer.start:%Y-%m-%d %H:%M} UTC in {offer.zone}. "
        "Put this in the aws profile:"
        f"\n  capacity:\n    type: capacity-block\n    reservation_id: {reservation}"
    )
    return reservation
