"""Instance prices ($/hour), in one table, overridable.

Why a table and not an API call: the verdict must be reproducible offline on a saved run
directory (measurement is a pure function), and prices change, so the price used is always
printed with where it came from. A profile or a flag overrides the table.

Only prices stated in the design notes (aws-p5en.md) are listed; an instance type that is not
here gives no $/1M figure rather than a guessed one.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import BadInput

TABLE_SOURCE = "AWS on-demand list price (design notes aws-p5en.md, 2026)"
DEFAULT_REGION = "us-east-1"

# instance type -> region -> USD per hour, on demand, Linux.
ON_DEMAND_USD_PER_HOUR: dict[str, dict[str, float]] = {
    "p5en.48xlarge": {
        "us-east-1": 63.296,
        "us-east-2": 63.296,
        "us-west-2": 63.296,
        "eu-north-1": 67.73,
        "us-west-1": 79.12,
    },
}


@dataclass(frozen=True)
class Price:
    """An hourly price and where it came from (printed beside every $ figure)."""

    value: float
    source: str
    instance_type: str | None = None
    region: str | None = None

    def to_dict(self) -> dict:
        return {
            "usd_per_hour": self.value,
            "source": self.source,
            "instance_type": self.instance_type,
            "region": self.region,
        }


def instance_type_of(instance: str | None) -> str | None:
    """'AWS p5en.48xlarge' -> 'p5en.48xlarge' (the recipe's gpu.instance names the cloud first)."""
    if not instance:
        return None
    return str(instance).split()[-1].strip()


def price_per_hour(
    instance_type: str | None, region: str | None = None, override: float | None = None
) -> Price | None:
    """The hourly price for one instance, or None when it is unknown (never a guess).

    `override` (from a profile or --price-per-hour) wins over the table. A region missing from
    the table raises BadInput: silently falling back to another region's price would misstate
    the cost.
    """
    itype = instance_type_of(instance_type)
    if override is not None:
        if override <= 0:
            raise BadInput(f"price override must be positive, got {override}")
        return Price(float(override), "override (profile or --price-per-hour)", itype, region)
    if itype is None or itype not in ON_DEMAND_USD_PER_HOUR:
        return None
    by_region = ON_DEMAND_USD_PER_HOUR[itype]
    chosen = region or DEFAULT_REGION
    if chosen not in by_region:
        known = ", ".join(sorted(by_region))
        raise BadInput(
            f"no price for {itype} in region {chosen!r} (known: {known}).",
            hint="Pass --price-per-hour to give one.",
        )
    note = "" if region else " (no region given: the default)"
    return Price(by_region[chosen], f"{TABLE_SOURCE}, {itype} {chosen}{note}", itype, chosen)
