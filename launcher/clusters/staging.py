"""What goes to a node before its script starts, and what comes back after it ended.

To the node's run directory (fresh, private, in a work dir only we can write to): node.sh (the
Plan's script, byte for byte), the wrapper, the launcher's node-side programs under scripts/, and
last the secrets as a 0600 `.secrets.env` that node.sh sources once and deletes; a staging or a
launch that fails removes it again. Back into the run dir: the result files named in
protocol.RESULT_FILES, and only those, as regular files read without following a symlink.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from launcher.clusters.base import Transport
from launcher.errors import BadInput, InfraError
from launcher.excerpt import excerpt_lines
from launcher.inputs.profile import Profile
from launcher.plan.protocol import (
    RESULT_FILES,
    SECRETS_FILE,
    WRAPPER,
    WRAPPER_NAME,
    collect_command,
    launch_command,
    parse_collect,
    prepare_dir_command,
)
from launcher.records.rundir import LAUNCHER_FILES, RunDir

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A result file never takes the name of a file the launcher writes itself (run.json, aws.json, ...).
assert not set(RESULT_FILES) & LAUNCHER_FILES, "a result file would overwrite the run's record"


def default_scripts_dir() -> Path | None:
    """The launcher's node-side programs (scripts/), wherever the package was installed from."""
    from launcher.resources import data_dir

    try:
        return data_dir("scripts")
    except FileNotFoundError:
        return None


def secrets_for(profile: Profile) -> dict[str, str]:
    """Secrets read from the launcher's environment; they travel to the node only (a 0600 file).

    The variable is the one `secrets.hf_token_env` names (checked when the Plan is built:
    launcher/plan/plan.py refuses a name that is not a Hugging Face token's).
    """
    name = profile.secrets.hf_token_env
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
    """Everything the node script needs, in a fresh run directory on the node; the secrets last."""
    prepared = transport.run(prepare_dir_command(node_run_dir), check=False)
    if prepared.exit_code != 0:
        why = excerpt_lines(prepared.stderr or prepared.stdout, 1)
        raise InfraError(
            f"cannot prepare the run directory {node_run_dir} on the node: "
            f"{why[-1] if why else f'exit {prepared.exit_code}'}"
        )
    transport.put_text(node_script, f"{node_run_dir}/node.sh", mode=0o755)
    transport.put_text(WRAPPER, f"{node_run_dir}/{WRAPPER_NAME}", mode=0o755)
    if scripts_dir is not None and scripts_dir.is_dir():
        for path in sorted(scripts_dir.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                rel = path.relative_to(scripts_dir).as_posix()
                transport.put(
                    path, f"{node_run_dir}/scripts/{rel}", mode=path.stat().st_mode & 0o755
                )
    if secrets:
        transport.put_text(secrets_env(secrets), f"{node_run_dir}/{SECRETS_FILE}", mode=0o600)


def discard_secrets(transport: Transport, node_run_dir: str) -> None:
    """After a failed staging or launch: the secrets file must not stay on the node (best effort:
    the node may be unreachable, and the failure that brought us here is what the user needs)."""
    try:
        transport.run(f"rm -f {shlex.quote(f'{node_run_dir}/{SECRETS_FILE}')}", timeout_s=30)
    except Exception:  # noqa: BLE001 - never hide the staging's own failure behind this one
        return


def launch(transport: Transport, node_run_dir: str, env: Mapping[str, str] | None = None) -> int:
    """Start the staged script detached (with `env`: a multi-node run's rank and head); returns
    its pid (= its process group)."""
    out = transport.run(launch_command(node_run_dir, env), timeout_s=60).stdout.strip()
    try:
        return int(out.splitlines()[-1])
    except (IndexError, ValueError):
        raise InfraError(
            f"the node script did not start in {node_run_dir} (no pid written)"
        ) from None


def collect(rd: RunDir, transport: Transport, node_run_dir: str) -> tuple[list[str], list[str]]:
    """The node's result files (protocol.RESULT_FILES) into the run dir: (collected, refused)."""
    answer = transport.run(collect_command(node_run_dir), check=False)
    files, refused = parse_collect(answer.stdout)
    for name, data in files.items():
        rd.write_bytes(name, data)
    return sorted(files), refused
