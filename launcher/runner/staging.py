"""What goes to a node before its script starts, and what comes back after it ended.

To the node's run directory: node.sh (the Plan's script, byte for byte), the wrapper, the
launcher's node-side programs under scripts/, and the secrets as a 0600 `.secrets.env` that
node.sh sources once and deletes. Back into the run dir: the result files (*.json) the script
left there.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from launcher.clusters.base import Transport
from launcher.errors import BadInput, InfraError
from launcher.profile import Profile
from launcher.rundir import RunDir
from launcher.runner.protocol import (
    WRAPPER,
    WRAPPER_NAME,
    launch_command,
    list_results_command,
    prepare_dir_command,
)

# Files of the run dir's own record: a node file of the same name is kept under node/ instead.
_RESERVED = {"run.json", "status.json", "timeline.json", "plan.json", "verdict.json"}
_RESULT_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.json$")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def default_scripts_dir() -> Path | None:
    """The launcher's node-side programs (scripts/), wherever the package was installed from."""
    from launcher.resources import data_dir

    try:
        return data_dir("scripts")
    except FileNotFoundError:
        return None


def secrets_for(profile: Profile) -> dict[str, str]:
    """Secrets read from the launcher's environment; they travel to the node only (a 0600 file)."""
    name = profile.get("secrets.hf_token_env")
    value = os.environ.get(name) if name else None
    return {"HF_TOKEN": value} if value else {}


def secrets_env(secrets: Mapping[str, str]) -> str:
    """KEY='value' lines that node.sh sources once (then deletes); never written locally."""
    lines = []
    for key, value in secrets.items():
        if not _ENV_NAME.fullmatch(key):
            raise BadInput(f"secret name {key!r} is not a valid environment variable name")
        lines.append(f"{key}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def stage(
    transport: Transport,
    node_run_dir: str,
    node_script: str,
    scripts_dir: Path | None,
    secrets: Mapping[str, str] | None = None,
) -> None:
    """Everything the node script needs, in its run directory on the node."""
    transport.run(prepare_dir_command(node_run_dir))
    if secrets:
        transport.put_text(secrets_env(secrets), f"{node_run_dir}/.secrets.env", mode=0o600)
    transport.put_text(node_script, f"{node_run_dir}/node.sh", mode=0o755)
    transport.put_text(WRAPPER, f"{node_run_dir}/{WRAPPER_NAME}", mode=0o755)
    if scripts_dir is not None and scripts_dir.is_dir():
        for path in sorted(scripts_dir.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                rel = path.relative_to(scripts_dir).as_posix()
                transport.put(
                    path, f"{node_run_dir}/scripts/{rel}", mode=path.stat().st_mode & 0o777
                )


def launch(transport: Transport, node_run_dir: str) -> int:
    """Start the staged script detached; returns its pid (= its process group)."""
    out = transport.run(launch_command(node_run_dir), timeout_s=60).stdout.strip()
    try:
        return int(out.splitlines()[-1])
    except (IndexError, ValueError):
        raise InfraError(
            f"the node script did not start in {node_run_dir} (no pid written)"
        ) from None


def collect(rd: RunDir, transport: Transport, node_run_dir: str) -> list[str]:
    """The node's result files (preflight.json, stack.json, ...) into the run dir."""
    listing = transport.run(list_results_command(node_run_dir), check=False).stdout.split()
    got = []
    for name in listing:
        if not _RESULT_NAME.match(name):
            continue
        dest = rd.path / ("node" if name in _RESERVED else "") / name
        try:
            transport.get(f"{node_run_dir}/{name}", dest)
            got.append(name)
        except FileNotFoundError:
            continue
    return got
