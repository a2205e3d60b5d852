"""How the launcher reads docker's answer about an image (docs/assets.md, "Errors are not
absence").

Why: `docker image inspect` exits 1 both when the image is not here and when docker cannot be
asked at all (dockerd down, the socket not ours, a hung daemon). Read alike, a dead daemon was
"the image is not here": prepare then offered to pull 20 GB, and a build pulled the recipe's
image to compare layers it could have read. Only docker's own "no such image" means absent;
every other failure is InfraError (exit 3), naming what docker said.
"""

from __future__ import annotations

import subprocess
from typing import Any

from launcher.errors import InfraError
from launcher.excerpt import excerpt
from launcher.records import jsonread

ABSENT = ("no such image", "no such object")  # docker's words, lower-cased, for a missing image
TIMEOUT_S = 60.0


def inspect(ref: str, fmt: str, *, docker: str = "docker", timeout_s: float | None = None) -> Any:
    """`docker image inspect --format FMT REF` read as JSON (FMT must print JSON); None when docker
    says the image is not here; InfraError when docker cannot answer or answers something else."""
    what = f"docker image inspect {ref}"
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    try:
        proc = subprocess.run(
            [docker, "image", "inspect", "--format", fmt, ref],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except FileNotFoundError:
        raise InfraError(f"{what}: docker is not installed here ({docker} not found)") from None
    except subprocess.TimeoutExpired:
        raise InfraError(f"{what}: docker gave no answer within {timeout_s:.0f} s") from None
    except OSError as err:
        raise InfraError(f"{what}: docker cannot be run ({err.strerror or err})") from None
    if proc.returncode != 0:
        if any(words in proc.stderr.lower() for words in ABSENT):
            return None
        raise InfraError(f"{what}: {excerpt(proc.stderr, 3) or f'exit {proc.returncode}'}")
    try:  # bounded: the answer describes an image whose config anyone may have written
        return jsonread.loads(proc.stdout)
    except jsonread.NodeJSONError as err:
        raise InfraError(f"{what}: {err.message}") from None
