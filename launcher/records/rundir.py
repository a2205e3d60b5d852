"""The run directory: the record of one run (docs/architecture.md, "Run directory").

    runs/<recipe-slug>/<UTC-timestamp>-<run id>/
      recipe.yaml profile.yaml plan.json node.sh   what was asked, byte for byte
      run.json      what attach/cancel need: cluster record, node facts, node run dir, container
      status.json   state: created|acquiring|staging|running|collecting|
                    done|failed|cancelled|detached
      timeline.json acquired_at, released_at and stage start/end times from the node's markers
      logs/node.log everything the node script printed, appended by byte offset
      logs/<stage>.log  the same bytes split by stage marker; logs/train.log always exists
      measured/<k>/ measured run k of K (result.runs), its own logs/train.log, timeline, figures

Stage logs and the timeline are pure functions of node.log (plus acquire/release times); the
runner streams and splits them (launcher/runner/stream.py) and rebuilds them from node.log on
attach.
"""

from __future__ import annotations

import errno
import getpass
import json
import math
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, overload

import yaml

from launcher.errors import BadInput, InfraError
from launcher.inputs.yamlbudget import bound_aliases
from launcher.inputs.yamlschema import FastSafeLoader
from launcher.judge.split import TRAIN_STAGE as TRAIN_STAGE  # the stage whose log is the training
from launcher.records import jsonread
from launcher.records.atomic import write_atomic


class _NoAliasDumper(yaml.SafeDumper):
    """safe_dump that writes a value seen twice out twice, never as an anchor and an alias: so a
    run directory's YAML never holds one, and one found there was put by someone else."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def dump_yaml(data: object) -> str:
    """The text of a run directory's YAML file (result.yaml, profile.yaml): no anchors."""
    return yaml.dump(data, Dumper=_NoAliasDumper, sort_keys=False)


def load_yaml(text: str, where: Path) -> Any:
    """A YAML document of a run directory (result.yaml, recipe.yaml, profile.yaml) as
    yaml.safe_load reads it, with libyaml's safe loader where present: the same values for 9-10
    times less CPU (docs/benchmarks.md, "A run directory's YAML"; a run page, a history row and
    an attestation each read result.yaml, and the pure-Python loader was most of their time).
    Anchors and aliases are read within a budget (BadInput naming WHERE past it): none is
    written (`dump_yaml`), but a recipe.yaml is its author's bytes, and a few lines of them
    stand for billions of nodes, which a comparison or a JSON dump of the document then walks.
    Raises yaml.YAMLError as safe_load does."""
    bound_aliases(where, text, "run record")
    return yaml.load(text, Loader=FastSafeLoader)  # noqa: S506 - a safe loader


def read_yaml(path: Path) -> Any:
    """A run directory's YAML file read back: bounded like every file read back (jsonread's
    read: a regular file, never through a link, at most its MAX_BYTES), then `load_yaml`; None
    when there is no such file; BadInput naming the file for anything else (the directory may
    be a stranger's: a bundle handed to `verify`)."""
    try:
        text = jsonread.read_text(path)
    except jsonread.NodeJSONError as err:
        raise BadInput(f"{path}: {err.message}") from None
    if text is None:
        return None
    try:
        return load_yaml(text, path)
    except (yaml.YAMLError, RecursionError, ValueError) as err:
        first = (str(err).strip().splitlines() or ["no detail"])[0][:200]
        raise BadInput(f"{path} is not valid YAML: {first}") from None


