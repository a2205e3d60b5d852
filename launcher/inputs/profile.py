"""Cluster profiles: where a recipe runs (env/<name>.yaml, or any profile file).

The shape and every default live in schema/profile.schema.yaml; this module resolves a name or a
path, validates, and answers `profile.get("docker.shm_size")` with the value or the schema's
default, so no default is written twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from launcher.errors import BadInput
from launcher.inputs.yamlschema import (
    FastSafeLoader,
    format_problems,
    read_yaml_mapping,
    schema_problems,
)
from launcher.resources import data_dir

_MISSING = object()


@dataclass(frozen=True)
class Profile:
    """A validated cluster profile. `raw` is the file's mapping; `get` fills in schema defaults."""

    name: str
    path: Path
    raw: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.raw["kind"]

    def get(self, dotted: str, default: Any = _MISSING) -> Any:
        """Value at a dotted path ("docker.gpus"), else the schema's default, else `default`."""
        node: Any = self.raw
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                node = _MISSING
                break
            node = node[part]
        if node is not _MISSING:
            return node
        found = schema_default(dotted)
        if found is not _MISSING:
            return found
        if default is not _MISSING:
            return default
        raise KeyError(f"profile field {dotted!r} has no value and no default")

    def with_overrides(self, **fields: Any) -> Profile:
        """A copy with top-level fields replaced (CLI flags such as --instance-id)."""
        raw = {**self.raw, **{k: v for k, v in fields.items() if v is not None}}
        return Profile(self.name, self.path, raw)


@cache
def profile_schema() -> dict[str, Any]:
    path = data_dir("schema") / "profile.schema.yaml"
    return yaml.load(path.read_text(encoding="utf-8"), Loader=FastSafeLoader)  # noqa: S506


def schema_default(dotted: str) -> Any:
    node: Any = profile_schema()
    for part in dotted.split("."):
        props = node.get("properties") if isinstance(node, dict) else None
        if not props or part not in props:
            return _MISSING
        node = props[part]
    return node.get("default", _MISSING)


def available_profiles() -> list[str]:
    return sorted(p.stem for p in data_dir("env").glob("*.yaml"))


def resolve_profile_path(name_or_path: str) -> Path:
    """A name from env/ ("aws") or a path to a profile file."""
    candidate = Path(name_or_path).expanduser()
    looks_like_path = candidate.suffix in (".yaml", ".yml") or "/" in name_or_path
    if looks_like_path:
        if not candidate.is_file():
            raise BadInput(f"--cluster {name_or_path}: no such profile file.")
        return candidate
    path = data_dir("env") / f"{name_or_path}.yaml"
    if not path.is_file():
        raise BadInput(
            f"--cluster {name_or_path}: no profile of that name; expected one of "
            f"{', '.join(available_profiles())} or a path to a profile file."
        )
    return path


def load_profile(name_or_path: str) -> Profile:
    """Resolve, read and validate a profile; BadInput names the file and every bad field."""
    path = resolve_profile_path(name_or_path)
    raw, _ = read_yaml_mapping(path, "cluster profile")
    problems = schema_problems(raw, profile_schema())
    if not problems:
        problems = kind_problems(raw)
    if problems:
        raise BadInput(format_problems(path, "cluster profile", problems))
    return Profile(name=path.stem, path=path, raw=raw)


def kind_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Fields set for another kind of profile, and the fields a kind cannot do without."""
    kind = raw["kind"]
    props = profile_schema()["properties"]
    problems = []
    for key in raw:
        kinds = props.get(key, {}).get("x-kinds")
        if kinds and kind not in kinds and raw[key] is not None:
            problems.append(
                (key, f"applies to kind {', '.join(kinds)}, not {kind}; remove it or change kind")
            )
    if kind == "ssh" and not raw.get("host") and not raw.get("hosts"):
        problems.append(
            (
                "host",
                "missing; a profile of kind ssh needs the node's host name or address "
                "(or `hosts`: one per node, node 0 first)",
            )
        )
    if kind == "ssh" and raw.get("host") and raw.get("hosts"):
        problems.append(("hosts", "give `host` (one node) or `hosts` (a list), not both"))
    if kind == "ray" and not raw.get("address"):
        problems.append(
            (
                "address",
                "missing; a profile of kind ray needs the cluster's job server, e.g. http://head:8265",
            )
        )
    cidr = raw.get("ssh_cidr")
    if isinstance(cidr, str) and cidr.strip() in ("0.0.0.0/0", "::/0"):
        problems.append(
            (
                "ssh_cidr",
                f"{cidr} opens SSH to the whole internet; expected the operator's address as a /32",
            )
        )
    return problems
