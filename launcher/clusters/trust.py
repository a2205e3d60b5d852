"""Where the launcher's trust boundary holds, by cluster kind: the one place that says which
node-side evidence of a run the launcher verified itself and which the cluster vouched for
(docs/architecture.md, "The trust boundary").

Why it differs by kind: on local, SSH and AWS nodes the launcher renders node.sh and runs it
over its own shell; the recipe's code runs in a container that cannot write the cache, the work
directory or the reports the host reads, the image is pulled by digest and docker says which
image ran, and the checks (the preflights, the stack probe) run in containers of their own. On an
existing Ray cluster (`kind: ray`) there is no shell and no container of the launcher's: node.sh
and every check run as one Ray job, in the cluster owner's environment and processes, beside the
recipe's code; the image digest is what each node's environment says (its raylet's
REPRODUCE_IMAGE_DIGEST). Those facts are then the cluster's word, and a verdict, a report and an
attestation of such a run say so: the predicate lists them under `unverified`, and the verdict
carries NOTE, which the report shows with the verdict's reasons.

A kind not in HELD is vouched for by its cluster until someone shows the boundary holds on it and
adds it: a new backend fails closed.

The promise this module keeps: every surface that shows a run of such a kind says so, however the
run ended (done and judged, failed at any stage, cancelled, lost, stopped by its budget, still
going; before a verdict or after one). Whether, and in which words, is decided here alone, from
the run's own record (`kind_of`: run.json, else plan.json, since a run that fails before its
cluster is recorded has only its plan), never from the verdict: a run that never reached one has
none to carry it. The run page, the runner's last words, `status`, `runs` and `verify` each show
`line` (`run_line` for a run directory); the verdict's note says the same, so a surface showing
both the line and the verdict's reasons leaves the note out of them (`other_reasons`).
"""

from __future__ import annotations

from pathlib import Path

from launcher.judge.assurance import decide
from launcher.judge.verdict import Verdict
from launcher.records import jsonread
from launcher.records.rundir import Files

# Kinds on which the node side runs behind the launcher's boundary (containers it starts, over a
# shell it holds, reports written where the recipe's code cannot write). slurm: the job's task on
# each node runs node.sh as the launcher's user, as over SSH (docker pulls by digest; the run
# directories on the shared work dir are checked as any work dir); pyxis is dry-run only.
HELD: frozenset[str] = frozenset({"local", "ssh", "aws", "slurm"})

# What a cluster not in HELD vouched for itself: predicate field -> why the launcher did not
# verify it. The same fields the node's reports fill (attest_predicate.py).
_VOUCHED = {
    "image": (
        "the image digest is what each node's own environment says (its raylet's "
        "REPRODUCE_IMAGE_DIGEST), set by whoever started the cluster; no pull by the launcher"
    ),
    "stack": "the stack probe ran as a task of the run's Ray job, in the cluster's processes",
    "gpus": "the GPU preflight ran as a task of the run's Ray job, in the cluster's processes",
    "instance.nodes.hostname": "the host preflight ran as a task of the run's Ray job",
}
_WHY = (
    "node.sh and every check ran as the run's Ray job in the cluster owner's environment, with "
    "no container of the launcher's between them and the recipe's code"
)


def vouched(kind: str | None) -> dict[str, str]:
    """Field path -> why, for each fact of a run on KIND that the cluster vouched for itself;
    empty for a kind whose node side the launcher holds, and for no kind (a bare log's
    measurement: it has no node evidence, and `unavailable` says so)."""
    if kind is None or kind in HELD:
        return {}
    return {field: f"{why} ({_WHY}; cluster kind {kind!r})" for field, why in _VOUCHED.items()}


def note(kind: str | None) -> str | None:
    """The verdict's one line for a run on KIND whose cluster vouched for its own checks."""
    if not vouched(kind):
        return None
    return (
        f"the {kind} cluster was trusted for its image and its checks (image digest, preflights, "
        "stack probe): they ran as the run's job in the cluster's own environment, not behind "
        "the launcher's trust boundary, so the launcher did not verify them"
    )


def add_note(reasons: list[str], kind: str | None) -> None:
    """Append the note for KIND to a verdict's reasons (once), as the verdict's notes are."""
    line = note(kind)
    if line is not None and f"note: {line}" not in reasons:
        reasons.append(f"note: {line}")


def mark(verdict: Verdict, kind: str | None) -> None:
    """A verdict of a run on KIND as every surface shows it: the note for a cluster that vouched
    for its own checks, and the assurance level (launcher/judge/assurance.py decides it from the
    verdict's evidence and whether KIND vouched)."""
    add_note(verdict.reasons, kind)
    if vouched(kind):
        verdict.assurance = decide((), vouched=True)


def line(kind: str | None) -> str | None:
    """The one line every surface shows for a run on KIND (None: nothing to say): the verdict's
    note, said as what it is."""
    words = note(kind)
    return None if words is None else f"unverified: {words}"


# A table's mark for such a run (`reproduce runs`), and what it means under the table.
MARK = "unverified"
LEGEND = (
    f"{MARK} = the run's cluster vouched for its own image and checks; the launcher did not "
    "verify them (`reproduce status RUN` says which)"
)


def other_reasons(reasons: list[str], kind: str | None) -> list[str]:
    """A verdict's REASONS as a surface lists them when it shows KIND's line apart: the note
    that repeats it left out, every other reason as it is."""
    words = note(kind)
    return [r for r in reasons if words is None or r != f"note: {words}"]


def _text(value: object, *keys: str) -> str | None:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) and value else None


def kind_of(run: object, plan: object) -> str | None:
    """The cluster kind a run's records name: run.json's `cluster.kind` (what the runner wrote
    once it had the cluster), else plan.json's `profile.kind` (what the run was planned on; a run
    that failed before its cluster was recorded has only that). Where both name a kind and one
    is not HELD, that one: the records of one run never disagree unless someone edited them, and
    then the line fails closed. None: neither says (a bare log's measurement)."""
    kinds = [k for k in (_text(run, "cluster", "kind"), _text(plan, "profile", "kind")) if k]
    vouching = [k for k in kinds if k not in HELD]
    first = vouching or kinds
    return first[0] if first else None


def run_kind(run_dir: Path) -> str | None:
    """kind_of a run directory's run.json and plan.json (read bounded: a bundle or a copied run
    directory is a stranger's); an unreadable file says nothing."""
    records = []
    for name in (Files.RUN, Files.PLAN):
        try:
            records.append(jsonread.load_file(Path(run_dir) / name))
        except jsonread.NodeJSONError:
            records.append(None)
    return kind_of(*records)


def run_line(run_dir: Path) -> str | None:
    """The line for the run in RUN_DIR, whatever state it is in (None: the launcher held its
    boundary, or the directory names no kind)."""
    return line(run_kind(run_dir))
