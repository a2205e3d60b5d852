"""Cluster profiles: where a recipe runs (env/<name>.yaml, or any profile file), as typed objects.

The shape and every default live in schema/profile.schema.yaml; this module resolves a name or a
path, validates, and builds one frozen dataclass per kind (LocalProfile, SshProfile, AwsProfile,
RayProfile; the fields all kinds share in Profile), each field filled from the file or else from
the schema's default, so no default is written twice and mypy catches a misspelt field (a dotted
string could not). `raw` stays the file's mapping: the run directory keeps it, and the SSH
backend reads a host list and its per-host overrides from it exactly as a run record has them.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

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
# The profile's fields that may break lines: its env values (quoted in node.sh, like a recipe's).
TEXT_BLOCKS = (("env", "*"),)
Kind = Literal["local", "ssh", "aws", "ray", "slurm"]


@dataclass(frozen=True)
class DockerSettings:
    """How `docker run` starts the training container (schema: docker)."""

    gpus: str | None
    shm_size: str
    ipc_host: bool
    network_host: bool
    network: str | None
    efa_devices: str
    memlock_unlimited: bool
    stack_bytes: int
    extra_args: list[str]
    pull: bool
    host_clock: bool  # the training container's output stamped with the host's clock


@dataclass(frozen=True)
class SecretSettings:
    """Where the node's secrets come from (schema: secrets)."""

    hf_token_env: str | None


@dataclass(frozen=True)
class AssetSettings:
    """Where the run's assets live on the node and in a store (schema: assets)."""

    hf_ckpt: str | None
    torch_dist: str | None
    sft_data: str | None
    verify_sha256: bool
    store: str | None


@dataclass(frozen=True)
class PreflightSettings:
    """The GPU preflight's switches and thresholds (schema: preflight)."""

    enabled: bool
    disk_min_gb: float
    thresholds: dict[str, Any]
    rendezvous_port: int


@dataclass(frozen=True)
class RayStartSettings:
    """How node.sh starts Ray on the node(s) (schema: ray; not the `kind: ray` target)."""

    node_ip_address: str | None
    port: int
    dashboard: bool
    join_timeout_s: float


@dataclass(frozen=True)
class CapacitySettings:
    """Which EC2 capacity to launch into (schema: capacity)."""

    type: str
    reservation_id: str | None
    max_spot_price: float | None


@dataclass(frozen=True)
class Profile:
    """What every kind of profile has. Kind-specific fields are on the subclasses: code that needs
    one asks `isinstance(profile, AwsProfile)`, which is also what makes mypy check it."""

    name: str
    path: Path
    raw: dict[str, Any]
    kind: Kind
    description: str | None
    work_dir: str
    cache_dir: str
    price_per_hour: float | None
    instance_type: str | None
    region: str | None
    runtime: str
    image: dict[str, str] | None
    docker: DockerSettings
    env: dict[str, Any]
    efa_env: bool | None
    disable_nvlink_multicast: bool
    secrets: SecretSettings
    assets: AssetSettings
    preflight: PreflightSettings
    stack_check: str
    ray: RayStartSettings

    def with_overrides(self, **fields: object) -> Profile:
        """A copy with top-level fields replaced (CLI flags such as --instance-id); None keeps."""
        given: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
        return dataclasses.replace(self, raw={**self.raw, **given}, **given)


@dataclass(frozen=True)
class _Reach:
    """How SSH reaches a node (kinds ssh and aws)."""

    port: int
    user: str | None
    identity_file: str | None
    connect_host: str | None
    connect_timeout_s: float
    io_timeout_s: float
    known_hosts: str | None
    host_key_fingerprint: str | None
    accept_unknown_host: bool


@dataclass(frozen=True)
class LocalProfile(Profile):
    """This host."""


@dataclass(frozen=True)
class SshProfile(Profile, _Reach):
    """An existing host, or a list of hosts (node 0 first), over SSH."""

    host: str | None
    hosts: list[Any] | None


@dataclass(frozen=True)
class AwsProfile(Profile, _Reach):
    """EC2 instances the launcher provisions, or one it targets (instance_id)."""

    ami: str | None
    subnet_id: str | None
    key_name: str | None
    ssh_cidr: str | None
    capacity: CapacitySettings
    instance_id: str | None
    ttl_hours: float
    root_volume_gb: int
    root_volume_throughput: int  # MiB/s provisioned on the gp3 root volume (docker's image store)
    root_volume_iops: int
    efa_layout: str
    elastic_ip: bool
    self_terminate: bool
    run_end_grace_s: float  # the instance ends itself this long after its run ends
    ready_timeout_s: float
    host_key_wait_s: float
    tags: dict[str, Any]
    bake_instance_type: str  # `reproduce image bake`: the instance that makes the AMI
    bake_base_ami: str | None
    bake_timeout_s: float
    volume_initialization_rate: int | None  # MiB/s: the root volume filled from its snapshot


