"""A nightly's records: how each recipe's reproduction ended, and its entry in the night.

Why here and not beside the nightly (launcher/runner/nightly.py): the night's page
(launcher/pages/nightly_page.py) reads them, and pages sit below the runner; as records of what
the night left they belong with the history rows they hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launcher.records.history import Assessment, RunRow


@dataclass
class RecipeRun:
    """How one recipe's reproduction ended: the exit code `reproduce RECIPE` would have given."""

    recipe: Path
    code: int
    run_dir: Path | None = None
    error: str | None = None
    crashed: bool = False  # an unexpected exception, not one of reproduce's errors
    cancelled: bool = False  # cancelled from outside (`reproduce cancel`): the nightly goes on


@dataclass
class NightlyEntry:
    recipe: Path
    run: RecipeRun
    row: RunRow
    assessment: Assessment
    # reproduced | suspect | regression | check failed | invalid | infra | error | interrupted
    outcome: str

    @property
    def failed(self) -> bool:
        return self.outcome != "reproduced"
