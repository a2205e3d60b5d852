"""result.yaml's figures read back, once, into a typed record: what the history row, `runs`
and `compare` read of a measured run.

Why a record: each reader picked the figures itself, the unrounded one from
`provenance.unrounded` first and the rounded one else, and checked their types on its own (one
of them read `provenance` as a mapping whatever it held). Here each figure is read once, a finite
number or None, whatever the file holds: a run directory is anyone's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from launcher.inputs.recipe import FIGURES
from launcher.records.jsonread import Fields
from launcher.records.rundir import read_yaml


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


@dataclass(frozen=True)
class RecordedResult:
    """One result.yaml as read back. `measured`: the file held a mapping."""

    measured: bool = False
    rounded: dict[str, float | None] = field(default_factory=dict)  # FIGURES as written
    unrounded: dict[str, float | None] = field(default_factory=dict)  # provenance.unrounded
    runs: int | None = None  # K measured runs whose mean the figures are (None: one run)

    def figure(self, name: str) -> float | None:
        """A figure of FIGURES, unrounded where the file keeps it, else as written."""
        value = self.unrounded.get(name)
        return value if value is not None else self.rounded.get(name)

    @classmethod
    def of(cls, document: object) -> RecordedResult:
        if not isinstance(document, dict):
            return cls()
        result = Fields(document)
        unrounded = result.obj("provenance").obj("unrounded")
        runs = result.raw("runs")
        return cls(
            measured=True,
            rounded={k: _number(result.raw(k)) for k in FIGURES},
            unrounded={k: _number(unrounded.raw(k)) for k in FIGURES},
            runs=runs
            if isinstance(runs, int) and not isinstance(runs, bool) and runs > 1
            else None,
        )

    @classmethod
    def read(cls, path: Path) -> RecordedResult:
        """The result.yaml at `path`; BadInput when it cannot be read as YAML (the callers
        decide whether that stops them), an absent file a result not measured."""
        return cls.of(read_yaml(Path(path)))
