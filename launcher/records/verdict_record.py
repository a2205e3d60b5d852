"""verdict.json read back, once, into a typed record: what the history row, `runs`, `compare`
and the pages read of a judged run.

Why a record and not the mapping: verdict.json is read back from run directories that may have
been copied in from anyone or written by an older launcher, and each reader used to pick its
keys and check their types on its own (`status`, `difference_percent`, the claim's tokens/s, the
tolerance, the assurance level). Here each field is read once, of its type or None, so a reader
reads a field and a file that holds another shape is a value missing, never a crash. The file's
bytes are the judge's (launcher/judge/verdict.py, Verdict.to_dict); an attestation quotes the
file as written (launcher/results/attest_predicate.py), not this record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from launcher.inputs.recipe import Claim
from launcher.judge.assurance import level_of
from launcher.records import jsonread


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


# The keys read into fields above (the others are kept as written, in `others`).
_READ = frozenset({"status", "difference_percent", "reasons", "claimed", "measured", "tolerance"})


@dataclass(frozen=True)
class RecordedVerdict:
    """One verdict.json as read back. `judged`: the file held a JSON object with anything in it."""

    judged: bool = False
    status: str | None = None
    difference_percent: float | None = None  # signed: (measured - claimed) / claimed x 100
    reasons: tuple[str, ...] = ()
    claim: Claim | None = None  # the figures judged against (`claimed`), None without them
    slower_percent: float | None = None  # the tolerance it was judged with
    faster_percent: float | None = None
    error: str | None = None  # the log line of the error that ended training
    assurance: str | None = None  # the level (launcher/judge/assurance.py), None: not recorded
    # the assurance as the file states it, shown as written: its level (any text) and why
    assurance_stated: tuple[str, str] | None = None
    # every other key, in the file's order, as written: a verdict's evidence beyond the fields
    # above (a mismatch's disagreements, the policy, K runs), shown whatever shape it takes
    others: tuple[tuple[str, object], ...] = ()

    @classmethod
    def of(cls, document: object) -> RecordedVerdict:
        """The record of a decoded verdict.json (anything else: a verdict not judged)."""
        if not isinstance(document, dict):
            return cls()
        fields = jsonread.Fields(document)
        claimed = document.get("claimed")
        tolerance = fields.obj("tolerance")
        reasons = document.get("reasons")
        found = document.get("assurance")
        stated = None
        if isinstance(found, dict) and isinstance(found.get("level"), str):
            stated = (found["level"], str(found.get("why") or ""))
        return cls(
            judged=bool(document),
            status=fields.text("status"),
            difference_percent=_number(fields.raw("difference_percent")),
            reasons=tuple(r for r in reasons if isinstance(r, str))
            if isinstance(reasons, list)
            else (),
            claim=Claim.of_block(claimed) if isinstance(claimed, dict) else None,
            slower_percent=_number(tolerance.raw("slower_percent")),
            faster_percent=_number(tolerance.raw("faster_percent")),
            error=fields.text("error"),
            assurance=level_of(document),
            assurance_stated=stated,
            others=tuple((str(k), v) for k, v in document.items() if k not in _READ),
        )

    @classmethod
    def read(cls, path: Path) -> RecordedVerdict:
        """The verdict.json at `path` (bounded: launcher/records/jsonread.py); an absent or
        unreadable file is a verdict not judged."""
        return cls.of(jsonread.read(Path(path)).value)
