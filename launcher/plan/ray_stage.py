"""The ray stage of a one-node run, and how every run's Ray ends.

Why a module of its own: one node (here) and many (launcher/plan/multinode.py) start Ray
differently, but end it the same way, and that end differs by runtime for a reason worth
keeping in one place (`cleanup_line`).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe


def own_pid_namespace(docker: bool, extra_args: list[str]) -> bool:
    """Whether the training container gets a PID namespace of its own: docker's default, unless
    the profile's docker.extra_args name one (`--pid host`, `--pid=container:...`)."""
    return docker and not any(a == "--pid" or a.startswith("--pid=") for a in extra_args)


# A pyxis step's own processes: each carries its job's and its step's id in its environment
# (Ray's daemons and workers inherit them from `ray start`), and no process of another step does.
STEP_CLEANUP = (
    '_cleanup() { local p; for p in /proc/[0-9]*; do [ "${p#/proc/}" = $$ ] && continue; '
    'tr "\\0" "\\n" < "$p/environ" 2>/dev/null | grep -qxF "SLURM_STEP_ID=$SLURM_STEP_ID" '
    '&& tr "\\0" "\\n" < "$p/environ" 2>/dev/null | grep -qxF "SLURM_JOB_ID=$SLURM_JOB_ID" '
    '&& kill -9 "${p#/proc/}" 2>/dev/null; done; true; }'
)


def cleanup_line(own_namespace: bool, *, job_step: bool = False) -> str:
    """How the run's Ray ends when the training script does (its EXIT trap's `_cleanup`).

    In a container with a PID namespace of its own (`own_pid_namespace`) nothing is left to do:
    the script is the container's first process, and its exit makes the kernel SIGKILL every
    other process of that namespace (what `ray stop --force` sends) and wait for them all before
    the container counts as ended. A `ray stop` there would spend over a CPU-second importing Ray
    to do the same (docs/benchmarks.md, "A Ray cycle's CPU"). On the host (`runtime: host`), or in
    a container that shares another PID namespace, Ray outlives the script unless it is stopped.
    A pyxis step (`job_step`) shares the node's PID namespace, where `ray stop` would end every
    Ray on the machine, another step's or another user's too: its cleanup SIGKILLs the step's own
    processes only (STEP_CLEANUP), as the end of a PID namespace would.
    """
    if job_step:
        return STEP_CLEANUP
    if own_namespace:
        return "# Ray ends with the container: its processes die with the container's PID namespace"
    return "_cleanup() { ray stop --force >/dev/null 2>&1 || true; }"


def head_lines(
    recipe: Recipe, profile: Profile, *, own_namespace: bool, job_step: bool = False
) -> list[str]:
    """Start the one node's Ray head, controlled by this run."""
    port = int(profile.ray.port)
    dash = "--include-dashboard=true" if profile.ray.dashboard else "--include-dashboard=false"
    ip = profile.ray.node_ip_address or "127.0.0.1"
    # --log-color false: Ray's CLI colours its output even into a file; logs/ray.log stays text
    return [
        f"NODE_IP={shlex.quote(ip)}",
        cleanup_line(own_namespace, job_step=job_step),
        f'ray start --head --node-ip-address "$NODE_IP" --port {port} '
        f"--num-gpus {recipe.gpus_per_node} --disable-usage-stats --log-color false {dash}",
        f'export RAY_ADDRESS="$NODE_IP:{port}"',
    ]
