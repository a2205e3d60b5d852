"""The record of what a run created on AWS (run_dir/aws.json), written the moment each thing exists.

Why a file: the launcher can die at any instant (Ctrl-C, SIGKILL, a lost laptop). Whatever it
created must still be findable by `reproduce down RUN`, so every id is written (atomically) as
soon as AWS returns it, before the next call. Only ids and names are kept: never key material.

Why it is not trusted: the file lives in the run directory, which the node's collected files
share, and a disk can fill. So teardown checks every resource's tags before ending it
(launcher/clusters/aws/ownership.py), teardown writes the file only as a best effort (a full
disk must never stop a TerminateInstances), and each launch also leaves a small record of who it
is (run id, launch id, region, account, where its aws.json is) under the launcher's own state
directory, outside any run directory: `down` trusts that record over aws.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from launcher.errors import BadInput, InfraError
from launcher.records import jsonread
from launcher.records.atomic import write_atomic

LIST_KEYS = ("instances", "targeted", "addresses", "nodes", "terminated")
NAME_KEYS = ("security_group", "placement_group", "key_pair", "key_file")


def state_root() -> Path:
    """Where keys and state live when no run directory is given (never inside a run directory)."""
    from launcher.records import state  # $REPRODUCE_HOME: the user's one state directory

    explicit = os.environ.get("REPRODUCE_STATE_DIR")  # the older name, for the AWS state only
    return Path(explicit) if explicit else state.home()


class CorruptState(BadInput):
    """aws.json cannot be read as the launcher wrote it (cut short, overwritten, not JSON)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(
            f"{path}: {why}; the run's resources can still be found by their tags.",
            hint="`reproduce down RUN --region REGION` ends them by tag.",
        )
        self.path = path
        self.why = why


class StateNotSaved(InfraError):
    """aws.json could not be written while launching: stop before anything else is created."""


def _write_atomic(path: Path, text: str) -> None:
    """launcher/records/atomic.py's write: a unique temporary file, fsynced, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


class AwsState:
    """A JSON mapping persisted on every change.

    `strict` (the launch): a failed save raises StateNotSaved, so nothing more is created that a
    crash could leave unrecorded. Teardown turns it off: the save is then a best effort and
    `save_error` says what could not be written.
    """

    def __init__(self, path: Path | None, data: dict[str, Any] | None = None) -> None:
        self.path = Path(path) if path else None
        self.data: dict[str, Any] = data or {}
        self.data.setdefault("kind", "aws")
        for key in LIST_KEYS:
            self.data.setdefault(key, [])
        for key in NAME_KEYS:
            self.data.setdefault(key, None)
        self.strict = True
        self.save_error: str | None = None

    @classmethod
    def load(cls, path: Path) -> AwsState:
        """The state in `path`; CorruptState (naming the file) when it is not what we write."""
        path = Path(path)
        try:  # bounded (launcher/records/jsonread.py): the run directory is anyone's
            data = jsonread.load_file(path)
        except jsonread.NodeJSONError as err:
            raise CorruptState(path, f"not valid JSON ({err.message})") from None
        if data is None:
            raise CorruptState(path, "cannot be read (it is gone)")
        problem = shape_problem(data)
        if problem:
            raise CorruptState(path, problem)
        return cls(path, data)

    def save(self) -> None:
        if self.path is None:
            return
        try:
            _write_atomic(self.path, json.dumps(self.data, indent=2, sort_keys=True) + "\n")
            self.save_error = None
        except OSError as err:
            self.save_error = f"{err.strerror or err}"
            if self.strict:
                raise StateNotSaved(
                    f"cannot write {self.path} ({self.save_error}); stopping the launch, "
                    "everything launched so far is being torn down."
                ) from err

    def set(self, **fields: object) -> None:
        self.data.update(fields)
        self.save()

    def add(self, key: str, item: object) -> None:
        if item not in self.data[key]:
            self.data[key].append(item)
        self.save()

    # --- views -----------------------------------------------------------------------------------
    @property
    def launched_instances(self) -> list[str]:
        return [i for i in self.data["instances"] if i not in self.data["targeted"]]

    def allocated(self) -> list[str]:
        """Everything still allocated that the launcher created, in words (for messages)."""
        d = self.data
        out = [f"instance {i}" for i in self.launched_instances]
        out += [f"Elastic IP {a['allocation_id']}" for a in d["addresses"]]
        if d["security_group"]:
            out.append(f"security group {d['security_group']}")
        if d["placement_group"]:
            out.append(f"placement group {d['placement_group']}")
        if d["key_pair"]:
            out.append(f"key pair {d['key_pair']}")
        return out


def shape_problem(data: object) -> str:
    """Why `data` is not an aws.json the launcher wrote ('' when it is)."""
    if not isinstance(data, dict):
        return f"not a JSON object (a {type(data).__name__})"
    for key in ("instances", "targeted", "terminated"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return f"{key!r} is not a list of ids"
    addresses = data.get("addresses", [])
    if not isinstance(addresses, list) or not all(
        isinstance(a, dict) and isinstance(a.get("allocation_id"), str) for a in addresses
    ):
        return "'addresses' is not a list of Elastic IP records"
    for key in (*NAME_KEYS, "run_id", "launch_id", "region", "account"):
        if data.get(key) is not None and not isinstance(data[key], str):
            return f"{key!r} is not a string"
    if not isinstance(data.get("nodes", []), list):
        return "'nodes' is not a list"
    return ""


# ------------------------------------------------------------------------------------------------
# The launcher's own record of each launch (outside every run directory)


def _ledger_dir() -> Path:
    return state_root() / "aws"


def write_launch_record(record: dict[str, Any]) -> None:
    """Who a launch is, written before it creates anything (StateNotSaved when it cannot be)."""
    path = _ledger_dir() / f"launch-{record['launch_id']}.json"
    try:
        _write_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    except OSError as err:
        raise StateNotSaved(
            f"cannot write {path} ({err.strerror or err}); nothing was launched."
        ) from err


def _records() -> list[dict[str, Any]]:
    found = []
    try:
        paths = sorted(_ledger_dir().glob("launch-*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            record = jsonread.load_file(path)
        except jsonread.NodeJSONError:
            continue
        if isinstance(record, dict) and isinstance(record.get("launch_id"), str):
            found.append(record)
    return found


def _same_file(a: object, b: Path) -> bool:
    try:
        return isinstance(a, str) and Path(a).resolve() == b.resolve()
    except OSError:
        return False


def launch_record_for(state_path: Path) -> dict[str, Any] | None:
    """The launcher's own record of the launch whose aws.json is `state_path` (newest first)."""
    mine = [r for r in _records() if _same_file(r.get("state_path"), Path(state_path))]
    mine.sort(key=lambda r: str(r.get("created_at", "")))
    return mine[-1] if mine else None


def launch_record(launch_id: str) -> dict[str, Any] | None:
    for record in _records():
        if record["launch_id"] == launch_id:
            return record
    return None
