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
"""

from __future__ import annotations

from pathlib import Path

from launcher.records import nodejson
from launcher.records.rundir import Files

# Kinds on which the node side runs behind the launcher's boundary (containers it starts, over a
# shell it holds, reports written where the recipe's code cannot write).
HELD: frozenset[str] = frozenset({"local", "ssh", "aws"})

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


def run_kind(run_dir: Path) -> str | None:
    """The cluster kind a run directory ran on (run.json's `cluster.kind`, which the launcher
    wrote), None when the directory does not say (a bare log's measurement)."""
    try:
        run = nodejson.load_file(Path(run_dir) / Files.RUN)  # bounded: a bundle is a stranger's
    except nodejson.NodeJSONError:
        return None
    cluster = run.get("cluster") if isinstance(run, dict) else None
    kind = cluster.get("kind") if isinstance(cluster, dict) else None
    return kind if isinstance(kind, str) else None
