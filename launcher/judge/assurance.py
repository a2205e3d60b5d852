"""How strong a verdict's evidence is: its assurance level, decided here alone.

Why: "reproduced" says the figures held; it does not say who vouched for the figures. A run whose
host clocked the step lines and watched the GPUs work proves its pace with evidence the
recipe's code cannot forge; a log measured as a file proves only that the log agrees with itself
and the recipe; a run on a cluster that ran the launcher's checks as its own job (a Ray cluster)
proves what that cluster said. A forged Ray result must never read "reproduced" as if the
launcher had held its boundary, so every surface that shows a verdict shows its level beside it
(docs/measurement.md, "Assurance levels"): the run's verdict.json carries it, and the history,
nightly's summary, compare and the pages read it from there.

The decision takes two facts: the run's evidence (which checks ran: launcher/judge/evidence.py)
and whether the run's cluster vouched for its own checks (launcher/clusters/trust.py says which
kinds do; it passes the answer in, so this module stays below it). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The levels, strongest first.
HOST_VERIFIED = "host-verified"
LOG_ONLY = "log-only"
CLUSTER_VOUCHED = "cluster-vouched"
LEVELS = (HOST_VERIFIED, LOG_ONLY, CLUSTER_VOUCHED)
# How each level is said beside a status: `reproduced (host-verified)`.
_MEANING = {
    HOST_VERIFIED: (
        "the host's clock saw the window paced as claimed and the host saw the GPUs at work, "
        "behind the launcher's trust boundary"
    ),
    LOG_ONLY: (
        "the log agrees with itself and with the recipe; no host clock or GPU samples held it "
        "(a log measured as a file, docker.host_clock off, or an older run)"
    ),
    CLUSTER_VOUCHED: (
        "the run's cluster ran the launcher's checks as its own job and vouched for them; the "
        "launcher did not verify its image, its checks or its host"
    ),
}
# The checks whose passing makes a run's evidence the host's (evidence.py's `checked` lines).
_HOST_CHECKS = ("the host's clock:", "the GPUs at work:")


@dataclass(frozen=True)
class Assurance:
    level: str  # one of LEVELS
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"level": self.level, "why": self.why}


def decide(checked: Sequence[str], *, vouched: bool) -> Assurance:
    """The level of a verdict whose gate ran `checked` (evidence.py's lines), on a run whose
    cluster did (`vouched`) or did not vouch for its own checks."""
    if vouched:
        return Assurance(CLUSTER_VOUCHED, _MEANING[CLUSTER_VOUCHED])
    if all(any(line.startswith(check) for line in checked) for check in _HOST_CHECKS):
        return Assurance(HOST_VERIFIED, _MEANING[HOST_VERIFIED])
    return Assurance(LOG_ONLY, _MEANING[LOG_ONLY])


def weakest(found: Sequence[Assurance | None]) -> Assurance | None:
    """The level of a whole made of several runs (a mean of K): its weakest run's; None when a
    run has none."""
    if not found or any(a is None for a in found):
        return None
    return max((a for a in found if a is not None), key=lambda a: LEVELS.index(a.level))


def level_of(verdict: Mapping[str, object] | None) -> str | None:
    """A recorded verdict's level (verdict.json's `assurance.level`), None where it has none (a
    verdict of an older launcher, or none at all)."""
    found = verdict.get("assurance") if isinstance(verdict, Mapping) else None
    level = found.get("level") if isinstance(found, Mapping) else None
    return level if isinstance(level, str) and level in LEVELS else None


def shown(status: str | None, level: str | None) -> str:
    """A status as every surface shows it: with its level (`reproduced (cluster-vouched)`);
    a recorded verdict without one says so (`reproduced (assurance not recorded)`)."""
    if status is None:
        return "-"
    return f"{status} ({level if level in LEVELS else 'assurance not recorded'})"
