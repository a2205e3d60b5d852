"""One log read once, through the evidence gate, for every reader that is not `measure`.

Why: `measure` judges a log through launcher/judge/measure.py (which runs
launcher/judge/evidence.py's gate and launcher/judge/failures.py's rules); `compare` and a
measurement's `--reference` read loss curves, through launcher/results/evaluate.py's `read_log`
(the one reader of files), which hands each log to `assess` here.
If those readers parsed on their own, they could pass a log `measure` calls unreadable or a
mismatch (`compare` would keep the first of two different losses of a replayed step, and call a
gzip file a convergence FAIL). So every reader gets a log's steps from `assess`, which applies
the same rules as the verdict: readability (measure.unreadable), one value per step
(evidence.one_value), lines only half understood (failures), and the identity the log itself
prints (Megatron's arguments listing). The run directory's files (verdict.json, result.yaml) are
what the report pages, `history` and `nightly` read: they hold this same evidence, written once
by launcher/results/evaluate.py. Pure apart from reading the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launcher.inputs.runargs import checked_dests
from launcher.judge.evidence import one_value
from launcher.judge.failures import find_failures
from launcher.judge.identity import MODEL_ARGS
from launcher.judge.measure import unreadable
from launcher.judge.parse.records import ParseStats, StepRecord


@dataclass
class LogEvidence:
    """One log's steps after the gate, and what the gate found."""

    path: Path
    records: list[StepRecord]
    stats: ParseStats | None
    unreadable: str | None = None  # why it cannot be read as miles' (then nothing else counts)
    conflicts: list[str] = field(default_factory=list)  # one value per step, broken
    half_read: list[str] = field(default_factory=list)  # lines only half understood
    recipe: str | None = None  # the recipe slug of a run directory (None: a bare log)
    arguments: dict[str, str] = field(default_factory=dict)  # the compared printed arguments

    @property
    def sound(self) -> bool:
        """Readable, one value per step, nothing half understood: its steps may be used."""
        return self.unreadable is None and not self.conflicts and not self.half_read

    def problems(self) -> list[str]:
        return ([self.unreadable] if self.unreadable else []) + self.conflicts + self.half_read


def assess(
    path: Path, records: list[StepRecord], stats: ParseStats | None, recipe: str | None
) -> LogEvidence:
    """One log's steps and counters through the gate (evaluate.read_log reads them)."""
    recs = {r.step: r for r in reversed(records)}
    findings = find_failures(recs, stats, None)
    wanted = set(checked_dests()) | set(MODEL_ARGS)  # the layout's and the model's
    return LogEvidence(
        path=Path(path),
        records=records,
        stats=stats,
        unreadable=unreadable(recs, stats, [], findings),
        conflicts=[d.detail for d in one_value(stats)],
        half_read=findings.half_read,
        recipe=recipe,
        arguments={k: v for k, v in (stats.arguments if stats else {}).items() if k in wanted},
    )


def argument_differences(a: LogEvidence, b: LogEvidence) -> list[str]:
    """The compared arguments both logs printed with different values ("name: x vs y")."""
    return [
        f"{name}: {a.arguments[name]} vs {b.arguments[name]}"
        for name in sorted(set(a.arguments) & set(b.arguments))
        if a.arguments[name] != b.arguments[name]
    ]
