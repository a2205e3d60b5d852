"""The Ray digest probe reads the node's own environment, never the job's (issue 19, medium).

A task's environment is the node's (its raylet's) plus the job's runtime env, which the submitter
writes: a recipe `env: {REPRODUCE_IMAGE_DIGEST: <the recipe's digest>}` made a cluster running
another image pass. scripts/ray_cluster.py's `_node_env` now reads the raylet's environment
(/proc of the task's ancestor named raylet). These tests run real processes: a parent whose argv[0]
is `raylet` with the node's value, a child (the "task") with the job's value.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.paths import REPO

SCRIPTS = REPO / "scripts"

TASK = (
    "import json, sys; sys.path.insert(0, {scripts!r}); import ray_cluster; "
    "print(json.dumps(ray_cluster._node_env('REPRODUCE_IMAGE_DIGEST')))"
)


def _probe(*, parent_name: str, node_value: str | None, wrapper: bool = False) -> list:
    task = f"{sys.executable} -c {json.dumps(TASK.format(scripts=str(SCRIPTS)))}"
    # the task runs with the job's value, as a Ray worker with the job's runtime env does
    child = f"REPRODUCE_IMAGE_DIGEST=sha256:job {task}"
    if wrapper:  # an intermediate process between the raylet and the worker
        child = f"bash -c {json.dumps(child + '; true')}"
    # the "raylet": a process whose argv[0] is raylet, holding the node's environment
    script = f"exec -a {parent_name} bash -c {json.dumps(child + '; true')}"
    env = {"PATH": "/usr/bin:/bin"}
    if node_value is not None:
        env["REPRODUCE_IMAGE_DIGEST"] = node_value
    out = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("wrapper", [False, True])
def test_the_node_value_wins_over_the_jobs(wrapper):
    assert _probe(parent_name="raylet", node_value="sha256:node", wrapper=wrapper) == [
        True,
        "sha256:node",
    ]


def test_a_node_that_says_nothing_is_not_taken_at_the_jobs_word():
    assert _probe(parent_name="raylet", node_value=None) == [True, None]


def test_no_raylet_among_the_ancestors_is_said_not_guessed():
    assert _probe(parent_name="not-a-raylet", node_value="sha256:node") == [False, None]
