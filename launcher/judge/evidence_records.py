"""The evidence gate's records: what it found (Evidence, Disagreement) and what the run owes it
(HostWatch), shared by the gate's checks (launcher/judge/evidence.py, host_evidence.py). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The span of logging stamps over consecutive steps may differ from the sum of their
# perf/step_time by this fraction (perf/step_time is train wait + train time, the loop's wall
# time; what else the loop does takes well under 5% in the runs measured) ... (also the host
# clock's tolerance, check 6)
STEP_TIME_TOLERANCE = 0.05


@dataclass(frozen=True)
class Disagreement:
    """One fact the evidence and the recipe (or two pieces of evidence) state differently."""

    # arguments | model | tokens per step | step times | steps | one value per step |
    # host clock | gpus busy
    check: str
    what: str  # the field or figure
    recipe: Any  # the recipe's value (or the first source's)
    evidence: Any  # the log's value (or the second source's)
    detail: str  # one sentence with both values

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "what": self.what,
            "recipe": self.recipe,
            "evidence": self.evidence,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class HostWatch:
    """Whether the run was launched with the host's clock and its GPU sampler on (read from the
    node script the run directory keeps: launcher/results/readback.py, `host_watch`). For such a
    run, checks 6 and 7 are owed: their evidence missing, unreadable or cut short fails closed,
    naming which. Without one (a bare log, a Ray cluster, runtime: host, docker.host_clock off, an
    older launcher's run) a check that cannot apply is named as not checked."""

    clock: bool
    sampler: bool

    def to_dict(self) -> dict[str, bool]:
        return {"clock": self.clock, "sampler": self.sampler}


@dataclass
class Evidence:
    """What the gate found: disagreements, the checks that ran, those that could not."""

    disagreements: list[Disagreement] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    cross: dict[str, Any] = field(default_factory=dict)  # the figures the checks compared

    @property
    def consistent(self) -> bool:
        return not self.disagreements

    def to_dict(self) -> dict[str, Any]:
        return {
            "consistent": self.consistent,
            "disagreements": [d.to_dict() for d in self.disagreements],
            "checked": list(self.checked),
            "not_checked": list(self.not_checked),
            "figures": dict(self.cross),
        }
