"""The body of `reproduce image build`: docker's output on stderr as it comes, the result on stdout.

stdout carries only what a script or a person needs afterwards: the pushed reference, what it
was built FROM, the record, and the profile lines that make a run use it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from launcher.prepare.image import BuildRequest, build_and_push


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:  # a closed terminal never stops a build that is under way
        pass


def build_command(req: BuildRequest, *, ecr_client: Any = None) -> int:
    result = build_and_push(req, say=_say, ecr_client=ecr_client)
    record = Path(result.record_path).resolve()
    base = result.record["base"]
    print(f"image     {result.ref}")
    print(f"built     FROM {result.base_ref} (the recipe's {base['recipe_field']})")
    print(f"record    {record}")
    print("use it in a cluster profile (schema/profile.schema.yaml):")
    print("  image:")
    print(f"    record: {record}")
    return 0
