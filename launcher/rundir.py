"""The run directory: the record of one run (docs/architecture.md, "Run directory").

    runs/<recipe-slug>/<UTC-timestamp>-<run id>/
      recipe.yaml profile.yaml plan.json node.sh   what was asked, byte for byte
      run.json      what attach/cancel need: cluster record, node facts, node run dir, container
      status.json   state: created|acquiring|staging|running|collecting|
                    done|failed|cancelled|detached
      timeline.json acquired_at, released_at and stage start/end times from the node's markers
      logs/node.log everything the node script printed, appended by byte offset
      logs/<stage>.log  the same bytes split by stage marker; logs/train.log always exists

Stage logs and the timeline are pure functions of node.log (plus acquire/release times); the
runner streams and splits them (launcher/runner/stream.py) and rebuilds them from node.log on
attach.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from launcher.atomic import write_atomic
from launcher.errors import BadInput, InfraError

TRAIN_STAGE = "train"
# Files the launcher writes into a run directory itself: nothing that comes from the node may take
# one of these names (launcher/runner/staging.py checks its result files against them).
LAUNCHER_FILES = frozenset(
    {
        "recipe.yaml",
        "profile.yaml",
        "plan.json",
        "node.sh",
        "run.json",
        "status.json",
        "timeline.json",
        "aws.json",
        "aws-calls.jsonl",
        "aws_known_hosts",
        "steps.jsonl",
        "result.yaml",
        "verdict.json",
        "report.md",
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


def new_run_id(now: datetime | None = None) -> str:
    """Sortable and unique, safe in a container name and a path: UTC time + 6 random hex digits."""
    now = now or datetime.now(UTC)
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


def default_runs_root() -> Path:
    return Path(os.environ.get("REPRODUCE_RUNS_DIR", "runs"))


class RunDirUnwritable(InfraError):  # noqa: N818 - named for what happened, as InfraError is
    """The launcher's own disk refused a write (full, read-only): not a problem of the node."""


def _write_atomic(path: Path, data: bytes) -> None:
    """launcher/atomic.py's write (a unique temporary file, fsync, rename), its failure said as
    the launcher's own disk refusing the write."""
    try:
        write_atomic(path, data)
    except OSError as err:
        raise RunDirUnwritable(
            f"cannot write {path}: {err.strerror or err}"
            + (" (the launcher's disk is full)" if err.errno == errno.ENOSPC else "")
        ) from err


@dataclass
class Timeline:
    """Stage times from the node's markers; GPU-hours are measured from acquired_at..released_at."""

    acquired_at: float | None = None
    released_at: float | None = None
    stages: list[dict[str, Any]] = field(default_factory=list)
    # when the release began: before it the launcher was collecting (GPU-hours by stage)
    release_started_at: float | None = None

    def releasing(self) -> None:
        """The release begins now (the first time it is asked for)."""
        if self.acquired_at is not None and self.release_started_at is None:
            self.release_started_at = time.time()

    def on_marker(self, marker: dict[str, str]) -> None:
        name = marker["stage"]
        try:
            t = float(marker.get("t", "nan"))
        except ValueError:
            t = float("nan")
        t_value = None if t != t else t
        if marker["event"] == "start":
            self.stages.append({"name": name, "start": t_value, "end": None, "status": "running"})
            return
        for stage in reversed(self.stages):
            if stage["name"] == name and stage["end"] is None and stage["status"] == "running":
                stage["end"] = t_value
                stage["status"] = marker.get("status", "ok")
                return
        self.stages.append(
            {"name": name, "start": None, "end": t_value, "status": marker.get("status", "ok")}
        )

    def close_open(self, status: str) -> None:
        """At the end of a run a stage still `running` never ended: say how it ended instead."""
        for stage in self.stages:
            if stage["status"] == "running":
                stage["status"] = status

    def to_json(self) -> dict[str, Any]:
        return {
            "acquired_at": self.acquired_at,
            "released_at": self.released_at,
            "release_started_at": self.release_started_at,
            "stages": self.stages,
        }


