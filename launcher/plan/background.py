"""The bash functions node.sh runs its parallel stages with (launcher/plan/stage_graph.py).

Why its own module: the node protocol (protocol.py) is what the launcher and node.sh agree on;
these functions are node.sh's own machinery for running stages at once, rendered into it once
(docs/node-scripts.md, "What runs at once").
"""

from __future__ import annotations

from launcher.plan.markers import MARKER
from launcher.plan.protocol import CANCEL_MARK, PROGRESS_WORD

# What runs at once (launcher/plan/stage_graph.py; docs/node-scripts.md, "What runs at once").
# `_bg NAME FUNCTION AFTER...` runs a stage in the background, in a process group of its own (so
# stopping it stops all it started), once each AFTER stage ended ok; its output goes to a log of
# its own, $STAGES_DIR/NAME.log, which `_join` adds whole to node.log when the stage ended: two
# stages never mix lines there, and the launcher splits node.log by markers as before. While they
# run, `_join` prints the newest complete progress line of each (outside every stage: node.log
# only) for the console. `_join` is the one wait: the first stage to fail ends the run with its
# exit code, naming it, and stops the others (status=stopped); a cancel (the EXIT trap, through
# _cleanup) stops them the same way (status=cancelled). Each stage's one-off container is named
# $CONTAINER-NAME, so stopping a stage removes it too.
BACKGROUND_FUNCTIONS = (
    r"""STAGES_DIR="$NODE_RUN_DIR/stages"  # one log per background stage, added whole to node.log
mkdir -m 700 "$STAGES_DIR"
_BG_NAMES=() _BG_PIDS=() _BG_DONE=() _BG_SHOWN=()
_bg() {  # _bg NAME FUNCTION [AFTER...]: FUNCTION as stage NAME, once each AFTER ended ok
  local name=$1 fn=$2
  shift 2
  set -m  # a process group of its own
  (
    _BG_NAME=$name
    trap 'exit 143' TERM
    trap 'exit 130' INT
    trap '_bg_exit "$?"' EXIT
    _await "$@"
    _stage_begin "$name"
    "$fn"
    _stage_end
  ) > "$STAGES_DIR/$name.log" 2>&1 < /dev/null &
  _BG_PIDS+=("$!")
  set +m
  _BG_NAMES+=("$name")
}
_await() {  # until each named stage ended ok; when one did not, this one never starts
  local s rc
  for s in "$@"; do
    until [ -e "$STAGES_DIR/$s.rc" ]; do sleep 0.2; done
    read -r rc _ < "$STAGES_DIR/$s.rc"
    [ "$rc" = 0 ] || { _BG_SKIPPED=1; exit 0; }
  done
}
_bg_exit() {  # a background stage ended: its end marker unless ok, its result for _join
  local rc=$1 status=failed
  if [ -n "${_STAGE:-}" ]; then
    if [ -e "$NODE_RUN_DIR/@CANCEL_MARK@" ]; then status=cancelled
    elif [ -e "$STAGES_DIR/stopped" ]; then status=stopped; fi
    printf '@MARKER@ stage=%s event=end status=%s rc=%s t=%s n=%s\n' \
      "$_STAGE" "$status" "$rc" "$(date +%s.%N)" "${_REPRODUCE_NONCE:-}"
  fi
  [ -z "${_BG_SKIPPED:-}" ] || rc=skipped
  echo "$rc $(date +%s.%N)" > "$STAGES_DIR/$_BG_NAME.rc.tmp"
  mv -f "$STAGES_DIR/$_BG_NAME.rc.tmp" "$STAGES_DIR/$_BG_NAME.rc"
}
_bg_ended() {  # have the stages of these indexes all ended (their result written)?
  local i
  for i in "$@"; do [ -e "$STAGES_DIR/${_BG_NAMES[$i]}.rc" ] || return 1; done
}
_bg_collect() {  # stage $1 (an index) ended: reaped, its whole log added to this one
  wait "${_BG_PIDS[$1]}" 2>/dev/null || true
  cat "$STAGES_DIR/${_BG_NAMES[$1]}.log"
  _BG_DONE[$1]=1
}
_bg_progress() {  # the newest complete progress line of each running stage, for the console
  local i line
  for i in "${!_BG_NAMES[@]}"; do
    [ -z "${_BG_DONE[$i]:-}" ] || continue
    line="$(tail -c 8192 "$STAGES_DIR/${_BG_NAMES[$i]}.log" | sed '$d' \
      | grep -a '^@MARKER@ @PROGRESS@ ' | tail -n 1)" || true
    if [ -n "$line" ] && [ "$line" != "${_BG_SHOWN[$i]:-}" ]; then
      echo "$line"
      _BG_SHOWN[$i]=$line
    fi
  done
}
_join() {  # the one wait: every background stage ends ok, or the first to fail ends the run
  local i rc t first="" first_rc=0 first_t="" left
  while :; do
    left=0
    for i in "${!_BG_NAMES[@]}"; do
      [ -z "${_BG_DONE[$i]:-}" ] || continue
      if ! _bg_ended "$i"; then left=$((left + 1)); continue; fi
      _bg_collect "$i"
      read -r rc t < "$STAGES_DIR/${_BG_NAMES[$i]}.rc"
      [ "$rc" != 0 ] && [ "$rc" != skipped ] || continue
      # the earliest failure counts (the times have one width: they compare as text)
      if [ -z "$first" ] || [[ "$t" < "$first_t" ]]; then
        first=${_BG_NAMES[$i]} first_rc=$rc first_t=$t
      fi
    done
    if [ -n "$first" ]; then
      echo "reproduce: stage $first failed (exit $first_rc); the stages beside it stop" >&2
      _bg_stop
      exit "$first_rc"
    fi
    [ "$left" -gt 0 ] || return 0
    _bg_progress
    sleep 0.5
  done
}
_bg_stop() {  # stop each background stage still running (its group, its container); keep its log
  local i sig running
  [ -n "${_BG_NAMES[*]:-}" ] || return 0
  touch "$STAGES_DIR/stopped"
  for sig in TERM TERM KILL; do  # each after up to 5 s
    running=()
    for i in "${!_BG_NAMES[@]}"; do
      [ -n "${_BG_DONE[$i]:-}" ] || _bg_ended "$i" || running+=("$i")
    done
    [ "${#running[@]}" -gt 0 ] || break
    for i in "${running[@]}"; do
      kill -"$sig" -- "-${_BG_PIDS[$i]}" 2>/dev/null || true
      docker rm -f "$CONTAINER-${_BG_NAMES[$i]}" >/dev/null 2>&1 || true
    done
    [ "$sig" != KILL ] || break
    for _ in $(seq 50); do _bg_ended "${running[@]}" && break; sleep 0.1; done
  done
  for i in "${!_BG_NAMES[@]}"; do [ -n "${_BG_DONE[$i]:-}" ] || _bg_collect "$i"; done
}""".replace("@MARKER@", MARKER)
    .replace("@PROGRESS@", PROGRESS_WORD)
    .replace("@CANCEL_MARK@", CANCEL_MARK)
)
