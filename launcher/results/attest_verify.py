"""`reproduce verify`: the signature, every subject's bytes, then the figures measured again.

Why re-measure: a valid signature and unchanged files only say that the signer saw these bytes.
What a reader wants is that these logs, judged by the recorded policy, give the published figures
and verdict. So the raw log is parsed and judged again here, in memory (nothing is written into
the directory checked), with the recipe, the timeline and the parameters that the measurement
recorded (measure.json, itself a subject), and every figure and the verdict must come out equal,
exactly (not within a tolerance: measurement is a pure function of those inputs). A directory of
K measured runs (result.runs) is re-measured as it was made: node.log cut into its K runs again,
each judged alone in a scratch directory, then their mean; every attested measured/<k>/ must be
what the log gives, and the mean is compared as one run's figures are.

The order of the checks is the order of trust: signature (who, and that the statement is as
signed), then each subject's sha256 (the files are the ones signed), then the policy (this
launcher judges the same way), then the re-measure. The first thing that does not hold is the
answer (CheckFailed, exit 1), named: which file changed, which figure differs and by how much.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from launcher.catalog import Price
from launcher.clusters import trust
from launcher.errors import BadInput, CheckFailed
from launcher.judge.timeline import RunTimeline
from launcher.records import jsonread
from launcher.records.rundir import TRAIN_STAGE, Files, read_yaml
from launcher.results.attest import (
    ENVELOPE_FILE,
    PUB_FILE,
    attested_size,
    evidence_files,
    open_envelope,
    read_envelope,
    sha256_file,
)
from launcher.results.attest_predicate import figures_of, plain, read_result, verdict_of

if TYPE_CHECKING:
    from launcher.inputs.recipe import Recipe
    from launcher.judge.measure import Result
    from launcher.judge.parse.records import StepRecord
    from launcher.judge.verdict import Verdict


@dataclass
class Verified:
    """What held: who signed (and whether that key was given or only found beside the
    attestation), how many files, the verdict re-measured, files present but not attested."""

    root: Path
    fingerprint: str
    pinned: bool
    subjects: int
    status: str | None
    figures: dict[str, Any]
    unattested: list[str] = field(default_factory=list)
    seconds: float = 0.0
    names: list[str] = field(default_factory=list)  # the subjects, as the statement lists them
    # what the run's cluster vouched for itself (launcher/clusters/trust.py), from the signed
    # measure.json's `cluster`: the kind the re-made verdict's note is made from
    unverified: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "verified": True,
            "directory": str(self.root),
            "signed_by": self.fingerprint,
            "key_given": self.pinned,
            "subjects": self.subjects,
            "verdict": self.status,
            "figures": self.figures,
            "unattested": self.unattested,
            "seconds": round(self.seconds, 4),
            "unverified": self.unverified,
        }


def _timeline(written: object) -> RunTimeline | None:
    """The timeline the measurement recorded (measure.json), typed; None where it recorded none."""
    return RunTimeline.of(written) if isinstance(written, dict) else None


def _norm(value: object) -> Any:
    return plain(value)


# Where two JSON values first differ (a dotted path), and the value on each side.
Difference = tuple[str, object, object]


def first_difference(a: object, b: object, path: str = "") -> Difference | None:
    """The first place (a dotted path) where two JSON values differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return (f"{path}{key}", a.get(key), b.get(key))
            found = first_difference(a[key], b[key], f"{path}{key}.")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{path}{i}.")
            if found:
                return found
        if len(a) != len(b):
            return (f"{path.rstrip('.')} (length)", len(a), len(b))
        return None
    same = a == b and type(a) is type(b) or (_number(a) and _number(b) and a == b)
    return None if same else (path.rstrip(".") or "(value)", a, b)


def _number(x: object) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def describe(where: str, diff: Difference, left: str, right: str) -> str:
    """`where`: PATH: LEFT x, RIGHT y (+d, +p%) - the figure, both values and the gap."""
    path, a, b = diff
    text = f"{where}: {path}: {left} {a!r}, {right} {b!r}"
    if _number(a) and _number(b) and math.isfinite(a) and math.isfinite(b):
        text += f" (by {b - a:+.6g}"
        text += f", {100.0 * (b - a) / a:+.4g}%)" if a else ")"
    return text


