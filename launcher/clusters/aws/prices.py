"""The price of a run on AWS, looked up live before its cost is shown; the catalog when it fails.

Why live: AWS changes GPU prices (it cut P4 and P5 by up to 45% in June 2025), a spot price moves
by the hour, and a Capacity Block is priced per offering; a table in the launcher is stale the
day after it is written. Why the catalog still: the dry run asks nothing, and a lookup that
fails (no permission, no route, an answer that cannot be read) must never stop a run, so the
catalog's figure stands in and the run says which was used and why. What each capacity type
costs, and how it is read:

- on-demand and reservation (an On-Demand Capacity Reservation bills at the on-demand rate):
  the Price List Query API, `pricing:GetProducts` for AmazonEC2 with the instance type, the
  region (`regionCode`), Linux, shared tenancy, no pre-installed software, capacitystatus Used
  and no licence; its endpoints are us-east-1 and ap-south-1 only, whatever the run's region.
  The answer's PriceList items are JSON documents as strings.
- spot: `ec2:DescribeSpotPriceHistory` for Linux/UNIX from now, the latest price of each zone,
  and the highest of them (the launch may land in any zone offering the type).
- capacity-block: `ec2:DescribeCapacityBlockOfferings` for the recipe's nodes and one day, the
  cheapest offering's UpfrontFee per instance-hour (what a block of this shape costs now; the
  block a run uses was paid for when bought).

Every request is built once (`request`), printed by the dry run and sent by a real run and by
`--check`. boto3 is imported only when a lookup runs.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from launcher.catalog import Price, with_fallback
from launcher.clusters.aws import requests as rq
from launcher.clusters.aws.session import error_code, error_message, snake
from launcher.records import jsonread

if TYPE_CHECKING:
    from boto3.session import Session
    from botocore.client import BaseClient

    from launcher.clusters.aws.requests import Service
    from launcher.clusters.aws.settings import AwsSettings
    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe

PRICING_REGIONS = ("us-east-1", "ap-south-1")  # the Price List Query API's endpoints
SOURCE_OF = {
    "on-demand": "price-list-api",
    "reservation": "price-list-api",
    "spot": "spot-history",
    "capacity-block": "capacity-block",
}
BLOCK_HOURS = 24  # the shortest Capacity Block: its rate is the one quoted


class LookupFailed(Exception):
    """Why a live price could not be had (the catalog's is used instead)."""


def pricing_region(region: str) -> str:
    """The Price List endpoint nearer the run's region (there are only two)."""
    return "ap-south-1" if region.startswith(("ap-", "me-", "af-")) else PRICING_REGIONS[0]


def request(
    instance_type: str, region: str, capacity_type: str, nodes: int, now: datetime | None
) -> rq.ApiCall:
    """The one lookup for a capacity type (`now` None: the dry run's placeholder)."""
    if capacity_type == "spot":
        return rq.ApiCall(
            "ec2",
            "DescribeSpotPriceHistory",
            {
                "InstanceTypes": [instance_type],
                "ProductDescriptions": ["Linux/UNIX"],
                "StartTime": now if now is not None else rq.placeholder("now"),
            },
            f"the spot price of {instance_type} in each zone of {region} now (the highest is used)",
        )
    if capacity_type == "capacity-block":
        return rq.ApiCall(
            "ec2",
            "DescribeCapacityBlockOfferings",
            {
                "InstanceType": instance_type,
                "InstanceCount": nodes,
                "CapacityDurationHours": BLOCK_HOURS,
            },
            "a Capacity Block's price now: the cheapest offering's UpfrontFee per instance-hour",
        )
    term = {"Type": "TERM_MATCH"}
    return rq.ApiCall(
        "pricing",
        "GetProducts",
        {
            "ServiceCode": "AmazonEC2",
            "FormatVersion": "aws_v1",
            "Filters": [
                {**term, "Field": "instanceType", "Value": instance_type},
                {**term, "Field": "regionCode", "Value": region},
                {**term, "Field": "operatingSystem", "Value": "Linux"},
                {**term, "Field": "tenancy", "Value": "Shared"},
                {**term, "Field": "preInstalledSw", "Value": "NA"},
                {**term, "Field": "capacitystatus", "Value": "Used"},
                {**term, "Field": "licenseModel", "Value": "No License required"},
            ],
            "MaxResults": 10,
        },
        f"the on-demand price of {instance_type} in {region} (Price List API, endpoint "
        f"{pricing_region(region)}; an On-Demand Capacity Reservation bills the same)",
    )


def on_demand_usd(answer: dict[str, Any], instance_type: str, region: str) -> float:
    """The hourly USD price in a GetProducts answer (its PriceList items are JSON strings)."""
    found: set[float] = set()
    for item in answer.get("PriceList") or []:
        try:
            doc = jsonread.loads(item) if isinstance(item, str) else item
            attrs = doc["product"]["attributes"]
            terms = doc["terms"]["OnDemand"].values()
        except (TypeError, jsonread.NodeJSONError, KeyError, AttributeError):
            raise LookupFailed("the Price List answer is not AWS's product document") from None
        if attrs.get("instanceType") != instance_type or attrs.get("regionCode") not in (
            None,
            region,
        ):
            continue
        for term in terms:
            for dim in (term.get("priceDimensions") or {}).values():
                usd = _usd((dim.get("pricePerUnit") or {}).get("USD"))
                if dim.get("unit") == "Hrs" and usd:
                    found.add(usd)
    if not found:
        raise LookupFailed(
            f"the Price List lists no on-demand Linux price for {instance_type} in {region}"
        )
    if len(found) > 1:
        listed = ", ".join(f"${v:g}" for v in sorted(found))
        raise LookupFailed(f"the Price List gives {len(found)} different prices ({listed})")
    return found.pop()


def spot_usd(answer: dict[str, Any]) -> tuple[float, str]:
    """The highest of each zone's latest spot price, and the zones' prices in words."""
    latest: dict[str, tuple[Any, float]] = {}
    for row in answer.get("SpotPriceHistory") or []:
        zone, usd = str(row.get("AvailabilityZone") or "?"), _usd(row.get("SpotPrice"))
        when = row.get("Timestamp")
        if usd and (zone not in latest or (when is not None and when > latest[zone][0])):
            latest[zone] = (when, usd)
    if not latest:
        raise LookupFailed("the spot price history has no Linux/UNIX price for this type now")
    words = ", ".join(f"{z} ${usd:g}" for z, (_, usd) in sorted(latest.items()))
    return max(usd for _, usd in latest.values()), words


def block_usd(answer: dict[str, Any]) -> tuple[float, str]:
    """The cheapest offering's UpfrontFee per instance-hour, and which offering it is."""
    best: tuple[float, str] | None = None
    for offer in answer.get("CapacityBlockOfferings") or []:
        fee, hours = _usd(offer.get("UpfrontFee")), offer.get("CapacityBlockDurationHours")
        count = offer.get("InstanceCount")
        if not fee or not isinstance(hours, int) or not isinstance(count, int):
            continue
        if hours * count <= 0:
            continue
        rate = fee / (hours * count)
        what = (
            f"{offer.get('CapacityBlockOfferingId', '?')}: {fee:,.2f} "
            f"{offer.get('CurrencyCode', 'USD')} upfront for {count} x {hours} h"
        )
        if best is None or rate < best[0]:
            best = (rate, what)
    if best is None:
        raise LookupFailed("no Capacity Block offering was answered for this type and count")
    return best


def look_up(
    settings: AwsSettings,
    region: str,
    client: Callable[[Service, str], BaseClient],
    now: datetime,
) -> Price:
    """The live price for the profile's capacity type; LookupFailed saying why not."""
    ctype, itype = settings.capacity_type, settings.instance_type
    call = request(itype, region, ctype, settings.nodes, now)
    where = pricing_region(region) if call.service == "pricing" else region
    try:
        method = getattr(client(call.service, where), snake(call.operation))
        answer = method(**call.params)
    except LookupFailed:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of a lookup means: use the catalog
        code = error_code(err)
        said = f"{code}: {error_message(err)}" if code else f"{type(err).__name__}: {err}"
        raise LookupFailed(f"{call.operation} failed ({said})") from err
    read_at = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if ctype == "spot":
        usd, words = spot_usd(answer)
        detail = f"DescribeSpotPriceHistory in {region}, Linux/UNIX: the highest zone of {words}"
    elif ctype == "capacity-block":
        usd, words = block_usd(answer)
        detail = f"DescribeCapacityBlockOfferings in {region}, the cheapest offering {words}"
    else:
        usd = on_demand_usd(answer, itype, region)
        detail = (
            f"Price List API GetProducts (endpoint {where}): AmazonEC2 {itype} in {region}, "
            "Linux, shared tenancy, on-demand"
        )
    return Price(usd, SOURCE_OF.get(ctype, "price-list-api"), itype, region, read_at, detail)


def live_price(
    recipe: Recipe,
    profile: Profile,
    fallback: Price | None,
    *,
    session: Session | None = None,
    now: datetime | None = None,
) -> tuple[Price | None, str | None]:
    """The run's price from AWS, or the fallback (the catalog's, maybe None) and why.

    Never raises for a failed lookup: a missing permission, no route to the endpoint or an
    answer that cannot be read leaves the catalog's price, with the reason for the run to show.
    """
    from launcher.clusters.aws.session import make_session
    from launcher.clusters.aws.settings import settings_from

    settings = settings_from(recipe, profile)
    try:
        session = make_session(settings.region, session)
        region = settings.region or session.region_name
        price = look_up(settings, region, _clients(session), now or datetime.now(UTC))
    except Exception as err:  # noqa: BLE001 - a lookup never stops a run (docs/aws.md)
        kept = (
            f"the catalog's ${fallback.value:g}/h is used"
            if fallback is not None
            else "no price is known (the catalog has none)"
        )
        why = f"live price lookup failed: {err}; {kept}"
        return (with_fallback(fallback, why) if fallback is not None else None), why
    return price, None


def _clients(session: Session) -> Callable[[Service, str], BaseClient]:
    from botocore.config import Config

    # A lookup may not hold the run up: two tries, short timeouts, then the catalog.
    config = Config(
        retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=10
    )
    return lambda service, region: session.client(service, region_name=region, config=config)


def _usd(value: object) -> float | None:
    try:
        if not isinstance(value, int | float | str):
            return None
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if 0 < number < float("inf") else None
