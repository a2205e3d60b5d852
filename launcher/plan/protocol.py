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
are built from those lines alone (docs/architecture.md, "Run directory"). Long stages also print
progress lines (`##reproduce progress stage=NAME done=N total=M ...`, `Progress`) that the
launcher shows while they run.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.plan import stage_graph
from launcher.plan.markers import (  # noqa: F401 - the protocol's names, kept where readers look
    CONTAINER_STAGES,
    MARKER,
    MARKER_STATUSES,
    MAX_MARKER_LINE,
    SAFE_STAGE,
    MarkerGate,
    parse_marker,
)
from launcher.records.rundir import NODE_RESULT_FILES, Files

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# The node run directory (docs/architecture.md, "The node protocol") is the run's control room:
# node.sh, the wrapper, pid, exit_code, node.log, the cancel mark and the result files live there,
# and no container ever gets it mounted writable. Containers get scripts/ and STATE_DIR read-only,
# the cache, and OUT_DIR (their only writable part of the run).
OUT_DIR = "out"
# What the launcher tells the run's processes, containers included (read-only there): cancel.
STATE_DIR = "state"
CANCEL_MARK = f"{STATE_DIR}/cancelled"
# What the launcher tells a node that only serves node 0 (a Ray worker): node 0 finished, stop.
END_MARK = f"{STATE_DIR}/finished"
# A follower's heartbeat, touched while it reads the run: a node that ends itself after the run
# (an aws node's run-end watch) counts its grace from the later of exit_code and this.
FOLLOWED_MARK = f"{STATE_DIR}/followed"
HEARTBEAT_S = 30.0  # how often a follower touches it: well inside any grace worth having
SECRETS_FILE = ".secrets.env"
COPIER_FILE = "copier"  # the pid of the wrapper's node.log copier (WRAPPER, cancel_command)
# Every process of a run carries RUN_MARK=<its node run dir> in its environment (set at launch).
RUN_MARK = "REPRODUCE_RUN_DIR"
# cancel_command: how long (tenths of a second) a run gets after TERM to end by itself, its
# containers' EXIT traps included, before they are removed
CANCEL_GRACE_TENTHS = 50
# Where each asset of the run came from: the resolve stage's plan (launcher/plan/asset_stages.py).
ASSET_PLAN_FILE = Files.ASSET_PLAN
# The files collected back into the run directory: these names and no others (the run directory
# names them: launcher/records/rundir.py).
RESULT_FILES = (*NODE_RESULT_FILES, Files.GPU_SAMPLES)  # the reports, and the GPU samples
RESULT_MAX_BYTES = 4 << 20

# A directory the run writes to and trusts: created 0700 when missing; otherwise it must be a
# directory owned by the user the launcher connects as and writable by no one else. Exit status 1
# with one line on stderr that says why and what to do.
TRUSTED_DIR_FN = """_trusted_dir() {
  local me owner mode link_owner
  me="$(id -u)"
  if [ ! -e "$1" ] && [ ! -L "$1" ]; then
    mkdir -p -m 700 "$1" 2>/dev/null \\
      || sudo -n install -d -m 700 -o "$me" -g "$(id -g)" "$1" \\
      || { echo "reproduce: cannot create $1" >&2; return 1; }
  fi
  owner="$(stat -L -c %u "$1" 2>/dev/null)" && mode="$(stat -L -c %a "$1" 2>/dev/null)" \\
    && link_owner="$(stat -c %u "$1" 2>/dev/null)" \\
    || { echo "reproduce: cannot inspect $1" >&2; return 1; }
  if [ ! -d "$1" ] || [ "$owner" != "$me" ] || [ "$link_owner" != "$me" ] \\
    || (( 8#$mode & 8#022 )); then
    echo "reproduce: refusing $1: it must be a directory owned by uid $me and writable" \\
      "by no one else, but its owner is uid $owner and its mode $mode;" \\
      "remove it or fix its owner and mode" >&2
    return 1
  fi
}
"""

