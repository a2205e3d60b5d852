"""How a run ended, and what the user is told about it: the exit code and a failed stage's message.

Exit codes (docs/architecture.md, "Exit codes"): 0 reproduced (or not judged), 1 a check of the
recipe said no (judged not reproduced, the image's stack differs, training failed), 2 bad input,
3 the infrastructure failed, 130 cancelled or interrupted. Failures raise the matching
ReproduceError; a run that ended returns an Outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.clusters.contract import WithDownCommand, WithNodeAfterRun
from launcher.errors import BadInput, CheckFailed, InfraError, Interrupted, ReproduceError
from launcher.excerpt import MAX_LINES, clip, log_tail
from launcher.plan.protocol import ASSET_PLAN_FILE
from launcher.records import jsonread
from launcher.records.rundir import TRAIN_STAGE, Files, RunDir, Timeline

if TYPE_CHECKING:
    from launcher.judge.measure import Result
    from launcher.judge.verdict import Verdict

# A failed stage of these is a check of the recipe that said no (exit 1: the image's stack differs
# from the recipe's, or training failed and was judged). Any other failed stage is the
# infrastructure's (exit 3): a node that fails the preflight (too few GPUs, a bad GPU, no EFA), no
# docker, a pull or a download that failed, Ray that did not start.
CHECK_STAGES = frozenset({"stack", TRAIN_STAGE})
# These stages' node programs exit 1 when the recipe's assets say no (an asset nobody can supply,
# rows or a tokenizer whose hash differs from the recipe's: a check) and 3 when the network, the
# store or the disk failed (infrastructure); docs/assets.md, "The node programs".
CHECK_ON_EXIT_1 = frozenset({"resolve", "rows", "assets"})
_TAIL_LINES = 8


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
    """The stage that failed first; stages stopped because it failed (status stopped) or by a
    cancel are named only when none failed (docs/node-scripts.md, "What runs at once")."""
    failed = [s for s in timeline.stages if s.status == "failed"]
    if failed:
        ended = [(s.end, i, s.name) for i, s in enumerate(failed) if s.end is not None]
        return min(ended)[2] if ended else failed[-1].name
    other = [s for s in timeline.stages if s.status not in ("ok", "running")]
    return other[-1].name if other else None


def check_detail(rd: RunDir, stage: str | None, where: Path | None = None) -> str | None:
    """What a failed check measured, from the node's report (preflight*.json, stack.json,
    assets-plan.json) in `where` (the run dir for node 0; logs/node-K for node K); None when
    there is none. The reports are the node's output, hostile (the GPU preflight and the stack
    probe run in the recipe's image): read through launcher/records/jsonread.py, so a report of
    any shape gives words or None here, never an exception, and the run still gets its exit code.
    """
    where = where if where is not None else rd.path
    if stage in ("preflight", "preflight-gpu"):
        from launcher.plan.preflight import parse_report

        try:
            text = jsonread.read_text(where / f"{stage}.json")
            return parse_report(text).summary() if text is not None else None
        except ReproduceError:
            return None
    if stage == "resolve":
        plan = jsonread.read(where / ASSET_PLAN_FILE).fields
        # each reason on a line of its own (scripts/asset_resolve.py), each line bounded
        lines = [ln for p in plan.words("problems") for ln in p.splitlines()]
        shown = [clip(ln) for ln in lines[: MAX_LINES * 3]]
        if len(lines) > len(shown):
            shown.append(f"[... {len(lines) - len(shown)} more lines in {ASSET_PLAN_FILE}]")
        if shown:
            return "the run's assets cannot all be supplied:\n  " + "\n  ".join(shown)
    if stage == "stack":
        report = jsonread.read(where / Files.STACK).fields
        bad = [c for c in report.records("checks") if c.flag("ok") is not True]
        if bad:
            return "the image's software differs from the recipe's stack: " + "; ".join(
                clip(
                    f"{c.word('name', '?')}: {c.word('value', 'None')} "
                    f"(expected {c.word('expected', 'None')})"
                )
                for c in bad[:MAX_LINES]
            )
    return None


def failure(
    rd: RunDir,
    timeline: Timeline,
    code: int | None,
    *,
    logs: Path | None = None,
    node: str | None = None,
) -> tuple[str | None, ReproduceError]:
    """The failed stage, and the error that says where the script failed and what it printed last.

    CheckFailed (exit 1) for a check of the recipe, InfraError (exit 3) for everything else. For a
    run of several nodes, `node` names the one ("node 2 (10.0.0.3)") and `logs` is its log dir.
    """
    stage = failed_stage(timeline)
    logs = logs if logs is not None else rd.logs
    log = logs / f"{stage}.log" if stage else logs / "node.log"
    if not log.is_file():  # the stage printed nothing: its output went to its report, if any
        log = logs / "node.log"
    tail = tail_of(log)
    where = f"in stage {stage} " if stage else ""
    try:  # a damaged plan.json must not hide why the run failed
        runs = ((rd.read_json(Files.PLAN) or {}).get("runs") or {}).get("measured")
    except (BadInput, AttributeError):
        runs = None
    if stage == TRAIN_STAGE and isinstance(runs, int) and runs > 1:  # which run: measured/<k>
        k = sum(s.name == TRAIN_STAGE for s in timeline.stages)
        where = f"in stage train (measured run {k} of {runs}, {Files.measured_run(k)}) "
    how = f"with exit code {code}" if code is not None else "without an exit code (killed?)"
    on = f" on {node}" if node else ""
    report = report_of(rd, stage, logs)
    see = f"see {report} (its report) and {log}" if report else f"see {log}"
    message = f"the node script failed{on} {where}{how}; {see}.{tail}"
    detail = check_detail(rd, stage, None if logs == rd.logs else logs)
    if detail:
        message = f"{detail}\n{message}"
    check = stage in CHECK_STAGES or (stage in CHECK_ON_EXIT_1 and code == 1)
    error: ReproduceError = CheckFailed(message) if check else InfraError(message)
    return stage, error


def report_of(rd: RunDir, stage: str | None, logs: Path) -> Path | None:
    """The file a checking stage wrote its findings to (preflight.json, preflight-gpu.json,
    stack.json), when the node sent it back: what a person should open first."""
    if stage not in ("preflight", "preflight-gpu", "stack"):
        return None
    path = (rd.path if logs == rd.logs else logs) / f"{stage}.json"
    return path if path.is_file() else None


def tail_of(log: Path) -> str:
    """The last lines of a log, indented on lines of their own ("" when there are none)."""
    # bounded (launcher/excerpt.py): read from the log's end, each line clipped, no control
    # sequences (the node's bytes reach the user's terminal)
    lines = log_tail(log, _TAIL_LINES)
    return "\n  " + "\n  ".join(lines) if lines else ""


def detached_message(rd: RunDir, cluster: object) -> str:
    """What a person who chose to detach needs next: the run goes on (and what it costs, for a
    node this run launched), how to follow its log, take it back, or stop it. By run id: the
    user's index finds it from any directory."""
    record = rd.record()
    run_id = record.get("run_id") or rd.path.name
    cost = ""
    if isinstance(cluster, WithDownCommand):  # a node this run launched
        price = (record.get("cost") or {}).get("price_per_hour")
        nodes = (record.get("cost") or {}).get("nodes") or 1
        rate = price * nodes if isinstance(price, (int, float)) else None
        then = f": {cluster.node_after_run()}" if isinstance(cluster, WithNodeAfterRun) else ""
        cost = (
            f"; its node keeps billing (about ${rate:,.2f}/h) while it runs{then}"
            if rate
            else f"; its node keeps billing while it runs{then}"
        )
    return (
        f"detached: run {run_id} goes on on the node{cost}.\n"
        f"  follow its log:  reproduce logs {run_id} --follow\n"
        f"  take it back:    reproduce attach {run_id}\n"
        f"  stop it:         reproduce cancel {run_id}"
    )


def reattach_hint(rd: RunDir) -> str:
    return f"Reattach with `reproduce attach {rd.path}`; stop it with `reproduce cancel {rd.path}`."