class Files:
    """Every file a run directory holds, each name written once (docs/architecture.md, "Run
    directory"). Readers and writers everywhere name a file by these; the node's result files
    are here too, since collection puts them beside the launcher's own."""

    RECIPE = "recipe.yaml"  # the recipe as the run used it, byte for byte
    PROFILE = "profile.yaml"
    PLAN = "plan.json"
    NODE_SCRIPT = "node.sh"
    RUN = "run.json"  # what makes a directory a run directory
    STATUS = "status.json"
    TIMELINE = "timeline.json"
    AWS = "aws.json"
    AWS_CALLS = "aws-calls.jsonl"
    AWS_KNOWN_HOSTS = "aws_known_hosts"
    STEPS = "steps.jsonl"
    RESULT = "result.yaml"
    VERDICT = "verdict.json"
    REPORT_MD = "report.md"
    REPORT_HTML = "report.html"
    CONVERGENCE = "convergence.json"
    MEASURE = "measure.json"  # the measurement's record: its inputs and parameters
    ATTESTATION = "attestation.intoto.json"  # the signed statement (docs/attestation.md)
    ATTESTATION_PUB = "attestation.pub"
    LOGS = "logs"
    NODE_LOG = "node.log"  # in LOGS: node 0's whole output (each node's, multi-node)
    PLOTS = "plots"
    # K measured runs (result.runs): run k's own record, a run directory's measurement in small
    # (logs/train.log, timeline.json, steps.jsonl, result.yaml, verdict.json, measure.json,
    # report.md, plots/), made from node.log's k-th train stage (launcher/results/measured_runs.py)
    MEASURED = "measured"

    @staticmethod
    def measured_run(index: int) -> str:
        """measured/<k>: the sub-directory of measured run k (1..K)."""
        return f"{Files.MEASURED}/{index}"

    # what node.sh writes on the node and collection brings back (nothing else is collected)
    PREFLIGHT = "preflight.json"
    PREFLIGHT_GPU = "preflight-gpu.json"
    IMAGE = "image.json"
    STACK = "stack.json"
    ASSET_PLAN = "assets-plan.json"  # where each asset came from (the resolve stage's plan)
    # the host's samples of the GPUs while the container trained (scripts/gpu_sampler.py): not
    # JSON, so not a NODE_RESULT_FILES report; collected with them (protocol.RESULT_FILES)
    GPU_SAMPLES = "gpu-samples.csv"


NODE_RESULT_FILES = (
    Files.PREFLIGHT,
    Files.PREFLIGHT_GPU,
    Files.IMAGE,
    Files.STACK,
    Files.ASSET_PLAN,
)
# Files the launcher writes into a run directory itself: nothing that comes from the node may take
# one of these names (launcher/clusters/staging.py checks its result files against them).
LAUNCHER_FILES = frozenset(
    {
        Files.RECIPE,
        Files.PROFILE,
        Files.PLAN,
        Files.NODE_SCRIPT,
        Files.RUN,
        Files.STATUS,
        Files.TIMELINE,
        Files.AWS,
        Files.AWS_CALLS,
        Files.AWS_KNOWN_HOSTS,
        Files.STEPS,
        Files.RESULT,
        Files.VERDICT,
        Files.REPORT_MD,
        Files.REPORT_HTML,
        Files.CONVERGENCE,
        Files.MEASURE,
        Files.ATTESTATION,
        Files.ATTESTATION_PUB,
        Files.MEASURED,
    }
)
STATES = (
    "created",
    "acquiring",
    "staging",
    "running",
    "collecting",
    "done",
    "failed",
    "cancelled",
    "detached",
)
FINAL_STATES = ("done", "failed", "cancelled")
_STAMPED = re.compile(r"^\d{8}T\d{6}Z-")


def owner() -> str:
    """Who makes this run (the run's tags and records name them): the login name, or $USER where
    the process has no passwd entry (some containers)."""
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return os.environ.get("USER", "unknown")


def new_run_id(now: datetime | None = None) -> str:
    """Sortable and unique, safe in a container name and a path: UTC time + 6 random hex digits."""
    now = now or datetime.now(UTC)
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


def default_runs_root() -> Path:
    return Path(os.environ.get("REPRODUCE_RUNS_DIR", "runs"))


class RunRecord(dict[str, Any]):
    """run.json as read back: a field the code needs and the file lacks is BadInput naming the
    file and the field (exit 2), never a KeyError's traceback. A damaged or older record must
    say what it is missing; `get` still answers None for a field that is optional."""

    def __init__(self, data: dict[str, Any], *, where: Path) -> None:
        super().__init__(data)
        self.where = where

    def __missing__(self, key: str) -> Any:
        raise BadInput(
            f"{self.where}: the run record has no {key!r}, which this command needs; the record "
            "is damaged or was written by an older reproduce.",
            hint="Give another run, or look at run.json by hand.",
        )


class RunDirUnwritable(InfraError):  # noqa: N818 - named for what happened, as InfraError is
    """The launcher's own disk refused a write (full, read-only): not a problem of the node."""


def _write_atomic(path: Path, data: bytes) -> None:
    """launcher/records/atomic.py's write (a unique temporary file, fsync, rename), its failure said
    as the launcher's own disk refusing the write."""
    try:
        write_atomic(path, data)
    except OSError as err:
        raise RunDirUnwritable(
            f"cannot write {path}: {err.strerror or err}"
            + (" (the launcher's disk is full)" if err.errno == errno.ENOSPC else "")
        ) from err


# A run has tens of stages (K measured runs add one train stage each); a timeline of more is a
# flood of markers some process of the node printed, and keeping every one cost the launcher
# quadratic time (a start inserted in time order, the whole file rewritten per marker) while the
# budget went unchecked (4,000 markers took 209 s). Past this, new stages are counted, not kept.
MAX_STAGES = 500