def _bundle_json(root: Path, name: str) -> dict[str, Any]:
    """A JSON object of the directory verified: a stranger's bytes (the key that signed them may
    be the one found beside them), read through launcher/records/jsonread.py, bounded and
    typed at the top; CheckFailed naming the file when it is not one, never a traceback."""
    try:
        data = jsonread.load_file(root / name)
    except jsonread.NodeJSONError as err:
        raise CheckFailed(f"{root / name} is not readable JSON ({err.message}).") from None
    if not isinstance(data, dict):
        raise CheckFailed(f"{root / name} holds no JSON object.")
    return data


def _structured(path: Path) -> Any:
    """A measured run's .json (bounded JSON) or .yaml file, to compare by content; CheckFailed
    when it cannot be read."""
    if path.name.endswith(".json"):
        return _bundle_json(path.parent, path.name)
    try:
        return read_yaml(path)
    except BadInput as err:
        raise CheckFailed(f"{path} is not readable YAML ({str(err)[:200]}).") from None


def _subject_changed(
    root: Path, name: str, digest: str, now: str, predicate: dict[str, Any]
) -> str:
    """`now`: the file's sha256, or (its size differing) `<N> bytes` in words."""
    base = f"{root / name} changed since it was attested "
    if now.endswith(" bytes"):
        base += f"({now[: -len(' bytes')]} bytes now, not the size attested)"
    else:
        base += f"(sha256 {digest[:16]}... attested, {now[:16]}... now)"
    try:
        if name == Files.RESULT:
            diff = first_difference(
                _norm(predicate.get("figures")), _norm(figures_of(read_result(root)))
            )
        elif name == Files.VERDICT:
            edited = _bundle_json(root, name)
            diff = first_difference(
                _norm(predicate.get("verdict")), _norm(verdict_of(edited if edited else {}))
            )
        else:
            diff = None
    except (BadInput, CheckFailed, OSError, ValueError, AttributeError):
        diff = None
    if diff is None:
        return base + "."
    return describe(base, diff, "attested", "now") + "."


def check_subjects(root: Path, stmt: dict[str, Any]) -> None:
    """Every subject is present, a regular file, and has its attested sha256."""
    for subject in stmt["subject"]:
        name, digest = subject["name"], subject["digest"]["sha256"]
        path = root / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise CheckFailed(f"subject {name} in {root} is not a regular file (a link?).")
        if not path.is_file():
            raise CheckFailed(f"subject {name} is missing from {root} (attested, now gone).")
        size, attested = path.stat().st_size, attested_size(subject)
        if attested is not None and size != attested:  # before hashing what may be any size
            raise CheckFailed(
                _subject_changed(root, name, digest, f"{size} bytes", stmt["predicate"])
            )
        now = sha256_file(path)
        if now != digest:
            raise CheckFailed(_subject_changed(root, name, digest, now, stmt["predicate"]))


