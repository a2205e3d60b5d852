"""Small hand-written node scripts with the Plan's stage markers, for testing the runner on its own
(detach, streaming, stages, exit codes, attach, cancel). The image path (pull by digest, the
container, Ray) is tested with the Plan's own node script: tests/support/plan_env.py.

`job` wraps such a script in a real Plan (the seed recipe on the local profile), so the runner is
driven exactly as the CLI drives it: `Runner(...).execute(plan, run_dir, cluster)`.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
from pathlib import Path

from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.plan.plan import Plan, build_plan
from launcher.records.rundir import RunDir
from support.paths import SEED

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


@functools.lru_cache(maxsize=1)
def _seed_plan() -> Plan:
    return build_plan(load_recipe(SEED), load_profile("local"), run_id="seed")


def plan_running(run_id: str, node_run_dir: str, node_script: str) -> Plan:
    """The seed's Plan (local profile) for `run_id`, with `node_script` as its node script."""
    return dataclasses.replace(
        _seed_plan(),
        run_id=run_id,
        node_run_dir=node_run_dir,
        container=f"reproduce-{run_id}",
        node_script=node_script,
    )


def plan_with_script(run_id: str, node_run_dir: str, body: str) -> Plan:
    """The seed's Plan for `run_id`, running the hand-written `body` under `script`'s header."""
    return plan_running(
        run_id, node_run_dir, script(run_id, node_run_dir, f"reproduce-{run_id}", body)
    )


def job(
    runs_root: Path, node_root: Path, body: str, slug: str = "test/local"
) -> tuple[RunDir, Plan]:
    """A fresh run dir and the Plan that runs `body` in <node_root>/<run id> on the node."""
    rd = RunDir.create(runs_root, slug)
    return rd, plan_with_script(rd.run_id, str(node_root / rd.run_id), body)
