"""The host's clock on the training container's output, as node.sh runs it.

Why a module: docs/node-scripts.md ("host_clock.py") states what the stamper promises and
docs/measurement.md ("The host's clock") what the verdict makes of it; this is the bash that
puts it between `docker run` and node.log: the stamper gets the nonce in its own environment only
(never on a command line, which `ps` shows), ignores the cancel's TERM from before it starts (the
container's last words must still pass; it ends when docker's output does), and node.sh ends
with docker's exit status, else the stamper's. Beside it, for the same docker run, the host's GPU
sampler (scripts/gpu_sampler.py; docs/measurement.md, check 7): started before it, stopped after
it on every path, writing into the node run directory, which no container mounts.
"""

from __future__ import annotations

from launcher.judge.parse.clock import CLOCK, CLOCK_GAP_S
from launcher.plan.markers import MARKER
from launcher.plan.protocol import NONCE_VAR
from launcher.records.rundir import Files

CLOCK_NONCE_ENV = "REPRODUCE_CLOCK_NONCE"
assert CLOCK == f"{MARKER} clock ", "the clock line is a line of the node protocol"


# node.sh's GPU sampler: its pid, and how it is stopped (TERM; it ends nvidia-smi with it). Each
# `|| true`: under set -e a sampler already gone must not end node.sh.
SAMPLER_VAR = "_GPU_SAMPLER"
STOP_SAMPLER = (
    f'kill "${SAMPLER_VAR}" 2>/dev/null || true; wait "${SAMPLER_VAR}" 2>/dev/null || true'
)


def gpu_sampler_start() -> list[str]:
    """The bash that starts the host's GPU sampler in the background: samples into the node run
    directory (never mounted into a container) until STOP_SAMPLER, or until node.sh ($$) is gone
    (an exit on any path; the cancel's TERM reaches it by the run's mark too). Its own output is
    discarded: without nvidia-smi the file says so, and nothing else changes."""
    return [
        "# the host watches the GPUs while the container trains (scripts/gpu_sampler.py: nvidia-smi"
        " about once a second,",
        "# on the host clock's clock) into the node run directory, which no container mounts",
        f'python3 "$NODE_RUN_DIR/scripts/gpu_sampler.py" --out "$NODE_RUN_DIR/{Files.GPU_SAMPLES}"'
        ' --while-pid "$$" </dev/null >/dev/null 2>&1 &',
        f"{SAMPLER_VAR}=$!",
    ]


def host_clock_pipe(command: str, *, on: bool = True, on_fail: str = "") -> list[str]:
    """`command` (a docker run of the training container) with its output, both streams, passed
    through the host's clock; `on=False` (docker.host_clock: false): the command as it is.
    `on_fail`: bash run (each part `|| true`) before node.sh exits on the command's failure."""
    if not on:
        return [
            "# docker.host_clock: false - its output is not stamped with the host's clock",
            command,
        ]
    return [
        "# its output, both streams, passes the host's clock (scripts/host_clock.py): a clock line"
        " with this script's",
        f"# nonce, which the container never gets, before each line that begins {CLOCK_GAP_S:g} s"
        " or more after the last one",
        f"{command} 2>&1 \\",
        f"  | ( trap '' TERM INT HUP; {CLOCK_NONCE_ENV}=\"${NONCE_VAR}\" exec python3 "
        f'"$NODE_RUN_DIR/scripts/host_clock.py" --gap {CLOCK_GAP_S:g} ) \\',
        '  || { _rc=("${PIPESTATUS[@]}"); '
        + (f"{on_fail}; " if on_fail else "")
        + 'exit "$(( _rc[0] != 0 ? _rc[0] : _rc[1] ))"; }',
    ]


DOCKER_RUN = (
    'docker run --rm --name "$CONTAINER" "${GPU_ARGS[@]}" "${NET_ARGS[@]}" '
    '"${DOCKER_ARGS[@]}" "${EFA_ARGS[@]}" "$IMAGE" bash -c "$CONTAINER_SCRIPT"'
)


def training_run(*, host_clock: bool, run: str | None = None) -> list[str]:
    """node.sh's run of the training container (`docker run`, or `run`: pyxis's step), through
    the host's clock or not; with the clock, the host's GPU sampler runs for the life of that
    run (check 7 places the samples on the clock's span, so without the clock they would not be
    read). Both run on the host, outside the container."""
    run = run or DOCKER_RUN
    named = "# the container is named after the run so `reproduce cancel` can find it; --rm "
    named += "removes it at the end"
    if run != DOCKER_RUN:
        named = (
            "# the training step is named after the run; pyxis removes its container when it ends"
        )
    if not host_clock:
        return [named, *host_clock_pipe(run, on=False)]
    return [
        *gpu_sampler_start(),
        named,
        *host_clock_pipe(run, on_fail=STOP_SAMPLER),
        STOP_SAMPLER,
    ]
