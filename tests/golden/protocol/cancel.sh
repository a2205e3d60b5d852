cd /var/tmp/reproduce/runs/20260101T000000Z-abcdef || exit 0
touch state/cancelled
rm -f .secrets.env
here="$(pwd -P)"
pg=$(cat pid 2>/dev/null || true)
case "$pg" in "" | *[!0-9]*) pg="" ;; esac
ours() {  # a process of this run: it carries the mark the launch gave the wrapper
  tr "\0" "\n" < "/proc/$1/environ" 2>/dev/null | grep -qxF "REPRODUCE_RUN_DIR=$here"
}
leader() {  # pid names this run's wrapper, alive
  [ -n "$pg" ] && ours "$pg" &&
    [ "$(tr "\0" " " < "/proc/$pg/cmdline" 2>/dev/null)" = "bash run_node.sh " ]
}
members() { [ -n "$pg" ] && ps -s "$pg" -o pid= 2>/dev/null; }
alive() {
  if leader; then return 0; fi
  for p in $(members); do ours "$p" && return 0; done
  return 1
}
stop() {  # the run's process group and the rest of its session; else the marked ones
  if leader; then
    kill -"$1" -- "-$pg" 2>/dev/null || true
    if command -v pkill >/dev/null 2>&1; then
      pkill -"$1" -s "$pg" 2>/dev/null || true
    fi
  else
    for p in $(members); do
      if ours "$p"; then kill -"$1" "$p" 2>/dev/null || true; fi
    done
  fi
}
if alive; then stop TERM; fi
if command -v docker >/dev/null 2>&1; then docker rm -f reproduce-20260101T000000Z-abcdef >/dev/null 2>&1 || true; fi
for _ in $(seq 100); do alive || break; sleep 0.1; done
if alive; then stop KILL; sleep 0.3; fi
if command -v docker >/dev/null 2>&1; then docker rm -f reproduce-20260101T000000Z-abcdef >/dev/null 2>&1 || true; fi
[ -f exit_code ] || echo 137 > exit_code
left=""
if alive; then left="processes of group $pg"; fi
if command -v docker >/dev/null 2>&1 && [ -n "$(docker ps -aq --filter 'name=^reproduce-20260101T000000Z-abcdef$' 2>/dev/null)" ]; then left="$left container "reproduce-20260101T000000Z-abcdef; fi
echo "left:$left"
