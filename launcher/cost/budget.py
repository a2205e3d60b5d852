"""The budget guard: `--max-usd` and `--max-hours` stop a run before it costs more than allowed.

Why here and not in a backend: every backend's runner calls `check()` while it streams, and the
refusal before launch must use the same arithmetic, so both live in one small class. Cost is
price per node-hour x nodes x wall-clock hours since the nodes were acquired.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.errors import BadInput

if TYPE_CHECKING:
    from launcher.inputs.recipe import Recipe


@dataclass(frozen=True)
class Budget:
    """Limits on one run: dollars (all nodes together) and wall-clock hours."""

    max_usd: float | None
    max_hours: float | None
    price_per_hour: float | None  # one node, $/h; None: unknown (max_usd then cannot be checked)
    nodes: int = 1

    def __post_init__(self) -> None:
        # NaN compares false with everything: a NaN limit or price would never stop a run.
        for name in ("max_usd", "max_hours"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise BadInput(
                    f"--{name.replace('_', '-')} must be a positive number, got {value:g}."
                )
        price = self.price_per_hour
        if price is not None and not 0 < price < math.inf:
            raise BadInput(
                f"the node's price must be a positive number of dollars per hour, got {price:g}.",
                hint="Check price_per_hour in the profile or --price-per-hour.",
            )
        if self.max_usd is not None and not self.price_per_hour:
            raise BadInput(
                "--max-usd needs a price, and none is known for this instance type and region.",
                hint="Set price_per_hour in the profile or pass --price-per-hour.",
            )

    @classmethod
    def for_recipe(
        cls,
        recipe: Recipe,
        price_per_hour: float | None,
        max_usd: float | None,
        max_hours: float | None,
    ) -> Budget:
        """The budget of one run of `recipe` (its nodes) at a node price (launcher.catalog)."""
        return cls(max_usd, max_hours, price_per_hour, int(recipe.nodes))

    @staticmethod
    def expected_hours(recipe: Recipe) -> float | None:
        """Wall-clock hours the recipe's claim implies: result.gpu_hours / gpu.count (or None)."""
        gpu_hours = recipe.claimed_gpu_hours
        return None if gpu_hours is None else float(gpu_hours) / int(recipe.gpu_count)

    @property
    def usd_per_hour(self) -> float:
        """What the whole run costs per wall-clock hour."""
        return (self.price_per_hour or 0.0) * self.nodes

    def cost(self, elapsed_s: float) -> float:
        return self.usd_per_hour * max(0.0, elapsed_s) / 3600.0

    def check(self, elapsed_s: float) -> str | None:
        """Why the run must stop now (a sentence for the user), or None while within the limits."""
        hours = max(0.0, elapsed_s) / 3600.0
        if self.max_hours is not None and hours >= self.max_hours:
            return (
                f"the run has used {hours:.2f} h of wall-clock time, reaching --max-hours "
                f"{self.max_hours:g} (${self.cost(elapsed_s):.2f} so far at "
                f"${self.usd_per_hour:.2f}/h)"
            )
        if self.max_usd is not None and self.cost(elapsed_s) >= self.max_usd:
            return (
                f"the run has cost ${self.cost(elapsed_s):.2f} ({hours:.2f} h x "
                f"${self.usd_per_hour:.2f}/h for {self.nodes} node{'s' if self.nodes != 1 else ''}"
                f"), reaching --max-usd {self.max_usd:g}"
            )
        return None

    def refuse_if_over(self, expected_hours: float | None) -> None:
        """BadInput before anything launches when the run is expected to exceed a limit.

        `expected_hours` is wall-clock hours (the recipe's result.gpu_hours / gpu.count).
        """
        if expected_hours is None:
            return
        expected_usd = self.usd_per_hour * expected_hours
        if self.max_usd is not None and expected_usd > self.max_usd:
            raise BadInput(
                f"the recipe is expected to take {expected_hours:.2f} h on {self.nodes} node"
                f"{'s' if self.nodes != 1 else ''} at ${self.usd_per_hour:.2f}/h = "
                f"${expected_usd:.2f}, more than --max-usd {self.max_usd:g}; nothing was launched.",
                hint="Raise --max-usd, or drop it to run without a dollar limit.",
            )
        if self.max_hours is not None and expected_hours > self.max_hours:
            raise BadInput(
                f"the recipe is expected to take {expected_hours:.2f} h, more than --max-hours "
                f"{self.max_hours:g}; nothing was launched.",
                hint="Raise --max-hours.",
            )
