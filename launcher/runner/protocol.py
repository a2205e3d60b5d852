"""The node side of a run, as text: the bash the launcher sends, and the markers it reads back.

Everything the launcher asks of a node is one of the commands below, run through a Transport
(`bash -c` locally or over SSH). They are pure functions of their arguments (every value quoted),
so each has a golden file under tests/golden/protocol/ and a change shows up in review.

The node script runs in its own session (setsid) under a small wrapper that records its pid
(= its process group) and, whatever happens to node.sh, its exit code. So the run survives the
launcher's death and a dropped connection; `poll` asks whether it still runs, `cancel` stops
exactly that process group and the run's container. See docs/node-scripts.md.

The node script marks its stages with lines `##reproduce stage=NAME event=start|end ...`
(`STAGE_FUNCTIONS` prints them; `parse_marker` reads them); the timeline and the per-stage logs
are built from those lines alone (docs/architecture.md, "Run directory").
"""

from __future__ import annotations

import re
import shlex

MARKER = "##reproduce"

# Runs node.sh detached. Trapping (not ignoring) TERM keeps the wrapper alive to write the exit
# code after node.sh dies, while node.sh itself still gets the default TERM behaviour.
WRAPPER = (
    "#!/bin/bash\n"
    "# Written by reproduce: runs node.sh in its own session; records pid (= process group)"
    " and exit code.\n"
    """cd "$(dirname "$0")" || exit 1
echo $$ > pid
trap 'echo "reproduce: wrapper got SIGTERM" >&2' TERM
trap '' HUP
bash node.sh > node.log 2>&1 < /dev/null
rc=$?
echo "$rc" > exit_code.tmp && mv -f exit_code.tmp exit_code
"""
)
WRAPPER_NAME = "run_node.sh"

# Is anything of the run's session (sid = pgid = the wrapper's pid) still running? Zombies do not
# count: a node whose init does not reap them must not look busy forever.
ALIVE_FN = (
    '_alive() { if command -v ps >/dev/null 2>&1; then ps -s "$1" -o stat= 2>/dev/null'
    ' | grep -qv "^Z"; else kill -0 -- "-$1" 2>/dev/null; fi; }\n'
)

# The bash functions node.sh uses to mark its stages (rendered into every node script). A stage
# that ends through `exit` is closed by the EXIT trap with status failed (or cancelled, when
# `reproduce cancel` marked the run first) and its exit code.
_NOW = '"$(date +%s.%N)"'
STAGE_FUNCTIONS = "\n".join(
    [
        f"_stage_begin() {{ _STAGE=$1; printf '{MARKER} stage=%s event=start t=%s\\n' "
        f'"$1" {_NOW}; }}',
        f"_stage_end() {{ printf '{MARKER} stage=%s event=end status=ok t=%s\\n' \"$_STAGE\" "
        f"{_NOW}; _STAGE=''; }}",
        "_on_exit() {",
        "  local rc=$? status=failed",
        '  if [ -n "${_STAGE:-}" ]; then',
        '    [ -e "$NODE_RUN_DIR/cancelled" ] && status=cancelled'
        "  # `reproduce cancel` marks the run first",
        f"    printf '{MARKER} stage=%s event=end status=%s rc=%s t=%s\\n' "
        f'"$_STAGE" "$status" "$rc" {_NOW}',
        "  fi",
        "  _cleanup",
        '  exit "$rc"',
        "}",
    ]
)
MARKER_HELP = (
    f"# Stages print '{MARKER} stage=NAME event=start|end' markers;"
    " the launcher builds the timeline from them."
)
DONE_LINE = f"echo '{MARKER} done'"

_MARKER_LINE = re.compile(rb"^" + re.escape(MARKER.encode()) + rb" (.*?)\r?$")


def parse_marker(line: bytes) -> dict[str, str] | None:
    """`##reproduce stage=train event=start t=1.5` -> {"stage": "train", ...}; else None."""
    match = _MARKER_LINE.match(line)
    if not match:
        return None
    try:
        words = shlex.split(match.group(1).decode(errors="replace"))
    except ValueError:
        return None
    fields = dict(w.split("=", 1) for w in words if "=" in w)
    if "stage" not in fields or fields.get("event") not in ("start", "end"):
        return None
    return fields


