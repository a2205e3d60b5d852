"""What a recipe leaves on a node for the next recipe, removed between them (the bash of it).

Why: a nightly lends one node to several recipes in turn (launcher/runner/held.py). The training
container runs the recipe's code as root with `--ipc host`, so its System V segments, semaphores
and message queues and its /dev/shm files are the host's and outlive it; and its out/ files are
root's, which the host's user cannot remove, so the next recipe's preflight found a full disk.
The work is scripts/node_leftovers.py's (docs/node-scripts.md); here is where node.sh runs it:

- the training container, first: a snapshot of the IPC objects and /dev/shm names there are;
- its EXIT trap, after the stage's own end (`_AFTER_CLEANUP`, run by STAGE_FUNCTIONS' `_on_exit`
  after `_cleanup`): every object and /dev/shm entry new since, removed, and out/ given to the
  host's user;
- node.sh's start, on the host: the out/ of every finished run beside this one emptied, or the
  run refused (exit 3) naming what a killed container left as root's.

Only where the run's code runs in a container of ours (`docker` runtime, not a Ray cluster):
elsewhere nothing of it is root's and nothing shares the host's IPC.
"""

from __future__ import annotations

from launcher.inputs.profile import Profile

SCRIPT = "node_leftovers.py"
SNAPSHOT = "/tmp/.reproduce-ipc-before.json"  # the container's own /tmp, no one else's


def exclusive(profile: Profile) -> bool:
    """Is the node this launch's alone? An instance it launches (aws without instance_id)."""
    return profile.kind == "aws" and getattr(profile, "instance_id", None) is None


def container_lines(scripts: str, *, exclusive: bool) -> list[str]:
    """After the container script's trap: the snapshot, and the clean its EXIT runs.
    `exclusive`: the node was launched for this run (aws), so every new IPC object and /dev/shm
    entry is the run's; elsewhere only the segments its own processes made are known to be."""
    tool = f'python3 "{scripts}/{SCRIPT}"'
    mode = " --exclusive" if exclusive else ""
    return [
        "# what this container leaves in the host's IPC and /dev/shm (--ipc host) is removed at"
        " its end,",
        "# and its out/ given to the host's user (scripts/node_leftovers.py)",
        f"{tool} snapshot --out {SNAPSHOT} >/dev/null 2>&1 || true",
        f"_leftovers() {{ {tool} clean{mode} --before {SNAPSHOT} "
        '--out-dir "$REPRODUCE_OUT_DIR" || echo "reproduce: leftovers not removed: the image'
        "'s python3 could not run the check ($?)\"; }",
        "_AFTER_CLEANUP=_leftovers",
    ]


def host_lines() -> list[str]:
    """node.sh, before any stage: the finished runs' out/ beside this one emptied, or refused."""
    return [
        "# the finished runs beside this one leave their out/ to no one: emptied (or, root's,"
        " refused: exit 3)",
        f'python3 "$NODE_RUN_DIR/scripts/{SCRIPT}" between --runs "$(dirname "$NODE_RUN_DIR")" '
        '--self "$NODE_RUN_DIR" || exit 3',
    ]