_STAGE_KEYS = ("name", "start", "end", "status")


def _after(start: float | None, t: float | None) -> bool:
    """Whether a stage that started at START started after time T (both known)."""
    return start is not None and t is not None and start > t


@dataclass
class Stage:
    """One stage of the run's timeline as the follower builds it from node.log's markers:
    started (start), ended (end, and how: status), or still `running`."""

    name: str
    start: float | None = None
    end: float | None = None
    status: str = "running"
    # keys a stage read back from timeline.json carries beside these, written back as they were
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "start": self.start,
            "end": self.end,
            "status": self.status,
            **self.extra,
        }


@dataclass
class Timeline:
    """Stage times from the node's markers; GPU-hours are measured from acquired_at..released_at."""

    acquired_at: float | None = None
    released_at: float | None = None
    stages: list[Stage] = field(default_factory=list)
    # when the release began: before it the launcher was collecting (GPU-hours by stage)
    release_started_at: float | None = None

    def releasing(self) -> None:
        """The release begins now (the first time it is asked for)."""
        if self.acquired_at is not None and self.release_started_at is None:
            self.release_started_at = time.time()

    def on_marker(self, marker: dict[str, str]) -> None:
        name = marker["stage"]
        if len(self.stages) >= MAX_STAGES and marker["event"] == "start":
            return  # a flood (MAX_STAGES): its ends find no open stage and are dropped too
        try:
            t = float(marker.get("t", "nan"))
        except ValueError:
            t = float("nan")
        # a time that is not finite is no time (docs/architecture.md, "Numbers are finite"): the
        # recipe's code prints into the same log and could print `t=inf`
        t_value = t if math.isfinite(t) else None
        if marker["event"] == "start":
            # in the order the stages started: stages that ran at once reach node.log as they
            # end (docs/node-scripts.md, "What runs at once"), not as they start
            at = len(self.stages)
            while at > 0 and _after(self.stages[at - 1].start, t_value):
                at -= 1
            self.stages.insert(at, Stage(name, start=t_value))
            return
        for stage in reversed(self.stages):
            if stage.name == name and stage.end is None and stage.status == "running":
                stage.end = t_value
                stage.status = marker.get("status", "ok")
                return
        if len(self.stages) < MAX_STAGES:
            self.stages.append(Stage(name, end=t_value, status=marker.get("status", "ok")))

    def close_open(self, status: str) -> None:
        """At the end of a run a stage still `running` never ended: say how it ended instead."""
        for stage in self.stages:
            if stage.status == "running":
                stage.status = status

    def to_json(self) -> dict[str, Any]:
        return {
            "acquired_at": self.acquired_at,
            "released_at": self.released_at,
            "release_started_at": self.release_started_at,
            "stages": [stage.to_json() for stage in self.stages],
        }


