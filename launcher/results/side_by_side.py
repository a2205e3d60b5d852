"""Two runs' figures side by side, for `compare`: what each run measured and how its verdict
stands, with the verdict's assurance level, before the loss curves are compared.

Why: a convergence PASS between two runs says their losses agree; it says nothing of whether
either run was fast, whole, or proven. So `compare` shows, for each side, the figures its
measurement gave (tokens/s per GPU, $ per 1M tokens, MFU, step-time CV, GPU-hours) and its verdict
with how strong its evidence is (launcher/judge/assurance.py). A run directory shows what its
measurement recorded (result.yaml, verdict.json); a bare log is measured here against the other
side's recipe when that side is a run directory (log only, by its nature), and otherwise has no
figures, said so: a log does not say which recipe it ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.errors import BadInput
from launcher.records import jsonread
from launcher.records.result_record import RecordedResult
from launcher.records.rundir import Files, read_yaml
from launcher.records.verdict_record import RecordedVerdict

FIGURES = (
    ("tokens_per_s_per_gpu", "tokens/s per GPU", 2),
    ("usd_per_million_tokens", "$ per 1M tokens", 3),
    ("mfu", "MFU", 4),
    ("step_time_cv_percent", "step-time CV %", 2),
    ("gpu_hours", "GPU-hours", 3),
)


@dataclass
class Side:
    """One run as `compare` shows it."""

    path: Path
    figures: dict[str, float | None] = field(default_factory=dict)
    verdict: str | None = None
    assurance: str | None = None
    source: str = ""  # where the figures come from, or why there are none

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "figures": dict(self.figures),
            "verdict": self.verdict,
            "assurance": self.assurance,
            "source": self.source,
        }


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _recorded(run_dir: Path) -> Side:
    side = Side(run_dir)
    try:
        verdict = jsonread.load_file(run_dir / Files.VERDICT)
        result = read_yaml(run_dir / Files.RESULT)
    except (jsonread.NodeJSONError, BadInput) as err:
        side.source = f"its measurement cannot be read ({err})"
        return side
    if not isinstance(verdict, dict) or not isinstance(result, dict):
        side.source = "not measured: no verdict.json and result.yaml"
        return side
    recorded = RecordedResult.of(result)
    for key, _, _ in FIGURES:
        side.figures[key] = recorded.figure(key)
    judged = RecordedVerdict.of(verdict)
    side.verdict = judged.status
    side.assurance = judged.assurance
    side.source = "as its measurement recorded them (result.yaml, verdict.json)"
    return side


def side_of(path: Path, other: Path) -> Side:
    """`path` as `compare` shows it beside `other` (module docstring)."""
    path = Path(path)
    if path.is_dir():
        return _recorded(path)
    if not (Path(other).is_dir() and (Path(other) / Files.RECIPE).is_file()):
        return Side(path, source="a bare log does not say which recipe it ran: no figures")
    from launcher.results.evaluate import measure_path, recipe_of

    recipe = recipe_of(Path(other))
    result, verdict = measure_path(path, recipe)
    figures = result.to_dict()
    return Side(
        path,
        {key: _number(figures.get(key)) for key, _, _ in FIGURES},
        verdict.status,
        verdict.assurance.level if verdict.assurance is not None else None,
        f"measured here against {Path(other) / Files.RECIPE} (a bare log: no host evidence)",
    )
