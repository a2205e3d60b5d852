"""The host's clock on the training container's output, as node.sh runs it.

Why a module: docs/node-scripts.md ("host_clock.py") states what the stamper promises and
docs/measurement.md ("The host's clock") what the verdict makes of it; this is the bash that
puts it between `docker run` and node.log: the stamper gets the nonce in its own environment only
(never on a command line, which `ps` shows), ignores the cancel's TERM from before it starts (the
container's last words must still pass; it ends when docker's output does), and node.sh ends
with docker's exit status, else the stamper's.
"""

from __future__ import annotations

from launcher.judge.parse.clock import CLOCK, CLOCK_GAP_S
from launcher.plan.protocol import MARKER, NONCE_VAR

CLOCK_NONCE_ENV = "REPRODUCE_CLOCK_NONCE"
assert CLOCK == f"{MARKER} clock ", "the clock line is a line of the node protocol"


def host_clock_pipe(command: str, *, on: bool = True) -> list[str]:
    """`command` (a docker run of the training container) with its output, both streams, passed
    through the host's clock; `on=False` (docker.host_clock: false): the command as it is."""
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
        '  || { _rc=("${PIPESTATUS[@]}"); exit "$(( _rc[0] != 0 ? _rc[0] : _rc[1] ))"; }',
    ]


def training_run(*, host_clock: bool) -> list[str]:
    """node.sh's `docker run` of the training container, through the host's clock or not."""
    return [
        "# the container is named after the run so `reproduce cancel` can find it; --rm "
        "removes it at the end",
        *host_clock_pipe(
            'docker run --rm --name "$CONTAINER" "${GPU_ARGS[@]}" "${NET_ARGS[@]}" '
            '"${DOCKER_ARGS[@]}" "${EFA_ARGS[@]}" "$IMAGE" bash -c "$CONTAINER_SCRIPT"',
            on=host_clock,
        ),
    ]
