"""The one batch script of a run on Slurm, rendered from the Plan: what --dry-run prints byte for
byte and what sbatch gets.

The job asks for whole nodes (`--exclusive`), the recipe's node count and GPUs per node, never to be
requeued (`--no-requeue`: a second attempt would join the first in one log and one measurement),
a time limit, and writes its own output into the run's directory on the shared work dir. Its body
runs node.sh's wrapper once on every node (`srun --ntasks-per-node=1`): node 0 heads Ray, the others
join it, exactly as a multi-node run over SSH does, with the rank, the head's address and every
node's address taken from the job itself (SLURM_NODEID, `scontrol show hostnames`, each node's
NodeAddr). Values in the body are shell-quoted; values in `#SBATCH` lines, which sbatch reads
itself, are held by the profile schema to characters that need no quoting.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from launcher.errors import BadInput
from launcher.inputs.profile import Profile, SlurmProfile
from launcher.plan import enroot_image, stage_graph
from launcher.plan.protocol import CANCEL_MARK, RUN_MARK, WRAPPER_NAME

if TYPE_CHECKING:
    from launcher.inputs.recipe import Recipe
    from launcher.plan.plan import Plan

SCRIPT_NAME = "job.sbatch"
STEP_NAME = "step.sh"  # a run inside a nightly group's allocation: its body, run on the login node
STEP_OUTPUT = "step.out"  # that body's own output (its srun's lines), in node 0's run dir
ALLOCATION_NAME = "allocation.sbatch"  # a nightly group's allocation, kept in its first run's dir
# The launcher that holds a nightly group's allocation touches this file in the allocation's
# directory every HOLDER_BEAT_S; the allocation ends itself HOLDER_GRACE_S after the last touch,
# so a launcher killed outright (SIGKILL, its machine gone) does not hold the nodes until --time.
HOLDER_MARK = "launcher-alive"
HOLDER_BEAT_S = 60.0
HOLDER_GRACE_S = 600
OUTPUT_NAME = "slurm-%j.out"  # sbatch's own output (the batch shell's lines), in node 0's run dir
# Slurm's first version with --gpus-per-node (19.05); older ones take --gres=gpu:N.
GPUS_PER_NODE_SINCE = (19, 5)
MIN_DEFAULT_HOURS = 2.0


@dataclass(frozen=True)
class Batch:
    """Everything the batch script says, decided once (the dry run and the submission)."""

    job_name: str
    partition: str
    account: str | None
    qos: str | None
    reservation: str | None
    constraint: str | None
    nodes: int
    gpus_per_node: int
    gpu_option: str  # gpus-per-node | gres
    time_minutes: int
    run_dir: str  # node 0's run directory: the job's script and output
    node_dirs: tuple[str, ...]  # node K's run directory, in rank order
    containers: tuple[str, ...]  # node K's training container (removed after its wrapper ends)
    runtime: str  # docker | pyxis
    image: str  # IMAGE@sha256:...


def job_name(run_id: str) -> str:
    """The job's name: the run's, so `squeue --name reproduce-<run id>` finds it."""
    return f"reproduce-{run_id}"


def node_dirs(work_dir: str, node_run_dir: str, run_id: str, count: int) -> tuple[str, ...]:
    """Node K's run directory on the shared work dir: the plan's for node 0, a per-node work dir
    of its own for the others (every node's wrapper writes pid, node.log and exit_code)."""
    others = tuple(node_work_dir(work_dir, k) + f"/runs/{run_id}" for k in range(1, count))
    return (node_run_dir.rstrip("/"), *others)


def node_work_dir(work_dir: str, index: int) -> str:
    return f"{work_dir.rstrip('/')}/nodes/{index}"


def gpu_option_for(version: tuple[int, int] | None, wanted: str) -> str:
    """--gpus-per-node where Slurm has it (or the profile says so), else --gres=gpu:N."""
    if wanted != "auto":
        return wanted
    if version is not None and version < GPUS_PER_NODE_SINCE:
        return "gres"
    return "gpus-per-node"


def parse_version(text: str) -> tuple[int, int] | None:
    """`sinfo --version` ("slurm 22.05.8", "slurm-wlm 22.05.8") -> (22, 5); None if unreadable."""
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            return int(parts[0]), int(parts[1])
    return None


def limit_hours(
    recipe: Recipe,
    profile: Profile,
    max_hours: float | None,
    max_usd: float | None,
    price: float | None,
) -> float:
    """The job's time limit in hours: the shortest of --max-hours, what --max-usd buys at the
    profile's price, and the profile's time_limit_hours, which defaults to twice the claim's
    wall-clock hours plus one (at least MIN_DEFAULT_HOURS)."""
    own = profile.time_limit_hours if isinstance(profile, SlurmProfile) else None
    if own is None:
        claimed = recipe.claimed_gpu_hours
        wall = claimed / recipe.gpu_count if claimed and recipe.gpu_count else None
        own = max(MIN_DEFAULT_HOURS, 2 * wall + 1) if wall else MIN_DEFAULT_HOURS
    limits = [own]
    if max_hours is not None:
        limits.append(max_hours)
    if max_usd is not None and price:
        limits.append(max_usd / (price * max(1, recipe.nodes)))
    return min(limits)


def with_time_limit(
    recipe: Recipe,
    profile: Profile,
    max_hours: float | None,
    max_usd: float | None,
    price: float | None,
) -> Profile:
    """The profile whose time_limit_hours is the job's (the run directory's profile.yaml keeps it,
    so the dry run and the submission render the same script)."""
    if not isinstance(profile, SlurmProfile):
        return profile
    hours = limit_hours(recipe, profile, max_hours, max_usd, price)
    return replace(profile, time_limit_hours=hours, raw={**profile.raw, "time_limit_hours": hours})


def batch_of(plan: Plan, gpu_option: str) -> Batch:
    """The batch script's settings from the plan and the GPU option the cluster wants."""
    p = plan.profile
    if not isinstance(p, SlurmProfile) or not p.partition:
        raise BadInput(f"{p.path}: not a slurm profile with a partition")
    r = plan.recipe
    hours = p.time_limit_hours or MIN_DEFAULT_HOURS
    dirs = node_dirs(p.work_dir, plan.node_run_dir, plan.run_id, r.nodes)
    containers = (
        (plan.container,)
        if r.nodes == 1
        else tuple(f"{plan.container}-node{k}" for k in range(r.nodes))
    )
    return Batch(
        job_name=job_name(plan.run_id),
        partition=p.partition,
        account=p.account,
        qos=p.qos,
        reservation=p.reservation,
        constraint=p.constraint,
        nodes=r.nodes,
        gpus_per_node=r.gpus_per_node,
        gpu_option=gpu_option_for(None, gpu_option),
        time_minutes=max(1, math.ceil(hours * 60)),
        run_dir=dirs[0],
        node_dirs=dirs,
        containers=containers,
        runtime=p.container_runtime,
        image=plan.image_ref,
    )


def _time(minutes: int) -> str:
    """Slurm's D-HH:MM:SS."""
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def _gpus(b: Batch) -> str:
    return (
        f"--gpus-per-node={b.gpus_per_node}"
        if b.gpu_option == "gpus-per-node"
        else f"--gres=gpu:{b.gpus_per_node}"
    )


def header(b: Batch) -> list[str]:
    """The `#SBATCH` lines of a job holding the nodes: a run's job, or a nightly group's
    allocation (the same words, so both ask Slurm for the same nodes)."""
    return [
        "#!/bin/bash",
        f"#SBATCH --job-name={b.job_name}",
        f"#SBATCH --partition={b.partition}",
        *([f"#SBATCH --account={b.account}"] if b.account else []),
        *([f"#SBATCH --qos={b.qos}"] if b.qos else []),
        *([f"#SBATCH --reservation={b.reservation}"] if b.reservation else []),
        *([f"#SBATCH --constraint={b.constraint}"] if b.constraint else []),
        f"#SBATCH --nodes={b.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH {_gpus(b)}",
        "#SBATCH --exclusive",
        "#SBATCH --no-requeue",
        f"#SBATCH --time={_time(b.time_minutes)}",
        f"#SBATCH --output={b.run_dir}/{OUTPUT_NAME}",
        f"#SBATCH --error={b.run_dir}/{OUTPUT_NAME}",
    ]


# A job Slurm starts again is a second attempt: its log would join the first's.
_REFUSE_RESTART = [
    'if [ "${SLURM_RESTART_COUNT:-0}" != 0 ]; then',
    '  echo "reproduce: job $SLURM_JOB_ID was requeued (restart $SLURM_RESTART_COUNT);'
    ' a second attempt would join the first in one measurement: refused" >&2',
    "  exit 3",
    "fi",
]


def render(b: Batch, *, step: bool = False) -> str:
    """The batch script, byte for byte. `step`: the same body as one job step of a nightly
    group's allocation, run on the login node with the allocation's SLURM_JOB_ID and
    SLURM_JOB_NODELIST (its srun is then a step of that job, named after the run)."""
    q = shlex.quote
    gpus = _gpus(b)
    head = (
        [
            *header(b),
            "# Written by reproduce from the run's plan (printed byte for byte by --dry-run).",
        ]
        if not step
        else [
            "#!/bin/bash",
            "# One job step of a nightly group's Slurm allocation (SLURM_JOB_ID and "
            "SLURM_JOB_NODELIST are the allocation's),",
            "# run on the login node; written by reproduce from the run's plan.",
        ]
    )
    cases = "\n".join(
        f"  {k}) d={q(d)}; c={q(c)} ;;"
        for k, (d, c) in enumerate(zip(b.node_dirs, b.containers, strict=True))
    )
    multi = b.nodes > 1
    pyxis = b.runtime == "pyxis"
    # What each node's task runs: its wrapper in the foreground (the step lasts as long as
    # node.sh), then the removal of its training container, whatever ended the wrapper.
    task = [
        "set -u",
        'case "$SLURM_NODEID" in',
        cases,
        '  *) echo "reproduce: no run directory for node $SLURM_NODEID" >&2; exit 3 ;;',
        "esac",
        "trap 'echo \"reproduce: task got SIGTERM\" >&2' TERM",
        'cd "$d" || exit 3',
        *(
            [
                'read -r -a addrs <<< "$REPRODUCE_NODE_ADDRS"',
                'export NODE_RANK="$SLURM_NODEID" HEAD_ADDR="${addrs[0]}" '
                'NODE_ADDRS="$REPRODUCE_NODE_ADDRS" NODE_RUN_DIR="$d"',
                # an address Ray can bind (else node.sh asks the host), as over SSH
                'ip="${addrs[$SLURM_NODEID]}"',
                'if [[ "$ip" =~ ^[0-9.]+$ || "$ip" == *:* ]]; then export NODE_IP="$ip"; fi',
            ]
            if multi
            else []
        ),
        f'{RUN_MARK}="$(pwd -P)" bash {WRAPPER_NAME} </dev/null',
        "rc=$?",
        *(
            [f'rm -f "$d/{enroot_image.SQSH}"']  # the run's image file (pyxis removes containers)
            if pyxis
            else [
                "if command -v docker >/dev/null 2>&1; then",
                '  docker rm -f "$c" '
                + " ".join(f'"$c-{s}"' for s in stage_graph.IN_IMAGE)
                + " >/dev/null 2>&1 || true",
                "fi",
            ]
        ),
        'exit "$rc"',
    ]
    task_text = "\n".join(task) + "\n"
    srun = [
        "srun",
        *(['--jobid="$SLURM_JOB_ID"', f"--job-name={q(b.job_name)}"] if step else []),
        f"--nodes={b.nodes}",
        f"--ntasks={b.nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        gpus,
        "bash",
        "-c",
    ]
    body = [
        "set -u",
        *([] if step else _REFUSE_RESTART),  # a step: the allocation's own shell refuses it
        f"if [ -e {q(b.run_dir + '/' + CANCEL_MARK)} ]; then",
        '  echo "reproduce: the run was cancelled before its job started" >&2; exit 3',
        "fi",
        "# every node's address, in the job's node order (SLURM_NODEID)",
        "addrs=()",
        'for n in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do',
        '  a=$(scontrol show node "$n" | tr " " "\\n" | sed -n "s/^NodeAddr=//p" | head -n 1)',
        '  addrs+=("${a:-$n}")',
        "done",
        'export REPRODUCE_NODE_ADDRS="${addrs[*]}"',
        'echo "reproduce: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST ($REPRODUCE_NODE_ADDRS)"',
        *(
            [
                "# pyxis: node.sh runs on each node's host; each of its in-image commands is a",
                "# step of this job in the image it imported and checked, with these GPUs",
                f"export REPRODUCE_GPU_OPTION={q(gpus)}",
            ]
            if pyxis
            else []
        ),
        " ".join(srun) + " " + q(task_text),
    ]
    return "\n".join(head + ["", *body]) + "\n"


def allocation_name(run_id: str) -> str:
    """A nightly group's allocation is named after the run that made it (its first)."""
    return f"reproduce-group-{run_id}"


def allocation_dir(work_dir: str, name: str) -> str:
    """Where the allocation's script and output live on the shared work dir."""
    return f"{work_dir.rstrip('/')}/allocations/{name}"


def group_hours(
    recipes: Sequence[Recipe],
    profile: Profile,
    max_hours: float | None,
    max_usd: float | None,
    price: float | None,
) -> float:
    """The allocation's time limit: the sum of its recipes' own (`limit_hours`), one after
    another, so that none of them finds the allocation at its end before its own limit."""
    return sum(limit_hours(r, profile, max_hours, max_usd, price) for r in recipes)


def allocation_of(plan: Plan, gpu_option: str, hours: float) -> Batch:
    """The allocation of a nightly group whose first run is `plan`: the run's own #SBATCH
    header (the same nodes, GPUs and settings), its own name, directory and time limit."""
    b = batch_of(plan, gpu_option)
    name = allocation_name(plan.run_id)
    assert isinstance(plan.profile, SlurmProfile)
    where = allocation_dir(plan.profile.work_dir, name)
    minutes = max(1, math.ceil(hours * 60))
    return replace(b, job_name=name, time_minutes=minutes, run_dir=where, node_dirs=(where,))


def render_allocation(b: Batch, grace_s: int = HOLDER_GRACE_S) -> str:
    """The allocation's script, byte for byte: it holds the nodes and waits; each recipe of the
    group runs as one job step of it (`render(..., step=True)`) until the launcher ends it with
    scancel after the group's last recipe. While it waits it watches the launcher's heartbeat
    (HOLDER_MARK, on the shared work dir): with no touch for `grace_s` (the launcher killed, its
    machine gone) it ends itself, and its nodes with it, long before its time limit."""
    beat = shlex.quote(f"{b.run_dir}/{HOLDER_MARK}")
    return (
        "\n".join(
            [
                *header(b),
                "# Written by reproduce for a nightly group: it holds the nodes; each recipe "
                "runs as one job step of it.",
                "",
                "set -u",
                *_REFUSE_RESTART,
                'echo "reproduce: allocation $SLURM_JOB_ID holds $SLURM_JOB_NODELIST for a nightly '
                'group"',
                f"beat={beat}",
                "while :; do",
                '  last=$(stat -c %Y "$beat" 2>/dev/null || echo 0)',
                f"  if [ $(( $(date +%s) - last )) -ge {grace_s} ]; then",
                f'    echo "reproduce: no launcher has touched $beat for {grace_s} s: allocation '
                '$SLURM_JOB_ID ends itself" >&2',
                "    exit 0",
                "  fi",
                f"  sleep {min(10, max(1, grace_s // 3))}",
                "done",
            ]
        )
        + "\n"
    )


def dry_run_gpu_option(plan: Plan) -> tuple[str, str]:
    """The GPU option the dry run renders, and why: the profile's when it names one; for `auto`,
    the version of the Slurm client on this host when the launcher runs on the login node
    (`sinfo --version` is the client's own, no cluster is asked); else --gpus-per-node, which
    every Slurm since 19.05 reads (a real run asks the login node and records the answer)."""
    p = plan.profile
    assert isinstance(p, SlurmProfile)
    if p.gpu_option != "auto":
        return p.gpu_option, f"gpu_option {p.gpu_option} (the profile's)"
    if p.login_host is None:
        import shutil
        import subprocess

        if shutil.which("sinfo"):
            try:
                out = subprocess.run(
                    ["sinfo", "--version"], capture_output=True, text=True, timeout=10
                ).stdout
            except (OSError, subprocess.SubprocessError):
                out = ""
            version = parse_version(out)
            if version is not None:
                chosen = gpu_option_for(version, "auto")
                return chosen, f"gpu_option auto: {out.strip()} on this host"
    return "gpus-per-node", (
        "gpu_option auto: --gpus-per-node until the login node's `sinfo --version` is asked "
        "(a real run asks it once and records it; Slurm older than 19.05 gets --gres=gpu:N)"
    )


def dry_run_section(plan: Plan) -> str:
    """The dry run's part for a slurm profile: the batch script, byte for byte."""
    option, why = dry_run_gpu_option(plan)
    b = batch_of(plan, option)
    where = f"{b.run_dir}/{SCRIPT_NAME}"
    return (
        f"# ---- Slurm batch script ({where}), submitted with `sbatch --parsable`; {why} ----\n"
        + render(b)
    )