# Runs node.sh detached. Trapping (not ignoring) TERM keeps the wrapper alive to write the exit
# code after node.sh dies, while node.sh itself still gets the default TERM behaviour. The body is
# one `{ ...; exit; }` group: bash parses all of it before running any of it, so nothing written to
# the file afterwards ever runs. The wrapper removes a secrets file node.sh never got to read.
# node.log has one writer, a copier reading a pipe (it ignores TERM, so it drains all node.sh and
# its children wrote): a program that opens its output again (`echo x > /dev/stderr` opens the
# file anew, truncating it) opens the pipe, never the log, so node.log only grows, and the bytes
# the follower read stay where it read them. node.sh and its children never hold the copier's
# descriptor itself (3>&-), and the exit code is written only after the copier ended (or 10 s:
# a daemon node.sh left behind may keep the pipe open, and its later lines still reach node.log).
# The copier is outside the run's session and unmarked, so a cancel's KILL round (which ends
# every marked process) never takes the lines still in the pipe with it: a cancelled stage's
# end marker is printed last; the copier ends by itself once the last writer is gone.
WRAPPER = (
    "#!/bin/bash\n"
    "# Written by reproduce: runs node.sh in its own session; records pid (= process group)"
    " and exit code.\n"
    """{
cd "$(dirname "$0")" || exit 1
echo $$ > pid
trap 'echo "reproduce: wrapper got SIGTERM" >&2' TERM
trap '' HUP
exec 3> >(trap '' TERM INT HUP; exec setsid env -u @RUN_MARK@ cat >> node.log)
copier=$!
echo "$copier" > @COPIER_FILE@
bash node.sh >&3 2>&3 3>&- < /dev/null
rc=$?
exec 3>&-
for _ in $(seq 100); do kill -0 "$copier" 2>/dev/null || break; sleep 0.1; done
rm -f .secrets.env
echo "$rc" > exit_code.tmp && mv -f exit_code.tmp exit_code
exit "$rc"
}
""".replace("@RUN_MARK@", RUN_MARK).replace("@COPIER_FILE@", COPIER_FILE)
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
# node.sh's own markers carry a nonce it draws when it starts (NONCE_LINE): a shell variable never
# exported, so no container (nor anything node.sh starts) knows it. Inside the training container
# the same functions print an empty one.
NONCE_VAR = "_REPRODUCE_NONCE"
_NONCE = f'"${{{NONCE_VAR}:-}}"'
NONCE_LINE = (
    f"{NONCE_VAR}=\"$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\"; "
    f"printf '{MARKER} nonce=%s\\n' \"${NONCE_VAR}\"  # first: the launcher learns it here"
)
STAGE_FUNCTIONS = "\n".join(
    [
        # REPRODUCE_STAGE: the stage a node program prints its progress lines for
        f"_stage_begin() {{ _STAGE=$1; export REPRODUCE_STAGE=$1; "
        f"printf '{MARKER} stage=%s event=start t=%s n=%s\\n' \"$1\" {_NOW} {_NONCE}; }}",
        f"_stage_end() {{ printf '{MARKER} stage=%s event=end status=ok t=%s n=%s\\n' "
        f"\"$_STAGE\" {_NOW} {_NONCE}; _STAGE=''; REPRODUCE_STAGE=''; }}",
        "_on_exit() {",
        "  local rc=$? status=failed",
        '  if [ -n "${_STAGE:-}" ]; then',
        f'    [ -e "$NODE_RUN_DIR/{CANCEL_MARK}" ] && status=cancelled'
        "  # `reproduce cancel` marks the run first",
        f"    printf '{MARKER} stage=%s event=end status=%s rc=%s t=%s n=%s\\n' "
        f'"$_STAGE" "$status" "$rc" {_NOW} {_NONCE}',
        "  fi",
        '  _cleanup; "${_AFTER_CLEANUP:-:}"  # the container\'s leftovers (plan/leftovers.py)',
        '  exit "$rc"',
        "}",
    ]
)
MARKER_HELP = (
    f"# Stages print '{MARKER} stage=NAME event=start|end' markers;"
    " the launcher builds the timeline from them."
)
DONE_LINE = f"echo '{MARKER} done'"

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")

# Progress inside a long stage (an image pull, a download, an upload): the node prints
#   ##reproduce progress stage=NAME done=N [total=M] [unit=bytes|files|items] [item=LABEL]
# at most about once a second, `done` cumulative for the whole stage and never decreasing, and a
# last line with done=total. It is not a stage marker (no event=): the timeline ignores it, and it
# stays in the stage's log. docs/architecture.md ("The node protocol") describes it.
PROGRESS_WORD = "progress"
PROGRESS_UNITS = ("bytes", "files", "items")
_PROGRESS_LINE = re.compile(
    rb"^" + re.escape(f"{MARKER} {PROGRESS_WORD} ".encode()) + rb"([^\n]{1,1024}?)\r?\n",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Progress:
    """One progress line, read: how far a stage's transfer (or other long work) has come."""

    stage: str
    done: int
    total: int | None = None
    unit: str = "bytes"
    item: str = ""
    t: float | None = None

    def line(self) -> str:
        """The line as the node prints it (what the node programs must print, for tests)."""
        words = [f"stage={shlex.quote(self.stage)}", f"done={self.done}"]
        if self.total is not None:
            words.append(f"total={self.total}")
        words.append(f"unit={self.unit}")
        if self.item:
            words.append(f"item={shlex.quote(self.item)}")
        if self.t is not None:
            words.append(f"t={self.t:.3f}")
        return f"{MARKER} {PROGRESS_WORD} {' '.join(words)}"


def parse_progress(text: bytes | str) -> Progress | None:
    """`##reproduce progress stage=image done=5 total=9 unit=bytes` -> Progress; else None.

    Anything malformed (no stage, a count that is not a non-negative integer, an unknown unit, a
    total below done) is not progress: a node program's bad line never breaks the run's display.
    """
    data = text.encode() if isinstance(text, str) else text
    if not data.endswith(b"\n"):
        data += b"\n"
    match = _PROGRESS_LINE.match(data)
    return _progress_of(match.group(1)) if match else None


def progress_in(chunk: bytes) -> list[Progress]:
    """The last complete progress line of each stage in a chunk of node output, in order.

    Only the last counts: after a reconnect a chunk may hold minutes of lines, and the display
    wants where the stage is now. A line cut at the chunk's end is left for the next chunk.
    """
    last: dict[str, Progress] = {}
    if f"{MARKER} {PROGRESS_WORD} ".encode() not in chunk:
        return []
    for match in _PROGRESS_LINE.finditer(chunk):
        found = _progress_of(match.group(1))
        if found is not None:
            last.pop(found.stage, None)
            last[found.stage] = found
    return list(last.values())


def _progress_of(words_text: bytes) -> Progress | None:
    try:
        words = shlex.split(words_text.decode(errors="replace"))
    except ValueError:
        return None
    fields = dict(w.split("=", 1) for w in words if "=" in w)
    try:
        done = int(fields["done"])
        total = int(fields["total"]) if fields.get("total", "") not in ("", "?") else None
        t = float(fields["t"]) if "t" in fields else None
    except (KeyError, ValueError):
        return None
    unit = fields.get("unit") or "bytes"
    stage = fields.get("stage", "")
    if (
        not SAFE_STAGE.match(stage)
        or done < 0
        or (total is not None and (total < 0 or total < done))
        or unit not in PROGRESS_UNITS
    ):
        return None
    item = _UNPRINTABLE.sub("?", fields.get("item", "")[:200])  # a label shown on the screen
    return Progress(stage, done, total, unit, item, t)


def prepare_dir_command(node_run_dir: str) -> str:
    """A fresh node run directory, private to the user the launcher connects as.

    Its parents (<work_dir> and <work_dir>/runs) must be ours and writable by no one else (a shared
    host's /var/tmp: someone else's directory there could swap ours); a run directory that already
    exists belongs to an earlier run with this id and is never reused. Exit 3 names the refusal.
    """
    d = shlex.quote(node_run_dir)
    runs = shlex.quote(posixpath.dirname(node_run_dir.rstrip("/")))
    work = shlex.quote(posixpath.dirname(posixpath.dirname(node_run_dir.rstrip("/"))))
    return (
        TRUSTED_DIR_FN + f"_trusted_dir {work} && _trusted_dir {runs} || exit 3\n"
        f"if [ -e {d} ] || [ -L {d} ]; then\n"
        f"  echo 'reproduce: '{d}' already exists on the node: a run with this id was started "
        "there before; start this one with another --run-id' >&2; exit 3\n"
        "fi\n"
        f"mkdir -m 700 {d} {d}/scripts {d}/{STATE_DIR} {d}/{OUT_DIR}"
    )


def launch_command(node_run_dir: str, env: Mapping[str, str] | None = None) -> str:
    """Start the wrapper detached (once per run directory); prints the wrapper's pid.

    The wrapper and everything it starts carry RUN_MARK=<the run dir> in their environment, which
    is how `cancel` tells the run's processes from anything else that holds the same numbers.
    `env` (a multi-node run's NODE_RANK, HEAD_ADDR, ...) reaches node.sh the same way.
    """
    d = shlex.quote(node_run_dir)
    extra = ""
    for name, value in (env or {}).items():
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"not an environment variable name: {name!r}")
        extra += f"{name}={shlex.quote(value)} "
    return (
        f"cd {d} && if [ -e pid ]; then echo 'a run was already launched in '{d} >&2; exit 1; fi\n"
        f'{extra}{RUN_MARK}="$(pwd -P)" '
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
    """Stop the run's processes and its container (which ends Ray inside it); nothing else.

    The run's processes are the ones carrying its RUN_MARK (the launch gave it to the wrapper,
    everything else inherits it). The number in `pid` is only trusted to name a process group to
    signal at once when that process is this run's wrapper (`bash run_node.sh`, marked): a stale,
    reused or forged pid never gets anyone else's processes signalled. Prints `left:` followed by
    whatever it could not stop (nothing when all went).
    """
    d, c = shlex.quote(node_run_dir), shlex.quote(container)
    name_filter = shlex.quote(f"name=^{container}$")
    # the training container and each stage's one-off container ($CONTAINER-<stage>), by name
    every = " ".join([c, *(shlex.quote(f"{container}-{s}") for s in stage_graph.IN_IMAGE)])
    rm = (
        f"if command -v docker >/dev/null 2>&1; then docker rm -f {every} >/dev/null 2>&1 || true; "
        "fi"
    )
    lines = [
        f"cd {d} || exit 0",
        f"touch {CANCEL_MARK}",
        f"rm -f {SECRETS_FILE}",
        'here="$(pwd -P)"',
        "pg=$(cat pid 2>/dev/null || true)",
        'case "$pg" in "" | *[!0-9]*) pg="" ;; esac',
        "marked() {  # the run's live processes: those whose environment carries its mark",
        f'  grep -lszxF "{RUN_MARK}=$here" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3',
        "}",
        "leader() {  # pid names this run's wrapper, alive and marked",
        '  [ -n "$pg" ] && marked | grep -qx "$pg" &&',
        f'    [ "$(tr "\\0" " " < "/proc/$pg/cmdline" 2>/dev/null)" = "bash {WRAPPER_NAME} " ]',
        "}",
        'alive() { [ -n "$(marked)" ]; }',
        "stop() {  # the verified wrapper's session (its group is in it); other marked processes",
        "  # Each process gets one signal per round: docker's client stops following its container",
        "  # at the third, and the container's last words (its stage's end marker) would be lost.",
        '  local sid=""',
        "  if leader; then",
        '    sid="$pg"',
        "    if command -v pkill >/dev/null 2>&1; then",
        '      pkill -"$1" -s "$pg" 2>/dev/null || true',
        "    else",
        '      kill -"$1" -- "-$pg" 2>/dev/null || true',
        "    fi",
        "  fi",
        "  for p in $(marked); do",
        '    if [ -z "$sid" ] || [ "$(ps -o sid= -p "$p" 2>/dev/null | tr -d " ")" != "$sid" ]',
        "    then",
        '      kill -"$1" "$p" 2>/dev/null || true',
        "    fi",
        "  done",
        "}",
        "if alive; then stop TERM; fi",
        # A container's last words: docker's client passes the TERM on, and the container's EXIT
        # trap prints its stage's end marker, which its removal (SIGKILL) would cut off. Removed
        # at once, a busy node lost that race and the cancelled stage had no end. So the run
        # gets CANCEL_GRACE_TENTHS (5 s) to end by itself; what is left is removed, then killed.
        f"for _ in $(seq {CANCEL_GRACE_TENTHS}); do alive || break; sleep 0.1; done",
        rm,
        "for _ in $(seq 100); do alive || break; sleep 0.1; done",
        "if alive; then stop KILL; sleep 0.3; fi",
        rm,
        # the wrapper's copier (outside the session, unmarked) ends once its last writer is gone:
        # the lines still in its pipe (a stage's end marker) reach node.log before the exit code
        f"cp=$(cat {COPIER_FILE} 2>/dev/null || true)",
        'case "$cp" in "" | *[!0-9]*) cp="" ;; esac',
        'for _ in $(seq 50); do [ -n "$cp" ] && kill -0 "$cp" 2>/dev/null || break; sleep 0.1;'
        " done",
        "[ -f exit_code ] || echo 137 > exit_code",
        'left=""',
        'if alive; then left="processes $(marked | tr "\\n" " ")"; fi',
        "if command -v docker >/dev/null 2>&1 && "
        f'[ -n "$(docker ps -aq --filter {name_filter} 2>/dev/null)" ]; '
        f'then left="$left container "{c}; fi',
        'echo "left:$left"',
    ]
    return "\n".join(lines) + "\n"


def parse_cancel(stdout: str) -> str:
    """What the cancel could not stop ("" when everything went)."""
    return stdout.strip().rsplit("left:", 1)[-1].strip() if "left:" in stdout else ""


def cancelled_command(node_run_dir: str) -> str:
    """Exit 0 when `reproduce cancel` marked the run (its exit code then says little)."""
    return f"test -e {shlex.quote(f'{node_run_dir}/{CANCEL_MARK}')}"


def heartbeat_command(node_run_dir: str) -> str:
    """A follower is reading the run: FOLLOWED_MARK's time is now. Exit 0 whatever happens."""
    return f"touch {shlex.quote(f'{node_run_dir}/{FOLLOWED_MARK}')} 2>/dev/null || true"


def end_command(node_run_dir: str) -> str:
    """Node 0 finished: tell a node that only serves it to stop (the END_MARK; containers see it
    read-only). Exit 0 also when the run directory is gone."""
    return f"touch {shlex.quote(f'{node_run_dir}/{END_MARK}')} 2>/dev/null || true"


def cleanup_command(container: str) -> str:
    """After the script ended: remove its container if the script left one (stopped or not)."""
    c = shlex.quote(container)
    return (
        f"if command -v docker >/dev/null 2>&1; then docker rm -f {c} >/dev/null 2>&1 || true; fi"
    )


def collect_command(node_run_dir: str) -> str:
    """The result files, each as one line `NAME<TAB>BASE64`: only the names in RESULT_FILES, only
    regular files (never through a symlink: dd opens with O_NOFOLLOW, and O_NONBLOCK so a FIFO
    cannot hang it), at most RESULT_MAX_BYTES + 1 bytes read of each (more is refused)."""
    names = " ".join(RESULT_FILES)
    return (
        f"cd {shlex.quote(node_run_dir)} || exit 0\n"
        f"for f in {names}; do\n"
        '  if [ -f "$f" ] && [ ! -L "$f" ]; then\n'
        "    printf '%s\\t' \"$f\"\n"
        '    dd if="$f" iflag=nofollow,nonblock bs=65536 2>/dev/null'
        f" | head -c {RESULT_MAX_BYTES + 1} | base64 -w0\n"
        "    printf '\\n'\n"
        "  fi\n"
        "done\n"
        "true"
    )


def parse_collect(stdout: str) -> tuple[dict[str, bytes], list[str]]:
    """collect_command's answer -> ({name: bytes}, [why a file was not taken]).

    Only RESULT_FILES names are taken, whatever the node printed; an empty or oversized file, or
    one that does not decode, is named in the second list instead.
    """
    got: dict[str, bytes] = {}
    refused: list[str] = []
    for line in stdout.splitlines():
        name, _, payload = line.partition("\t")
        if name not in RESULT_FILES or name in got:
            continue
        try:
            data = base64.b64decode(payload.strip(), validate=True)
        except (binascii.Error, ValueError):
            refused.append(f"{name}: not readable as sent")
            continue
        if len(data) > RESULT_MAX_BYTES:
            refused.append(f"{name}: larger than {RESULT_MAX_BYTES} bytes")
        elif data:
            got[name] = data
    return got, refused


RESULTS_BEGIN = f"{MARKER} results begin"
RESULTS_END = f"{MARKER} results end"


def results_block(collect_command: str) -> list[str]:
    """Bash lines printing the result files between two marker lines (node.sh's last words on the
    job's log, which is all the launcher can read of the cluster)."""
    return [
        "_results() {  # the result files, for the launcher: it reads only this job's log",
        f"  echo '{RESULTS_BEGIN}'",
        "  (",
        *("    " + line for line in collect_command.splitlines()),
        "  )",
        f"  echo '{RESULTS_END}'",
        "}",
    ]
