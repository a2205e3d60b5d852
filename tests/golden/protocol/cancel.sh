cd /var/tmp/reproduce/runs/20260101T000000Z-abcdef || exit 0
touch state/cancelled
rm -f .secrets.env
here="$(pwd -P)"
pg=$(cat pid 2>/dev/null || true)
case "$pg" in "" | *[!0-9]*) pg="" ;; esac
marked() {  # the run's live processes: those whose environment carries its mark
  grep -lszxF "REPRODUCE_RUN_DIR=$here" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
}
leader() {  # pid names this run's wrapper, alive and marked
  [ -n "$pg" ] && marked | grep -qx "$pg" &&
    [ "$(tr "\0" " " < "/proc/$pg/cmdline" 2>/dev/null)" = "bash run_node.sh " ]
}
alive() { [ -n "$(marked)" ]; }
stop() {  # the verified wrapper's session (its group is in it); other marked processes
  # Each process gets one signal per round: docker's client stops following its container
  # at the third, and the container's last words (its stage's end marker) would be lost.
  local sid=""
  if leader; then
    sid="$pg"
    if command -v pkill >/dev/null 2>&1; then
      pkill -"$1" -s "$pg" 2>/dev/null || true
    else
      kill -"$1" -- "-$pg" 2>/dev/null || true
    fi
  fi
  for p in $(marked); do
    if [ -z "$sid" ] || [ "$(ps -o sid= -p "$p" 2>/dev/null | tr -d " ")" != "$sid" ]
    then
      kill -"$1" "$p" 2>/dev/null || true
    fi
  done
}
if alive; then stop TERM; fi
for _ in $(seq 50); do alive || break; sleep 0.1; done
if command -v docker >/dev/null 2>&1; then docker rm -f reproduce-20260101T000000Z-abcdef reproduce-20260101T000000Z-abcdef-preflight-gpu reproduce-20260101T000000Z-abcdef-stack reproduce-20260101T000000Z-abcdef-rows reproduce-20260101T000000Z-abcdef-convert >/dev/null 2>&1 || true; fi
for _ in $(seq 100); do alive || break; sleep 0.1; done
if alive; then stop KILL; sleep 0.3; fi
if command -v docker >/dev/null 2>&1; then docker rm -f reproduce-20260101T000000Z-abcdef reproduce-20260101T000000Z-abcdef-preflight-gpu reproduce-20260101T000000Z-abcdef-stack reproduce-20260101T000000Z-abcdef-rows reproduce-20260101T000000Z-abcdef-convert >/dev/null 2>&1 || true; fi
cp=$(cat copier 2>/dev/null || true)
case "$cp" in "" | *[!0-9]*) cp="" ;; esac
for _ in $(seq 50); do [ -n "$cp" ] && kill -0 "$cp" 2>/dev/null || break; sleep 0.1; done
[ -f exit_code ] || echo 137 > exit_code
left=""
if alive; then left="processes $(marked | tr "\n" " ")"; fi
if command -v docker >/dev/null 2>&1 && [ -n "$(docker ps -aq --filter 'name=^reproduce-20260101T000000Z-abcdef$' 2>/dev/null)" ]; then left="$left container "reproduce-20260101T000000Z-abcdef; fi
echo "left:$left"
