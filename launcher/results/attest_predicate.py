"""The predicate of a run's attestation: what ran, on what, what it showed (docs/attestation.md).

Why each field is read from a file and never from today's state: an attestation is a statement
about the directory as it is, so everything in it comes from the directory's own files (the
recipe as run, plan.json, run.json, the node's reports, the timeline, measure.json, result.yaml,
verdict.json). A fact the directory does not hold (a GPU serial the driver did not give, an
instance id on a host that is not a cloud instance, a run measured from a bare log) is null, and
`unavailable` says why, field by field. Nothing is guessed. A fact the directory holds but only
because the cluster said so (a `kind: ray` run's image digest and checks, which ran as the
cluster's own job: launcher/clusters/trust.py) is kept, and `unverified` says why, field by
field.

The figures and the verdict are also what `reproduce verify` re-measures (attest_verify.py), so
they are the exact values of result.yaml and verdict.json.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from launcher.clusters import trust
from launcher.errors import BadInput
from launcher.records import jsonread
from launcher.records.jsonread import Fields
from launcher.records.rundir import Files, read_yaml

FIGURES = (
    "tokens_per_s_per_gpu",
    "usd_per_million_tokens",
    "step_time_cv_percent",
    "mfu",
    "gpu_hours",
    "window",
    "window_tokens",
    "steps_per_run",
    "measured",
)
INPUTS_DIR = "inputs"  # where attest copies a bare log's measured inputs into the directory
_INPUT_NAMES = {
    "log": "train.log",
    "recipe": Files.RECIPE,
    "timeline": Files.TIMELINE,
    "node_log": f"{Files.LOGS}/{Files.NODE_LOG}",  # K measured runs are cut from it
}


def plain(value: object) -> Any:
    """JSON's view of a value: tuples as lists, NaN and inf as null, YAML's dates as ISO text
    (a recipe's `measured: 2026-10-21` loads as a date). Attested values and re-measured ones
    are compared in this form, exactly."""
    import datetime as dt

    from launcher.results.measure_record import json_safe

    def default(obj: object) -> str:
        if isinstance(obj, (dt.date, dt.datetime)):
            return obj.isoformat()
        raise TypeError(f"{type(obj).__name__} is not JSON")

    return json.loads(json.dumps(json_safe(value), default=default))


def read_json(root: Path, name: str) -> Any:
    """A JSON file of the directory (the launcher wrote it, but the directory may since have
    been copied from anywhere), or None when absent; BadInput when it is not JSON within
    launcher/records/jsonread.py's limits (too deep, a huge number, a FIFO, a link). The node's
    reports are read with `node_report` instead, typed."""
    path = Path(root) / name
    try:  # bounded: the directory attested may have come from anywhere
        return jsonread.load_file(path)
    except jsonread.NodeJSONError as err:
        raise BadInput(
            f"{path} is not valid JSON ({err.message}); the directory cannot be attested."
        ) from None


def node_report(root: Path, name: str, missing: dict[str, str], field: str) -> Fields:
    """A report the node wrote (launcher/records/jsonread.py: hostile, read within limits, typed);
    one that is there but unreadable is noted under `field` in `unavailable`, never raised: it
    costs the attestation that fact, not the attestation."""
    doc = jsonread.read(Path(root) / name)
    if not doc.missing and not isinstance(doc.value, dict):
        missing.setdefault(field, doc.why_not())
    return doc.fields


def read_result(root: Path) -> dict[str, Any]:
    path = Path(root) / Files.RESULT
    data = read_yaml(path)  # bounded: a bundle's result.yaml is a stranger's
    if data is None:
        raise BadInput(f"{root} holds no result.yaml: nothing measured to attest.")
    if not isinstance(data, dict):
        raise BadInput(f"{path} is not a mapping of figures.")
    return data


def figures_of(result: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of a result.yaml mapping, and the unrounded ones behind them."""
    figures = {k: result.get(k) for k in FIGURES}
    figures["unrounded"] = (result.get("provenance") or {}).get("unrounded")
    return figures


def verdict_of(verdict: dict[str, Any]) -> dict[str, Any]:
    keys = ("status", "difference_percent", "reasons", "tolerance", "assurance")
    return {k: verdict.get(k) for k in keys}


def measured_inputs(root: Path, record: dict[str, Any]) -> dict[str, Any]:
    """The measurement's inputs as files inside `root`: {"log": {path, sha256}, ...}.

    A run directory measured in place already holds them. A `measure LOG --out DIR` directory
    names them where they were: each is copied into DIR/inputs/ when its bytes still have the
    recorded sha256, so that the attested directory is whole; BadInput when one changed or is
    gone (an attestation must hold the bytes that were measured)."""
    from launcher.results.attest import safe_name, sha256_file

    out: dict[str, Any] = {}
    roles = ["log", "recipe"] + (["node_log"] if record.get("node_log") else [])
    for role in roles:
        ref = record.get(role)
        if not isinstance(ref, dict) or not ref.get("path") or not ref.get("sha256"):
            raise BadInput(f"{root}/measure.json names no {role} with a sha256; re-measure it.")
        path, digest = str(ref["path"]), str(ref["sha256"])
        if safe_name(path) and (Path(root) / path).is_file():
            out[role] = {"path": path, "sha256": digest}
            continue
        dest = Path(root) / INPUTS_DIR / _INPUT_NAMES[role]
        if dest.is_file() and sha256_file(dest) == digest:  # copied in by an earlier attest
            out[role] = {"path": f"{INPUTS_DIR}/{_INPUT_NAMES[role]}", "sha256": digest}
            continue
        source = Path(path)
        if not source.is_absolute() or not source.is_file():
            raise BadInput(
                f"the {role} measured into {root} ({path}) is gone: an attestation must hold "
                "the bytes that were measured. Measure again, then attest."
            )
        if sha256_file(source) != digest:
            raise BadInput(
                f"the {role} measured into {root} ({path}) changed since it was measured "
                f"(sha256 {digest[:12]}... then). Measure again, then attest."
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)
        out[role] = {"path": f"{INPUTS_DIR}/{_INPUT_NAMES[role]}", "sha256": digest}
    return out


def _node_reports(
    root: Path, name: str, missing: dict[str, str], field: str
) -> list[tuple[int, Fields]]:
    """Node 0's report (the run dir) and node K's (logs/node-K/), in node order: those that
    hold a JSON object."""
    found = [(0, node_report(root, name, missing, field))]
    for d in sorted(Path(root, "logs").glob("node-*")):
        suffix = d.name.removeprefix("node-")
        if suffix.isascii() and suffix.isdigit() and len(suffix) <= 6:
            found.append((int(suffix), node_report(root, f"logs/{d.name}/{name}", missing, field)))
    return sorted(((n, r) for n, r in found if r), key=lambda pair: pair[0])


def _gpus(root: Path, plan: dict[str, Any], missing: dict[str, str]) -> dict[str, Any]:
    devices: list[dict[str, Any]] = []
    drivers: set[str] = set()
    for node, report in _node_reports(root, Files.PREFLIGHT_GPU, missing, "gpus.devices"):
        for gpu in report.records("gpus"):
            devices.append(
                {
                    "node": node,
                    "index": gpu.scalar("index"),
                    "model": gpu.scalar("name"),
                    "uuid": gpu.scalar("uuid"),
                    "serial": gpu.scalar("serial"),
                    "pci_bus_id": gpu.scalar("pci.bus_id"),
                }
            )
        for check in report.records("checks"):
            if check.scalar("name") == "driver_version" and check.scalar("value"):
                drivers.add(check.word("value"))
    if not devices:
        missing.setdefault(
            "gpus.devices",
            "no GPU preflight report (preflight-gpu.json) in the directory: skipped, failed "
            "before it, or a measurement of a bare log",
        )
    elif any(d["serial"] in (None, "") for d in devices):
        missing["gpus.devices.serial"] = (
            "the driver gave no serial for some GPUs (nvidia-smi serial is [N/A] on some boards), "
            "or the preflight predates serials"
        )
    if not drivers:
        missing["gpus.driver_version"] = "no driver_version check in the GPU preflight"
    models = sorted({str(d["model"]) for d in devices if d["model"]})
    per_node = plan.get("gpus_per_node")
    nodes = plan.get("nodes")
    return {
        "model": models[0] if len(models) == 1 else (models or None),
        "count": len(devices) if devices else None,
        "expected_count": per_node * nodes if isinstance(per_node, int) and nodes else None,
        "driver_version": sorted(drivers)[0] if len(drivers) == 1 else (sorted(drivers) or None),
        "devices": devices,
    }


def _instance(
    root: Path, run: dict[str, Any], plan: dict[str, Any], missing: dict[str, str]
) -> dict[str, Any]:
    nodes = [n for n in run.get("nodes") or [] if isinstance(n, dict)]
    cluster: dict[str, Any] = run["cluster"] if isinstance(run.get("cluster"), dict) else {}
    hosts = [
        {
            "node": n.get("name"),
            "host": n.get("host"),
            "hostname": None,
            "instance_id": (n.get("meta") or {}).get("instance_id"),
            "instance_type": (n.get("meta") or {}).get("instance_type"),
            "region": (n.get("meta") or {}).get("region"),
            "availability_zone": (n.get("meta") or {}).get("az"),
        }
        for n in nodes
    ]
    for index, report in _node_reports(root, Files.PREFLIGHT, missing, "instance.nodes.hostname"):
        if index < len(hosts):
            hosts[index]["hostname"] = report.scalar("host")
    kind = cluster.get("kind")
    if not hosts:
        missing["instance.nodes"] = "no run.json nodes: not a run directory, or it never acquired"
    elif kind != "aws":
        missing["instance.nodes.instance_id"] = (
            f"cluster kind {kind!r}: a host, not a cloud instance launched by reproduce"
        )
    elif any(not h["instance_id"] for h in hosts):
        missing["instance.nodes.instance_id"] = "run.json's launch record names no instance id"
    if kind == "aws":
        missing.setdefault(
            "instance.node_metadata",
            "the node's own metadata service (IMDS) is not queried: the ids are the launch's",
        )
    aws = read_json(root, Files.AWS) or {}
    recipe_instance = (plan.get("recipe") or {}).get("instance")
    return {
        "cluster": kind,
        "profile": (plan.get("profile") or {}).get("name"),
        "type": next((h["instance_type"] for h in hosts if h["instance_type"]), recipe_instance),
        "region": cluster.get("region") or aws.get("region"),
        "nodes": hosts,
        "aws_instances": aws.get("instances") if isinstance(aws.get("instances"), list) else None,
    }


def _image(root: Path, plan: dict[str, Any], missing: dict[str, str]) -> dict[str, Any]:
    image = node_report(root, Files.IMAGE, missing, "image.pulled")
    if not image:
        missing.setdefault(
            "image.pulled", "no image.json: the image stage did not run or did not report"
        )
    elif not image.has("repo_digests"):
        missing["image.repo_digests"] = (
            "image.json has no RepoDigests (a Ray cluster's check, or a node script before them)"
        )
    digests = image.raw("repo_digests")
    return {
        "pinned": plan.get("image"),
        "pulled": image.scalar("image"),
        "checked_digest": image.scalar("digest"),
        "image_id": image.scalar("id"),
        "repo_digests": image.words("repo_digests") if isinstance(digests, list) else None,
    }


def _stack(root: Path, missing: dict[str, str]) -> dict[str, Any] | None:
    stack = node_report(root, Files.STACK, missing, "stack")
    if not stack:
        missing.setdefault("stack", "no stack.json: the stack probe did not run")
        return None
    found = {c.word("name"): c.scalar("value") for c in stack.records("checks") if c.scalar("name")}
    return {"policy": stack.scalar("policy"), "ok": stack.scalar("ok"), "found": found}


def _timeline(root: Path, missing: dict[str, str]) -> dict[str, Any] | None:
    timeline = read_json(root, Files.TIMELINE)
    if not isinstance(timeline, dict):
        missing["timeline"] = "no timeline.json (a bare log's measurement without --timeline)"
        return None
    keys = ("acquired_at", "released_at", "release_started_at")
    return {
        **{k: timeline.get(k) for k in keys},
        "stages": [
            {k: s.get(k) for k in ("name", "start", "end", "status")}
            for s in timeline.get("stages") or []
            if isinstance(s, dict)
        ],
    }


def build_predicate(root: Path, *, now: float | None = None) -> dict[str, Any]:
    """The predicate (PREDICATE_TYPE) of the directory `root`; BadInput when it holds no
    measurement this launcher can attest (measure.json, result.yaml, verdict.json), or when a
    record of it has a shape the launcher never writes (the directory may come from anyone)."""
    try:
        return _build_predicate(Path(root), now)
    except (KeyError, TypeError, ValueError, AttributeError) as err:  # a record of a wrong shape
        raise BadInput(
            f"{root}: a record of the directory is malformed ({type(err).__name__}: "
            f"{str(err)[:200]}); it cannot be attested. Measure it again, then attest."
        ) from None


def _build_predicate(root: Path, now: float | None) -> dict[str, Any]:
    """build_predicate's body: the directory's files (bounded, launcher/records/jsonread.py) are
    read as the shapes the launcher writes; a wrong shape raises, and the caller says so."""
    from launcher.records.identity import launcher_identity

    root = Path(root)
    record = read_json(root, "measure.json")
    if not isinstance(record, dict):
        raise BadInput(
            f"{root} holds no measure.json: it was not measured by this version of reproduce. "
            f"Measure it again (`reproduce measure {root}`), then attest."
        )
    status = read_json(root, Files.STATUS)
    from launcher.records.rundir import FINAL_STATES

    if isinstance(status, dict) and status.get("state") not in FINAL_STATES:
        raise BadInput(
            f"run {root} has not ended (state {status.get('state')!r}): its evidence is not "
            "complete yet. Attest it once it is done, failed or cancelled."
        )
    verdict = read_json(root, Files.VERDICT)
    if not isinstance(verdict, dict):
        raise BadInput(f"{root} holds no verdict.json: nothing judged to attest.")
    result = read_result(root)
    inputs = measured_inputs(root, record)
    plan = read_json(root, Files.PLAN) or {}
    run = read_json(root, Files.RUN) or {}
    missing: dict[str, str] = {}
    recipe_path = root / inputs["recipe"]["path"]
    raw = read_yaml(recipe_path) or {}
    from launcher.inputs.recipe import Sections, recipe_slug

    plan_recipe = plan.get("recipe") or {}
    if not plan:
        missing["recipe.source"] = "no plan.json: a measurement, not a run; see measurement"
    card = Sections.of(raw if isinstance(raw, dict) else {})
    plan_recipe["instance"] = card.hardware.instance
    stamp = time.time() if now is None else now
    predicate: dict[str, Any] = plain(
        {
            "run_id": run.get("run_id"),
            "recipe": {
                "file": inputs["recipe"]["path"],
                "sha256": inputs["recipe"]["sha256"],
                "slug": recipe_slug(raw) if isinstance(raw, dict) else None,
                "model": card.model,
                "author": card.author,
                "status": card.status,
                "source": plan_recipe.get("path") or record["recipe"].get("path"),
            },
            "claim": {k: card.claim.stated(k) for k in FIGURES if k in card.claim.written},
            "figures": figures_of(result),
            "verdict": verdict_of(verdict),
            "policy": dict(record.get("policy") or {}),
            "measurement": {
                "record": "measure.json",
                "inputs": inputs,
                "timeline": "measure.json timeline (as the measurement read it)",
                "price_per_hour_override": record.get("price_per_hour"),
                "region": record.get("region"),
                "tolerance": record.get("tolerance"),
            },
            "image": _image(root, plan, missing),
            "stack": _stack(root, missing),
            "gpus": _gpus(root, plan, missing),
            "instance": _instance(root, run, {**plan, "recipe": plan_recipe}, missing),
            "price": (result.get("provenance") or {}).get("price"),
            "timeline": _timeline(root, missing),
            "launcher": {
                "run": run.get("launcher"),
                "measured": record.get("launcher"),
                "attested": launcher_identity(),
            },
            "attested_at": datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "unavailable": missing,
            # what the cluster vouched for itself (kind ray): present, but not the launcher's word
            "unverified": trust.vouched(_kind(run)),
        }
    )
    return predicate


def _kind(run: dict[str, Any]) -> str | None:
    cluster = run.get("cluster")
    kind = cluster.get("kind") if isinstance(cluster, dict) else None
    return kind if isinstance(kind, str) else None