def remeasure_check(
    root: Path, stmt: dict[str, Any], *, files_first: bool = False
) -> tuple[str | None, dict[str, Any]]:
    """Measure the attested log again with the recorded recipe, timeline and parameters and
    compare with the predicate, then the directory's result.yaml and verdict.json (`files_first`:
    the files first, as attest names them); CheckFailed naming the first difference. Returns
    (verdict status, figures)."""
    from launcher.inputs.recipe import load_recipe
    from launcher.judge.verdict import POLICY_NAME, POLICY_VERSION, Tolerance
    from launcher.results.evaluate import remeasure, result_yaml
    from launcher.results.readback import host_watch, read_gpu_samples

    predicate = stmt["predicate"]
    names = {s["name"] for s in stmt["subject"]}
    policy = predicate.get("policy") or {}
    if (policy.get("name"), policy.get("version")) != (POLICY_NAME, POLICY_VERSION):
        from launcher import __version__

        raise CheckFailed(
            f"{root}: judged by policy {policy.get('name')} v{policy.get('version')}; this "
            f"launcher (reproduce {__version__}) judges by {POLICY_NAME} v{POLICY_VERSION}, so it "
            "cannot re-measure it the same way. Verify with the launcher that measured it "
            "(predicate launcher.measured)."
        )
    inputs = (predicate.get("measurement") or {}).get("inputs") or {}
    for role in ("log", "recipe"):
        ref = inputs.get(role) or {}
        if ref.get("path") not in names:
            raise CheckFailed(f"{root}: the measured {role} ({ref.get('path')}) is not a subject.")
    if "measure.json" not in names:
        raise CheckFailed(f"{root}: measure.json (the measurement's record) is not a subject.")
    record = _bundle_json(root, "measure.json")
    tolerance = Tolerance(**record["tolerance"]) if record.get("tolerance") else None
    recipe = load_recipe(root / inputs["recipe"]["path"])
    pricing: dict[str, Any] = {
        "price_per_hour": record.get("price_per_hour"),
        "region": record.get("region"),
        "tolerance": tolerance,
        "runs": record.get("runs"),
        "price": Price.from_dict(record.get("price")),
    }
    measured = record.get("measured_runs")
    if isinstance(measured, int) and not isinstance(measured, bool) and measured > 1:
        where = (inputs.get("node_log") or {}).get("path") or f"{Files.LOGS}/{Files.NODE_LOG}"
        records, result, verdict = _remeasure_mean(
            root, names, recipe, where, measured, pricing, _timeline(record.get("timeline"))
        )
    else:
        nonce = record.get("clock_nonce")  # the host clock lines the measurement counted
        records, result, verdict = remeasure(
            root / inputs["log"]["path"],
            recipe,
            _timeline(record.get("timeline")),
            nonce=nonce if isinstance(nonce, str) else None,
            # the host's GPU samples the measurement read: a signed subject, or none
            gpu_samples=read_gpu_samples(root) if Files.GPU_SAMPLES in names else None,
            host=host_watch(root),  # node.sh when a subject, else measure.json's record
            **pricing,
        )
    kind = record.get("cluster")  # the kind the measurement read (run.json), as it noted it
    trust.mark(verdict, kind if isinstance(kind, str) else None)
    again = _norm(result_yaml(result, verdict))
    judged = _norm(verdict.to_dict())
    attested = [
        ("the attested figures are", "attested", predicate.get("figures"), figures_of(again)),
        ("the attested verdict is", "attested", predicate.get("verdict"), verdict_of(judged)),
    ]
    files = []
    if Files.RESULT in names:
        files.append(("result.yaml is", "file", read_result(root), again))
    if Files.VERDICT in names:
        on_disk = _bundle_json(root, Files.VERDICT)
        files.append(("verdict.json is", "file", on_disk, judged))
    for where, left, recorded, measured in files + attested if files_first else attested + files:
        diff = first_difference(_norm(recorded), _norm(measured))
        if diff:
            raise CheckFailed(
                describe(f"{root}: {where} not what the log gives", diff, left, "re-measured")
            )
    if Files.STEPS in names:
        lines = "".join(json.dumps(r.to_dict()) + "\n" for r in records)
        if (root / Files.STEPS).read_text(encoding="utf-8") != lines:
            raise CheckFailed(f"{root}/steps.jsonl is not the steps the log gives.")
    return verdict.status, figures_of(again)


# What is compared in each re-measured measured/<k>/: its log as cut, its timeline, its steps,
# figures and verdict. Not its measure.json (it names the launcher that wrote it), report.md or
# plots/ (renderings of the figures compared).
_RUN_FILES = (
    f"{Files.LOGS}/{TRAIN_STAGE}.log",
    Files.TIMELINE,
    Files.STEPS,
    Files.RESULT,
    Files.VERDICT,
)