class RunDir:
    """One run's directory; every file the run writes goes through here."""

    def __init__(self, path: Path) -> None:
        # absolute from the start: every path a run records or prints derives from this one, and
        # a record must mean the same from any directory (docs/operator.md, "No record of a run
        # depends on the directory")
        self.path = Path(path).absolute()

    # --- creating and finding ---

    @classmethod
    def create(cls, root: Path, slug: str, run_id: str | None = None) -> RunDir:
        run_id = run_id or new_run_id()
        # A run id that already starts with a UTC timestamp (the Plan's) names the directory alone.
        if _STAMPED.match(run_id):
            name = run_id
        else:
            name = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{run_id}"
        path = Path(root) / slug / name
        cls.refuse_existing(root, run_id)
        try:
            path.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise BadInput(f"--run-id {run_id}: the run directory {path} exists already.") from None
        from launcher.records import state

        created_at = time.time()
        try:
            (path / Files.LOGS).mkdir()
            (path / Files.LOGS / f"{TRAIN_STAGE}.log").touch()
            rd = cls(path)
            rd.write_json(Files.RUN, {"run_id": run_id, "slug": slug, "created_at": created_at})
            rd.set_status("created")
            # the user's index: the run is found by id from any directory
            # (launcher/records/state.py)
            state.enter_run(run_id, path, slug, created_at)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)  # nothing half-made is left behind
            raise
        return rd

    @staticmethod
    def existing(root: Path, run_id: str) -> list[Path]:
        """Run directories under `root` of `run_id` (named `<stamp>-<id>` or `<id>`)."""
        root = Path(root)
        if not root.is_dir() or "/" in run_id:
            return []
        return sorted(
            {
                p.parent
                for pattern in (f"**/*-{run_id}/run.json", f"**/{run_id}/run.json")
                for p in root.glob(pattern)
            }
        )

    @staticmethod
    def indexed(run_id: str) -> Path | None:
        """The run directory the user's index (launcher/records/state.py) has for `run_id`, if it
        still exists."""
        from launcher.records import state

        try:
            entry = state.lookup(run_id)
        except ValueError:  # not a run id at all (a path, a typo with a slash)
            return None
        return entry.run_dir if entry is not None and entry.present else None

    @classmethod
    def located(cls, root: Path, run_id: str) -> list[Path]:
        """Run directories of `run_id` under `root` and in the user's index, each once."""
        hits = {p.resolve(): p for p in cls.existing(root, run_id)}
        indexed = cls.indexed(run_id)
        if indexed is not None:
            hits.setdefault(indexed.resolve(), indexed)
        return sorted(hits.values())

    @classmethod
    def refuse_existing(cls, root: Path, run_id: str) -> None:
        """BadInput when `run_id` was used before under `root`: names on the node and in the cloud
        derive from it, so a second run with it could take over (or end) the first one's."""
        found = cls.located(root, run_id)
        if found:
            raise BadInput(
                f"--run-id {run_id} was used before: {found[0]}. Nothing was started.",
                hint=f"Leave --run-id out (a new id is made) or choose one not used under {root}/.",
            )

    @classmethod
    def find(cls, ref: str, root: Path | None = None) -> RunDir:
        """A run by its directory path or its run id (searched under the runs root)."""
        as_path = Path(ref)
        if (as_path / Files.RUN).is_file():
            return cls(as_path)
        root = Path(root) if root else default_runs_root()
        hits = cls.located(root, ref)
        if not hits:
            from launcher.records import state

            raise BadInput(
                f"no run {ref!r}: neither a run directory, nor a run id under {root}/ or in this "
                f"user's index ({state.index_dir()}/).",
                hint="`reproduce runs` lists every run; a runs directory made elsewhere is "
                "added with `reproduce runs --import DIR`.",
            )
        if len(hits) > 1:
            raise BadInput(
                f"run id {ref!r} matches several runs: {', '.join(map(str, hits))}; "
                "give the directory"
            )
        return cls(hits[0])

    @classmethod
    def target(cls, ref: str | Path, root: Path | None = None) -> Path:
        """What a command that takes "a run" (`measure`, `compare`, `verify`, `attest`, as
        `status`, `attach` and `cancel` do) was given, as an absolute path: a file or directory
        that exists (a run directory, a log, a bundle) as it is, else a run id found as `find`
        finds it, from any directory."""
        as_path = Path(ref).expanduser()
        if as_path.exists() or "/" in str(ref):  # a path: the command says what is missing
            return as_path.absolute()
        return cls.find(str(ref), root).path

    def recorded_path(self, value: str, what: str) -> Path:
        """A path this run recorded, as it was meant from any directory: absolute as it is;
        relative to the run directory (how a run records a path of its own); or, in a record
        written before that rule, relative to the directory the run was launched from
        (`runs/<slug>/<run>/aws.json`), recognised by the run directory's own name in it and
        read inside the run directory. BadInput naming run.json, the field and the value when
        it is none of these (a silent miss would end nothing and say nothing)."""
        path = Path(value)
        if path.is_absolute() and (path.exists() or self.path.name not in path.parts[:-1]):
            return path
        if self.path.name in path.parts[:-1]:  # an older relative one, or the directory moved
            at = len(path.parts) - 1 - path.parts[::-1].index(self.path.name)
            return self.path.joinpath(*path.parts[at + 1 :])
        if ".." in path.parts:
            raise BadInput(
                f"{self.path / Files.RUN}: {what} is {value!r}, which is neither absolute nor "
                "inside the run directory; the record cannot say where it is.",
                hint="Give the run by its directory, or fix the path in run.json by hand.",
            )
        return self.path / path

    def instance_ids(self) -> list[str]:
        """The cloud instance ids run.json's nodes name (meta.instance_id), each once."""
        data = self.record()
        ids: list[str] = []
        for node in data.get("nodes") or [data.get("node") or {}]:
            meta = node.get("meta") if isinstance(node, dict) else None
            iid = meta.get("instance_id") if isinstance(meta, dict) else None
            if isinstance(iid, str) and iid not in ids:
                ids.append(iid)
        return ids

    def own_path(self, path: Path) -> str:
        """How a run records one of its paths: relative to the run directory when inside it
        (the record still holds when the directory is moved), else absolute."""
        full = Path(path).absolute()
        try:
            return str(full.relative_to(self.path))
        except ValueError:
            return str(full)

    # --- files ---

    @property
    def logs(self) -> Path:
        return self.path / Files.LOGS

    @property
    def run_id(self) -> str:
        return str(self.record()["run_id"])

    def write_text(self, name: str, text: str) -> Path:
        return self.write_bytes(name, text.encode())

    def write_bytes(self, name: str, data: bytes) -> Path:
        target = self.path / name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise RunDirUnwritable(f"cannot create {target.parent}: {err.strerror}") from err
        _write_atomic(target, data)
        return target

    def write_json(self, name: str, data: object) -> Path:
        return self.write_text(name, json.dumps(data, indent=2, sort_keys=False) + "\n")

    def write_yaml(self, name: str, data: object) -> Path:
        return self.write_text(name, dump_yaml(data))

    @overload
    def read_json(self, name: str) -> dict[str, Any] | None: ...

    @overload
    def read_json(self, name: str, default: dict[str, Any]) -> dict[str, Any]: ...

    def read_json(self, name: str, default: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The file's JSON object; `default` when it is missing; BadInput naming it when it is not
        one. Read through launcher/records/jsonread.py (bounded, never a traceback): the run
        directory holds what the node's collection brought back, and a directory handed to
        `measure` or copied in from elsewhere is anyone's, so a file of it nested 100,000 deep,
        holding a 5,000-digit number, a FIFO or a list is a damaged record, not a crash."""
        target = self.path / name
        try:
            data = jsonread.load_file(target)
        except jsonread.NodeJSONError as err:
            raise BadInput(
                f"{target} is not valid JSON ({err.message}); the run's record is damaged.",
                hint="Restore the file from a backup, or look at the run directory by hand.",
            ) from None
        if data is None and not target.exists():
            return default
        if not isinstance(data, dict):
            raise BadInput(
                f"{target} holds no JSON object; the run's record is damaged.",
                hint="Restore the file from a backup, or look at the run directory by hand.",
            )
        return data

    def write_inputs(
        self, *, recipe_text: str, profile: object, plan: object, node_script: str
    ) -> None:
        """recipe.yaml (byte for byte), profile.yaml, plan.json and node.sh: what was asked."""
        self.write_text(Files.RECIPE, recipe_text)
        self.write_text(
            Files.PROFILE,
            profile if isinstance(profile, str) else dump_yaml(profile),
        )
        self.write_text(
            Files.PLAN,
            plan if isinstance(plan, str) else json.dumps(plan, indent=2, default=str) + "\n",
        )
        self.write_text(Files.NODE_SCRIPT, node_script)

    # --- run.json and status.json ---

    def record(self) -> RunRecord:
        """run.json, every field that names a file or reaches a command line in its form
        (launcher/records/recordform.py): BadInput naming the field otherwise."""
        from launcher.records import recordform

        data: dict[str, Any] = self.read_json(Files.RUN, {}) or {}
        recordform.check(data, self.path / Files.RUN)
        return RunRecord(data, where=self.path / Files.RUN)

    def update_record(self, **fields: object) -> dict[str, Any]:
        data = self.record()
        data.update(fields)
        self.write_json(Files.RUN, dict(data))
        return data

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.read_json(Files.STATUS, {"state": "unknown"})
        return status

    def set_status(self, state: str, detail: str | None = None, **extra: object) -> None:
        """The run's state; anything but `done` says the record is not complete."""
        if state not in STATES:
            raise ValueError(f"unknown run state {state!r}")
        data = {
            "state": state,
            "complete": state == "done",
            "updated_at": time.time(),
            "detail": detail,
        }
        data.update(extra)
        self.write_json(Files.STATUS, data)

    # --- timeline ---

    def timeline(self) -> Timeline:
        """timeline.json as typed times (a time that is not a number reads as none) and its
        stages, each an object with a name, its times and a status (others are left out), at
        most MAX_STAGES: the file is read back from a directory anyone may have written."""
        data = jsonread.Fields(self.read_json(Files.TIMELINE, {}))
        stages = [
            Stage(
                stage.word("name"),
                start=stage.number("start"),
                end=stage.number("end"),
                status=stage.word("status", "unknown"),
                extra={k: v for k, v in stage.mapping().items() if k not in _STAGE_KEYS},
            )
            for stage in data.records("stages")[:MAX_STAGES]
        ]
        return Timeline(
            data.number("acquired_at"),
            data.number("released_at"),
            stages,
            data.number("release_started_at"),
        )

    def write_timeline(self, timeline: Timeline) -> None:
        self.write_json(Files.TIMELINE, timeline.to_json())