class RunDir:
    """One run's directory; every file the run writes goes through here."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

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
        (path / "logs").mkdir()
        (path / "logs" / f"{TRAIN_STAGE}.log").touch()
        rd = cls(path)
        rd.write_json("run.json", {"run_id": run_id, "slug": slug, "created_at": time.time()})
        rd.set_status("created")
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

    @classmethod
    def refuse_existing(cls, root: Path, run_id: str) -> None:
        """BadInput when `run_id` was used before under `root`: names on the node and in the cloud
        derive from it, so a second run with it could take over (or end) the first one's."""
        found = cls.existing(root, run_id)
        if found:
            raise BadInput(
                f"--run-id {run_id} was used before: {found[0]}. Nothing was started.",
                hint=f"Leave --run-id out (a new id is made) or choose one not used under {root}/.",
            )

    @classmethod
    def find(cls, ref: str, root: Path | None = None) -> RunDir:
        """A run by its directory path or its run id (searched under the runs root)."""
        as_path = Path(ref)
        if (as_path / "run.json").is_file():
            return cls(as_path)
        root = Path(root) if root else default_runs_root()
        hits = cls.existing(root, ref)
        if not hits:
            raise BadInput(f"no run {ref!r}: give a run directory or a run id found under {root}/")
        if len(hits) > 1:
            raise BadInput(
                f"run id {ref!r} matches several runs: {', '.join(map(str, hits))}; "
                "give the directory"
            )
        return cls(hits[0])

    # --- files ---

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def run_id(self) -> str:
        return self.record()["run_id"]

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

    def write_json(self, name: str, data: Any) -> Path:
        return self.write_text(name, json.dumps(data, indent=2, sort_keys=False) + "\n")

    def write_yaml(self, name: str, data: Any) -> Path:
        return self.write_text(name, yaml.safe_dump(data, sort_keys=False))

    def read_json(self, name: str, default: Any = None) -> Any:
        """The file's JSON; `default` when it is missing; BadInput naming it when it is not JSON."""
        target = self.path / name
        if not target.exists():
            return default
        try:
            return json.loads(target.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            raise BadInput(
                f"{target} is not valid JSON ({err}); the run's record is damaged.",
                hint="Restore the file from a backup, or look at the run directory by hand.",
            ) from None

    def write_inputs(self, *, recipe_text: str, profile: Any, plan: Any, node_script: str) -> None:
        """recipe.yaml (byte for byte), profile.yaml, plan.json and node.sh: what was asked."""
        self.write_text("recipe.yaml", recipe_text)
        self.write_text(
            "profile.yaml",
            profile if isinstance(profile, str) else yaml.safe_dump(profile, sort_keys=False),
        )
        self.write_text(
            "plan.json",
            plan if isinstance(plan, str) else json.dumps(plan, indent=2, default=str) + "\n",
        )
        self.write_text("node.sh", node_script)

    # --- run.json and status.json ---

    def record(self) -> dict[str, Any]:
        return self.read_json("run.json", {}) or {}

    def update_record(self, **fields: Any) -> dict[str, Any]:
        data = self.record()
        data.update(fields)
        self.write_json("run.json", data)
        return data

    def status(self) -> dict[str, Any]:
        return self.read_json("status.json", {"state": "unknown"})

    def set_status(self, state: str, detail: str | None = None, **extra: Any) -> None:
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
        self.write_json("status.json", data)

    # --- timeline ---

    def timeline(self) -> Timeline:
        data = self.read_json("timeline.json", {}) or {}
        return Timeline(
            data.get("acquired_at"),
            data.get("released_at"),
            list(data.get("stages", [])),
            data.get("release_started_at"),
        )

    def write_timeline(self, timeline: Timeline) -> None:
        self.write_json("timeline.json", timeline.to_json())