@dataclass(frozen=True)
class RayProfile(Profile):
    """An existing Ray cluster, reached through its job server."""

    address: str | None
    image_digest_env: str | None
    nodes_wait_s: float


@dataclass(frozen=True)
class SlurmProfile(Profile, _Reach):
    """A Slurm cluster: one batch job per run, submitted on its login node (this host, or
    `login_host` over SSH, whose key is checked as an ssh profile's). `work_dir` is the cluster's
    shared directory, seen alike by the login node and every compute node."""

    login_host: str | None
    partition: str | None
    account: str | None
    qos: str | None
    reservation: str | None
    constraint: str | None
    time_limit_hours: float | None
    container_runtime: str
    gpu_option: str


PROFILE_TYPES: dict[str, type[Profile]] = {
    "local": LocalProfile,
    "ssh": SshProfile,
    "aws": AwsProfile,
    "ray": RayProfile,
    "slurm": SlurmProfile,
}
_OWN = ("name", "path", "raw")  # not profile fields: where the profile came from


def build_profile(name: str, path: Path, raw: dict[str, Any]) -> Profile:
    """The typed profile of a validated mapping: each field from `raw`, else the schema default."""
    cls = PROFILE_TYPES[raw["kind"]]
    values = _fill(cls, raw, "", skip=_OWN)
    return cls(name=name, path=path, raw=raw, **values)


def _fill(
    cls: type, raw: dict[str, Any], prefix: str, skip: tuple[str, ...] = ()
) -> dict[str, Any]:
    hints = get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        dotted = prefix + f.name
        section = _dataclass_in(hints[f.name])
        if section is not None:
            sub = raw.get(f.name)
            out[f.name] = section(
                **_fill(section, sub if isinstance(sub, dict) else {}, dotted + ".")
            )
            continue
        if f.name in raw:
            out[f.name] = raw[f.name]
            continue
        found = schema_default(dotted)
        out[f.name] = None if found is _MISSING else copy.deepcopy(found)  # never the schema's own
    return out


def _dataclass_in(hint: object) -> type | None:
    """The dataclass a field's type names (X or X | None), else None."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    if get_origin(hint) in (Union, types.UnionType):
        for arg in get_args(hint):
            if dataclasses.is_dataclass(arg) and isinstance(arg, type):
                return arg
    return None


@cache
def profile_schema() -> dict[str, Any]:
    path = data_dir("schema") / "profile.schema.yaml"
    schema: dict[str, Any] = yaml.load(path.read_text(encoding="utf-8"), Loader=FastSafeLoader)  # noqa: S506
    return schema


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
    problems = schema_problems(raw, profile_schema(), TEXT_BLOCKS)
    if not problems:
        problems = kind_problems(raw)
    if problems:
        raise BadInput(format_problems(path, "cluster profile", problems))
    return build_profile(path.stem, path, raw)


def _repeated_hosts(hosts: list[Any]) -> list[tuple[str, str]]:
    """Each entry of `hosts` is a node of its own: two nodes on one machine would start two Ray
    nodes on one address and share its GPUs, and the run would be judged as if it had them all."""
    seen: dict[str, int] = {}
    problems = []
    for k, entry in enumerate(hosts):
        host = str(entry.get("host") if isinstance(entry, dict) else entry)
        where = f"hosts[{k}].host" if isinstance(entry, dict) else f"hosts[{k}]"
        if host in seen:
            problems.append(
                (where, f"{host} is hosts[{seen[host]}] again; expected one machine per node")
            )
        seen.setdefault(host, k)
    return problems


# A slurm profile's directories reach `#SBATCH --output=` lines, which sbatch reads itself (no
# shell, no quoting): only characters that need none.
_SBATCH_PATH = re.compile(r"/[A-Za-z0-9_./+-]*")


def _slurm_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """What a slurm profile cannot do without, and directories sbatch could not read as given."""
    problems = []
    if not raw.get("partition"):
        problems.append(
            ("partition", "missing; a profile of kind slurm names the partition its jobs ask for")
        )
    work = raw.get("work_dir")
    if isinstance(work, str) and not _SBATCH_PATH.fullmatch(work):
        problems.append(
            (
                "work_dir",
                f"{work!r} holds characters an #SBATCH line cannot carry unquoted; expected an "
                "absolute path of letters, digits and . _ + - /",
            )
        )
    return problems


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
    problems += _repeated_hosts(raw.get("hosts") or [])
    if kind == "ray" and not raw.get("address"):
        problems.append(
            (
                "address",
                "missing; a profile of kind ray needs the cluster's job server, e.g. http://head:8265",
            )
        )
    problems += _slurm_problems(raw) if kind == "slurm" else []
    cidr = raw.get("ssh_cidr")
    if isinstance(cidr, str) and cidr.strip() in ("0.0.0.0/0", "::/0"):
        problems.append(
            (
                "ssh_cidr",
                f"{cidr} opens SSH to the whole internet; expected the operator's address as a /32",
            )
        )
    return problems