def prepare_dir_command(node_run_dir: str) -> str:
    """The node run directory, private to the user the launcher connects as."""
    d = shlex.quote(node_run_dir)
    return f"mkdir -p {d} && chmod 700 {d}"


def launch_command(node_run_dir: str) -> str:
    """Start the wrapper detached (once per run directory); prints the wrapper's pid."""
    d = shlex.quote(node_run_dir)
    return (
        f"cd {d} && if [ -e pid ]; then echo 'a run was already launched in '{d} >&2; exit 1; fi\n"
        f"setsid nohup bash {WRAPPER_NAME} </dev/null >/dev/null 2>&1 &\n"
        "for _ in $(seq 200); do [ -s pid ] && break; sleep 0.05; done\n"
        "cat pid"
    )


def poll_command(node_run_dir: str) -> str:
    """Prints `exit N` (the script ended), `alive`, or `gone` (ended without an exit code)."""
    d = shlex.quote(node_run_dir)
    return (
        ALIVE_FN + f"cd {d} 2>/dev/null || {{ echo gone; exit 0; }}\n"
        'if [ -f exit_code ]; then echo "exit $(cat exit_code)"\n'
        'elif [ -s pid ] && _alive "$(cat pid)"; then echo alive\n'
        "else echo gone; fi"
    )


def parse_poll(stdout: str, exit_code: int) -> tuple[str, int | None] | None:
    """("exit", code) / ("alive", None) / ("gone", None); None when the answer is not one of them.

    An answer that is none of these is a broken exchange, not news about the run.
    """
    out = stdout.strip()
    if out.startswith("exit "):
        try:
            return "exit", int(out.split()[1])
        except (IndexError, ValueError):
            return "exit", None
    if out in ("alive", "gone") and exit_code == 0:
        return out, None
    return None


def cancel_command(node_run_dir: str, container: str) -> str:
    """Stop the run's process group and its container (which ends Ray inside it); nothing else.

    Prints `left:` followed by whatever it could not stop (nothing when all went).
    """
    d, c = shlex.quote(node_run_dir), shlex.quote(container)
    rm = f"if command -v docker >/dev/null 2>&1; then docker rm -f {c} >/dev/null 2>&1 || true; fi"
    lines = [
        f"cd {d} || exit 0",
        "touch cancelled",
        "pg=$(cat pid 2>/dev/null || true)",
        'alive() { [ -n "$pg" ] && _alive "$pg"; }',
        "stop() {  # the run's process group, and anything of its session that left the group",
        '  kill -"$1" -- "-$pg" 2>/dev/null || true',
        '  if command -v pkill >/dev/null 2>&1; then pkill -"$1" -s "$pg" 2>/dev/null || true; fi',
        "}",
        "if alive; then stop TERM; fi",
        rm,
        "for _ in $(seq 100); do alive || break; sleep 0.1; done",
        "if alive; then stop KILL; sleep 0.3; fi",
        rm,
        "[ -f exit_code ] || echo 137 > exit_code",
        'left=""',
        'if alive; then left="processes of group $pg"; fi',
        "if command -v docker >/dev/null 2>&1 && "
        f'[ -n "$(docker ps -aq --filter name=^{container}$ 2>/dev/null)" ]; '
        f'then left="$left container {container}"; fi',
        'echo "left:$left"',
    ]
    return ALIVE_FN + "\n".join(lines) + "\n"


def parse_cancel(stdout: str) -> str:
    """What the cancel could not stop ("" when everything went)."""
    return stdout.strip().rsplit("left:", 1)[-1].strip() if "left:" in stdout else ""


def cancelled_command(node_run_dir: str) -> str:
    """Exit 0 when `reproduce cancel` marked the run (its exit code then says little)."""
    return f"test -e {shlex.quote(node_run_dir)}/cancelled"


def cleanup_command(container: str) -> str:
    """After the script ended: remove its container if the script left one (stopped or not)."""
    c = shlex.quote(container)
    return (
        f"if command -v docker >/dev/null 2>&1; then docker rm -f {c} >/dev/null 2>&1 || true; fi"
    )


def list_results_command(node_run_dir: str) -> str:
    """The names of the result files (*.json) the node script left in its run directory."""
    return (
        f"cd {shlex.quote(node_run_dir)} && "
        'for f in *.json; do [ -f "$f" ] && echo "$f"; done; true'
    )
