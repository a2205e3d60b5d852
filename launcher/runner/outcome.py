"""How a run ended, and what the user is told about it: the exit code and a failed stage's message.

Exit codes (docs/architecture.md, "Exit codes"): 0 reproduced (or not judged), 1 a check of the
recipe said no (judged not reproduced, the image's stack differs, training failed), 2 bad input,
3 the infrastructure failed, 130 cancelled or interrupted. Failures raise the matching
ReproduceError; a run that ended returns an Outcome.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import CheckFailed, InfraError, Interrupted, ReproduceError
from launcher.rundir import TRAIN_STAGE, RunDir, Timeline

if TYPE_CHECKING:
    from launcher.measure import Result
    from launcher.verdict import Verdict

# A failed stage of these is a check of the recipe that said no (exit 1: the image's stack differs
# from the recipe's, or training failed and was judged). Any other failed stage is the
# infrastructure's (exit 3): a node that fails the preflight (too few GPUs, a bad GPU, no EFA), no
# docker, a pull or a download that failed, Ray that did not start.
CHECK_STAGES = frozenset({"stack", TRAIN_STAGE})
_TAIL_LINES = 8
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@dataclass
class Outcome:
    """How a run ended, as the runner knows it; `measurement` is (Result, Verdict) when judged."""

    state: str  # done | failed | cancelled | detached
    exit_code: int | None  # the node script's
    run_dir: Path
    measurement: tuple[Result, Verdict] | None = None


def exit_code_of(outcome: Outcome) -> int:
    """The command's exit code: 0 done and, where judged, reproduced; 1 judged not reproduced."""
    if outcome.state != "done":
        return Interrupted.exit_code if outcome.state == "cancelled" else InfraError.exit_code
    if outcome.measurement is None:
        return 0
    return 0 if outcome.measurement[1].reproduced else CheckFailed.exit_code


def failed_stage(timeline: Timeline) -> str | None:
    failed = [s for s in timeline.stages if s["status"] not in ("ok", "running")]
    return failed[-1]["name"] if failed else None


def check_detail(rd: RunDir, stage: str | None) -> str | None:
    """What a failed check measured, from the node's report (preflight*.json, stack.json)."""
    if stage in ("preflight", "preflight-gpu"):
        path = rd.path / f"{stage}.json"
        if not path.exists():
            return None
        from launcher.preflight import parse_report

        try:
            return parse_report(path.read_text(errors="replace")).summary()
        except ReproduceError:
            return None
    if stage == "stack":
        report = rd.read_json("stack.json", None) or {}
        bad = [c for c in report.get("checks", []) if not c.get("ok")]
        if bad:
            return "the image's software differs from the recipe's stack: " + "; ".join(
                f"{c.get('name')}: {c.get('value')} (expected {c.get('expected')})" for c in bad
            )
    return None


def failure(rd: RunDir, timeline: Timeline, code: int | None) -> tuple[str | None, ReproduceError]:
    """The failed stage, and the error that says where the script failed and what it printed last.

    CheckFailed (exit 1) for a check of the recipe, InfraError (exit 3) for everything else.
    """
    stage = failed_stage(timeline)
    log = rd.logs / f"{stage}.log" if stage else rd.logs / "node.log"
    tail = ""
    if log.exists():
        lines = log.read_bytes().decode(errors="replace").rstrip("\n").splitlines()[-_TAIL_LINES:]
        # the node's bytes reach the user's terminal: no control sequences among them
        lines = [_CONTROL.sub("?", line) for line in lines]
        tail = "\n  " + "\n  ".join(lines) if lines else ""
    where = f"in stage {stage} " if stage else ""
    how = f"with exit code {code}" if code is not None else "without an exit code (killed?)"
    message = f"the node script failed {where}{how}; see {log}.{tail}"
    detail = check_detail(rd, stage)
    if detail:
        message = f"{detail}\n{message}"
    error: ReproduceError = CheckFailed(message) if stage in CHECK_STAGES else InfraError(message)
    return stage, error


def reattach_hint(rd: RunDir) -> str:
    return f"Reattach with `reproduce attach {rd.path}`; stop it with `reproduce cancel {rd.path}`."
