"""The parts of node.sh that make several nodes one run: rank, head, the Ray cluster, EFA.

Every node runs the same node.sh (byte for byte what the dry run printed); the launcher starts it
on node K with NODE_RANK=K, HEAD_ADDR (node 0's address), NODE_IP (its own, when known),
NODE_ADDRS (every node's, in order) and NODE_RUN_DIR (its run dir: nodes sharing a disk, as the
one-host tests do, keep theirs apart). Node 0 starts the Ray head and runs the recipe only once
Ray reports every node and every GPU; node K joins node 0's Ray and serves it until the launcher
marks the run finished (state/finished), or fails when its Ray ends first. docs/multinode.md
describes it, and the EFA environment below with the document each variable comes from.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.plan import ray_stage
from launcher.plan.placement import Placement
from launcher.plan.protocol import END_MARK, OUT_DIR, STATE_DIR

if TYPE_CHECKING:
    from launcher.inputs.profile import Profile
    from launcher.inputs.recipe import Recipe

q = shlex.quote


@dataclass(frozen=True)
class EnvVar:
    """One variable of the EFA environment: its value, why it is set, and where that is written."""

    name: str
    value: str
    why: str
    source: str


# The NCCL/libfabric environment for EFA on p5en (docs/multinode.md shows this table). Exported in
# every container of a multi-node run on EFA before Ray starts; the profile's and the recipe's env
# come after it and win. RDMAV_FORK_SAFE is left unset on purpose (docs/aws.md).
EFA_ENV: tuple[EnvVar, ...] = (
    EnvVar(
        "FI_PROVIDER",
        "efa",
        "libfabric uses the EFA provider, never a slower one it also finds (tcp, shm)",
        "AWS EC2 User Guide, 'Get started with EFA and NCCL' (efa-start-nccl.html): the NCCL "
        "tests there run with FI_PROVIDER=efa",
    ),
    EnvVar(
        "FI_EFA_USE_HUGE_PAGE",
        "0",
        "no huge-page bounce buffers: a process that forks (data loaders) does not fail to "
        "allocate them",
        "AWS EC2 User Guide, 'Get started with EFA and NCCL': with libfabric >= 1.18 and "
        "aws-ofi-nccl >= 1.7 the one variable still advised (docs/aws.md)",
    ),
    EnvVar(
        "NCCL_NET",
        "AWS Libfabric",
        "NCCL must use the aws-ofi-nccl plugin: without it NCCL fails at start instead of falling "
        "back to TCP sockets, several times slower",
        "NCCL user guide, Environment Variables, NCCL_NET (docs.nvidia.com/deeplearning/nccl); the "
        "name every aws-ofi-nccl version answers to: aws-ofi-nccl, src/nccl_ofi_interface_nvidia.c",
    ),
    EnvVar(
        "NCCL_DEBUG",
        "INFO",
        "the log records which network NCCL chose (NET/OFI ... efa): the run's evidence that it "
        "used EFA",
        "NCCL user guide, Environment Variables, NCCL_DEBUG",
    ),
    EnvVar(
        "NCCL_DEBUG_SUBSYS",
        "INIT,NET",
        "only start-up and network lines, not one per collective",
        "NCCL user guide, Environment Variables, NCCL_DEBUG_SUBSYS",
    ),
)


def spans_nodes(recipe: Recipe, profile: Profile) -> bool:
    """Does node.sh run on several nodes? (a Ray cluster's job runs once: Ray spreads it)"""
    return recipe.nodes > 1 and profile.kind != "ray"


def efa_env(recipe: Recipe, profile: Profile) -> list[tuple[str, str]]:
    """The EFA environment when the profile asks for it (efa_env; null: aws, several nodes)."""
    wanted = profile.efa_env
    if wanted is None:
        wanted = profile.kind == "aws" and spans_nodes(recipe, profile)
    return [(v.name, v.value) for v in EFA_ENV] if wanted else []


def header_lines(ctx: Placement) -> list[str]:
    """node.sh's multi-node header: what the launcher gives each node at launch, with the
    defaults that let a person run it by hand on node 0."""
    if not spans_nodes(ctx.recipe, ctx.profile):
        return []
    r = ctx.recipe
    return [
        f"# {r.nodes} nodes: the launcher starts this script on each with NODE_RANK (0 = the Ray "
        "head, which runs the recipe),",
        "# HEAD_ADDR (node 0's address), NODE_IP (this node's), NODE_ADDRS (all, in order) and "
        "NODE_RUN_DIR",
        'NODE_RANK="${NODE_RANK:-0}"',
        'HEAD_ADDR="${HEAD_ADDR:-}"',
        "NODE_IP=\"${NODE_IP:-$(hostname -I | awk '{print $1}')}\"",
        'NODE_ADDRS="${NODE_ADDRS:-$NODE_IP}"',
        'if [ "$NODE_RANK" = 0 ]; then HEAD_ADDR="${HEAD_ADDR:-$NODE_IP}"; fi',
        'if [ -z "$HEAD_ADDR" ]; then echo "reproduce: node $NODE_RANK has no HEAD_ADDR" >&2; '
        "exit 1; fi",
        "export NODE_RANK HEAD_ADDR NODE_IP NODE_ADDRS",
    ]


def run_dir_line(ctx: Placement) -> str:
    """NODE_RUN_DIR: the plan's; for several nodes the launcher's NODE_RUN_DIR may name another."""
    if spans_nodes(ctx.recipe, ctx.profile):
        return f'NODE_RUN_DIR="${{NODE_RUN_DIR:-{_dq(ctx.node_run_dir)}}}"'
    return f"NODE_RUN_DIR={q(ctx.node_run_dir)}"


def container_line(ctx: Placement) -> str:
    """The run's container name; for several nodes one per node (reproduce-<id>-node<K>)."""
    if spans_nodes(ctx.recipe, ctx.profile):
        return f'CONTAINER={q(ctx.container + "-node")}"${{NODE_RANK:-0}}"'
    return f"CONTAINER={q(ctx.container)}"


def mount_words(ctx: Placement, scripts_at: str) -> list[str]:
    """`DOCKER_ARGS+=(...)` with the mounts of a multi-node run, following $NODE_RUN_DIR."""
    if not spans_nodes(ctx.recipe, ctx.profile):
        return []
    return [
        "# this node's run dir (NODE_RUN_DIR) mounted as in a one-node run",
        f'DOCKER_ARGS+=(-v "$NODE_RUN_DIR/{OUT_DIR}:$NODE_RUN_DIR/{OUT_DIR}" '
        f'-v "$NODE_RUN_DIR/{STATE_DIR}:$NODE_RUN_DIR/{STATE_DIR}:ro" '
        f'-v "$NODE_RUN_DIR/scripts:{scripts_at}:ro")',
    ]


def env_names(ctx: Placement) -> list[str]:
    """What every container of a multi-node run gets from node.sh's environment (-e NAME)."""
    if not spans_nodes(ctx.recipe, ctx.profile):
        return []
    return ["NODE_RANK", "HEAD_ADDR", "NODE_IP", "NODE_ADDRS"]


def env_args(ctx: Placement) -> list[str]:
    """-e NAME=VALUE of the EFA environment, for every container (the GPU preflight's too)."""
    args: list[str] = []
    for name, value in efa_env(ctx.recipe, ctx.profile):
        args += ["-e", f"{name}={value}"]
    return args


def preflight_args(ctx: Placement) -> str:
    """The GPU preflight's all-reduce across every node (--nnodes: node 0 is the rendezvous), so a
    fall-back to TCP fails allreduce_multinode_busbw_gbps before any training minute."""
    if not spans_nodes(ctx.recipe, ctx.profile):
        return ""
    port = int(ctx.profile.preflight.rendezvous_port)
    return (
        f' --nnodes {ctx.recipe.nodes} --node-rank "$NODE_RANK" --master-addr "$HEAD_ADDR" '
        f"--master-port {port}"
    )


# `ray start` gives its own raylet 30 s to register with the GCS; many nodes joining at once (or a
# busy machine) can take longer, so a node tries this many times before its ray stage fails.
RAY_START_TRIES = 3


def ray_lines(ctx: Placement) -> list[str]:
    """The ray stage of a multi-node run (in the training container).

    Node K waits for node 0's Ray to answer, joins it, and serves it until the launcher marks the
    run finished; its raylet ending first fails it (and so the run). Node 0 starts the head and
    waits until Ray reports every node and every GPU, or fails naming the nodes missing.
    """
    r, p = ctx.recipe, ctx.profile
    port = int(p.ray.port)
    wait = float(p.ray.join_timeout_s)
    dash = "--include-dashboard=true" if p.ray.dashboard else "--include-dashboard=false"
    tool = f'python3 "{ctx.scripts}/ray_nodes.py"'
    finished = f'"$NODE_RUN_DIR/{END_MARK}"'
    tries = RAY_START_TRIES
    return [
        ray_stage.cleanup_line(ctx.own_pid_namespace, job_step=ctx.pyxis),
        f"# ray start, up to {tries} times (a busy GCS can let one registration time out)",
        "_ray_start() {",
        "  local n=0",
        '  until ray start --log-color false "$@"; do',
        "    n=$((n + 1))",
        "    ray stop --force >/dev/null 2>&1 || true",
        f'    if [ "$n" -ge {tries} ]; then',
        f'      echo "reproduce: Ray did not start on node $NODE_RANK ({tries} tries)" >&2',
        "      return 1",
        "    fi",
        f'    echo "reproduce: ray start failed on node $NODE_RANK; again ($n of {tries})" >&2',
        "    sleep 5",
        "  done",
        "}",
        f"# nodes 1..{r.nodes - 1} join node 0's Ray and serve it until the run is finished; only "
        "node 0 runs the recipe",
        'if [ "$NODE_RANK" != 0 ]; then',
        f'  {tool} wait-head --address "$HEAD_ADDR:{port}" --timeout-s {wait:g}',
        f'  _ray_start --address "$HEAD_ADDR:{port}" --node-ip-address "$NODE_IP" '
        f"--num-gpus {r.gpus_per_node} --disable-usage-stats",
        f"  while [ ! -e {finished} ]; do",
        "    if ! grep -qsx raylet /proc/[0-9]*/comm; then",
        '      echo "reproduce: Ray on node $NODE_RANK stopped before the run finished" >&2',
        "      exit 1",
        "    fi",
        "    sleep 1",
        "  done",
        "  _stage_end",
        "  exit 0",
        "fi",
        f'_ray_start --head --node-ip-address "$NODE_IP" --port {port} '
        f"--num-gpus {r.gpus_per_node} --disable-usage-stats {dash}",
        f'export RAY_ADDRESS="$NODE_IP:{port}"',
        f"# training starts only once Ray reports all {r.nodes} nodes and {r.gpu_count} GPUs",
        f'{tool} wait-nodes --address "$RAY_ADDRESS" --nodes {r.nodes} '
        f'--gpus {r.gpu_count} --expect "$NODE_ADDRS" --timeout-s {wait:g}',
    ]


def _dq(text: str) -> str:
    """Text safe inside double quotes in bash."""
    return "".join("\\" + c if c in '"$`\\' else c for c in text)
