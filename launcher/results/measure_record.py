"""measure.json: what a measurement read and how it judged, the record `verify` re-measures by.

Why a module of its own: the record is written by every measurement (one run, each of K runs) and
read back by launcher/results/attest_verify.py; keeping its fields in one place keeps the two in
step (docs/attestation.md, "measure.json").
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from launcher.catalog import Price
from launcher.inputs.recipe import Recipe
from launcher.judge.evidence import HostWatch
from launcher.judge.timeline import RunTimeline
from launcher.judge.verdict import POLICY_NAME, POLICY_VERSION, Tolerance
from launcher.records.atomic import write_atomic
from launcher.records.rundir import Files

MEASURE_FILE = Files.MEASURE  # the measurement's record: its inputs and parameters


def json_safe(value: object) -> Any:
    """Non-finite floats become None so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _write_json(path: Path, data: object) -> None:
    write_atomic(path, json.dumps(json_safe(data), indent=2) + "\n")


def _file_ref(path: Path | None, out: Path) -> dict[str, str | None] | None:
    """A file the measurement read: its path (relative to `out` when inside it) and sha256."""
    if path is None:
        return None
    from launcher.excerpt import sha256_of

    path = Path(path)
    try:  # in chunks: a log may be gigabytes (the user named it: a link is followed)
        digest: str | None = sha256_of(path, follow=True)
    except OSError:
        digest = None
    try:
        shown = path.resolve().relative_to(Path(out).resolve()).as_posix()
    except ValueError:
        shown = str(path.resolve())
    return {"path": shown, "sha256": digest}


def write_measure_record(
    out: Path,
    *,
    log: Path,
    recipe: Recipe,
    timeline: RunTimeline | None,
    timeline_source: Path | None,
    price_per_hour: float | None,
    region: str | None,
    tolerance: Tolerance | None,
    reference: Path | None = None,
    runs: int | None = None,
    price: Price | None = None,
    measured: int = 1,
    node_log: Path | None = None,
    cluster: str | None = None,
    nonce: str | None = None,
    host: HostWatch | None = None,
) -> None:
    """out/measure.json: what this measurement read and how it judged (its record). The timeline
    is kept as it was read: a run's timeline.json gains its release time after the run was
    measured, and a re-measure must see what the measurement saw. No clock in it: measuring
    the same inputs again writes the same bytes."""
    from launcher.records.identity import launcher_identity

    out = Path(out)
    recipe_ref = _file_ref(recipe.path, out)
    own = out / Files.RECIPE  # the run directory's copy, when it is the recipe measured
    if recipe_ref is not None and own.is_file():
        mine = _file_ref(own, out)
        if mine is not None and mine["sha256"] == recipe_ref["sha256"]:
            recipe_ref = mine
    record = {
        "schema": 1,
        "log": _file_ref(log, out),
        "recipe": recipe_ref,
        "timeline": dict(timeline.written) if timeline is not None else None,
        "timeline_source": (_file_ref(timeline_source, out) or {}).get("path"),
        "price_per_hour": price_per_hour,
        "region": region,
        "tolerance": (tolerance if tolerance is not None else Tolerance()).to_dict(),
        "reference": str(reference) if reference is not None else None,
        "runs": runs,  # fewer measured runs than the claim's mean, accepted (--runs)
        "measured_runs": measured,  # K: the figures are the mean of measured/1..K
        "node_log": _file_ref(node_log, out) if measured > 1 else None,  # K runs are cut from it
        "price": price.to_dict() if price is not None else None,  # the run's decided price
        "cluster": cluster,  # its kind: verify notes what the cluster vouched for (trust.py)
        # the run's nonce, which made its host clock lines count: a secret only while it ran
        "clock_nonce": nonce,
        # whether the host's clock and GPU sampler were on: their evidence owed (evidence.py)
        "host_watch": host.to_dict() if host is not None else None,
        "policy": {"name": POLICY_NAME, "version": POLICY_VERSION},
        "launcher": launcher_identity(),
    }
    _write_json(out / MEASURE_FILE, record)