def _remeasure_mean(
    root: Path,
    names: set[str],
    recipe: Recipe,
    node_log: str,
    measured: int,
    pricing: dict[str, Any],
    timeline: RunTimeline | None,
) -> tuple[list[StepRecord], Result, Verdict]:
    """K measured runs: cut node.log into its runs again, measure each and judge their mean, as
    the measurement did (launcher/results/measured_runs.py), in a scratch directory; then every
    attested measured/<k>/ must be what the log gives, file for file, and no run may be missing
    or added. The mean is compared by the caller, as one run's figures are."""
    from launcher.results.evaluate import measure_k_runs

    if node_log not in names or not node_log.endswith(f"{Files.LOGS}/{Files.NODE_LOG}"):
        raise CheckFailed(
            f"{root}: its figures are the mean of {measured} measured runs, cut from {node_log}, "
            "which is not a subject: they cannot be measured again."
        )
    logs_of = (root / node_log).parent.parent  # the directory whose logs/node.log it is
    with tempfile.TemporaryDirectory(prefix="reproduce-verify-") as scratch:
        got = measure_k_runs(
            logs_of,
            Path(scratch),
            recipe,
            measured,
            pricing["runs"],
            timeline,
            (pricing["price_per_hour"], pricing["region"], pricing["tolerance"], pricing["price"]),
            False,
        )
        if got is None:
            raise CheckFailed(
                f"{root}: {node_log} holds no train stage: the {measured} measured runs its "
                "figures are the mean of are not in it."
            )
        _same_runs(root, Path(scratch), names)
    result, verdict, records = got
    return records, result, verdict


def _run_files(names: set[str]) -> set[str]:
    """measured/<k>/<file> for the files of a measured run that are compared."""
    return {
        n for n in names if n.startswith(f"{Files.MEASURED}/") and n.split("/", 2)[-1] in _RUN_FILES
    }


def _same_runs(root: Path, again: Path, names: set[str]) -> None:
    """Each attested measured run's files equal the re-measure's (structured files by their
    content, the log and steps byte for byte); CheckFailed naming the first that is not."""
    made = {
        p.relative_to(again).as_posix() for p in (again / Files.MEASURED).rglob("*") if p.is_file()
    }
    attested, ours = _run_files(names), _run_files(made)
    for name in sorted(attested | ours, key=lambda n: (n.split("/")[1].zfill(6), n)):
        if name not in attested:
            raise CheckFailed(f"{root}: the log gives {name}, which is not attested.")
        if name not in ours:
            raise CheckFailed(f"{root}: {name} is attested, but the log gives no such run.")
        signed, measured = root / name, again / name
        if name.endswith((".json", ".yaml")):
            diff = first_difference(_norm(_structured(signed)), _norm(_structured(measured)))
            if diff:
                raise CheckFailed(
                    describe(
                        f"{root}: {name} is not what the log gives", diff, "file", "re-measured"
                    )
                )
        elif signed.read_bytes() != measured.read_bytes():
            raise CheckFailed(f"{root}: {name} is not what {Files.LOGS}/{Files.NODE_LOG} gives.")


def verify_dir(root: Path, key: Path | None = None) -> Verified:
    """Verify an attested directory (see the module's docstring). `key`: the signer's public key
    (OpenSSH .pub); without it the directory's attestation.pub is used, which proves the files
    are as signed by that key, not who holds it (the result says so)."""
    from launcher.results.attest_keys import fingerprint, load_public_key

    started = time.perf_counter()
    root = Path(root)
    if not root.is_dir():
        raise BadInput(f"{root} is neither a directory nor a bundle (.tar.gz) to verify.")
    envelope = read_envelope(root / ENVELOPE_FILE)
    if key is None and not (root / PUB_FILE).is_file():
        raise BadInput(f"{root} holds no {PUB_FILE}: pass the signer's public key with --key.")
    public = load_public_key(key if key is not None else root / PUB_FILE)
    stmt = open_envelope(envelope, public, root / ENVELOPE_FILE)
    check_subjects(root, stmt)
    try:
        status, figures = remeasure_check(root, stmt)
    except BadInput as err:
        raise CheckFailed(f"{root}: the attested inputs cannot be measured again: {err}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as err:  # a signed, malformed record
        raise CheckFailed(
            f"{root}: the attested measurement record or predicate is malformed "
            f"({type(err).__name__}: {err}); it cannot be measured again."
        ) from None
    names = {s["name"] for s in stmt["subject"]}
    extra = [n for n in evidence_files(root) if n not in names]
    kind = _bundle_json(root, "measure.json").get("cluster")  # read and compared above
    return Verified(
        root,
        fingerprint(public),
        key is not None,
        len(names),
        status,
        figures,
        extra,
        time.perf_counter() - started,
        [s["name"] for s in stmt["subject"]],
        trust.line(kind if isinstance(kind, str) else None),
    )
