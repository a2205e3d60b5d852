"""Small hand-written node scripts with the Plan's stage markers, for testing the runner on its own
(detach, streaming, stages, exit codes, attach, cancel). The image path (pull by digest, the
container, Ray) is tested with the Plan's own node script: tests/infra/plan_env.py.
"""

from __future__ import annotations

import shlex

HEADER = """#!/bin/bash
set -euo pipefail
RUN_ID={run_id}
NODE_RUN_DIR={node_run_dir}
CONTAINER={container}
_mark() {{ printf '##reproduce stage=%s event=%s%s t=%s\\n' "$1" "$2" "${{3:+ status=$3}}" "$(date +%s.%N)"; }}
cd "$NODE_RUN_DIR"
"""


def script(run_id: str, node_run_dir: str, container: str, body: str) -> str:
    q = shlex.quote
    return (
        HEADER.format(run_id=q(run_id), node_run_dir=q(node_run_dir), container=q(container)) + body
    )
