"""The record of what a run created on AWS (run_dir/aws.json), written the moment each thing exists.

Why a file: the launcher can die at any instant (Ctrl-C, SIGKILL, a lost laptop). Whatever it
created must still be findable by `reproduce down RUN`, so every id is written (atomically) as
soon as AWS returns it, before the next call. Only ids and names are kept: never key material.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def state_root() -> Path:
    """Where keys and state live when no run directory is given (never inside a run directory)."""
    base = os.environ.get("REPRODUCE_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "reproduce"
    )
    return Path(base)


class AwsState:
    """A JSON mapping persisted on every change."""

    def __init__(self, path: Path | None, data: dict[str, Any] | None = None) -> None:
        self.path = Path(path) if path else None
        self.data: dict[str, Any] = data or {}
        self.data.setdefault("kind", "aws")
        for key in ("instances", "targeted", "addresses", "nodes"):
            self.data.setdefault(key, [])
        for key in ("security_group", "placement_group", "key_pair", "key_file"):
            self.data.setdefault(key, None)

    @classmethod
    def load(cls, path: Path) -> AwsState:
        return cls(path, json.loads(Path(path).read_text()))

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.path)

    def set(self, **fields: Any) -> None:
        self.data.update(fields)
        self.save()

    def add(self, key: str, item: Any) -> None:
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
