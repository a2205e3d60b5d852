_alive() { if command -v ps >/dev/null 2>&1; then ps -s "$1" -o stat= 2>/dev/null | grep -qv "^Z"; else kill -0 -- "-$1" 2>/dev/null; fi; }
cd /var/tmp/reproduce/runs/20260101T000000Z-abcdef || exit 0
touch cancelled
pg=$(cat pid 2>/dev/null || true)
alive() { [ -n "$pg" ] && _alive "$pg"; }
stop() {  # the run's process group, and anything of its session that left the group
  kill -"$1" -- "-$pg" 2>/dev/null || true
  if command -v pkill >/dev/null 2>&1; then pkill -"$1" -s "$pg" 2>/dev/null || true; fi
}
if alive; then stop TERM; fi
if command -v docker >/dev/null 2>&1; then docker rm -f reproduce-20260101T000000Z-abcdef >/dev/null 2>&1 || true; fi
for _ in $(seq 100); do alive || break; sleep 0.1; done
if alive; then stop KILL; sleep 0.3; fi
if command -v docker >/dev/null 2>&1; then docker rm -f reproduce-20260101T000000Z-abcdef >/dev/null 2>&1 || true; fi
[ -f exit_code ] || echo 137 > exit_code
left=""
if alive; then left="processes of group $pg"; fi
if command -v docker >/dev/null 2>&1 && [ -n "$(docker ps -aq --filter name=^reproduce-20260101T000000Z-abcdef$ 2>/dev/null)" ]; then left="$left container reproduce-20260101T000000Z-abcdef"; fi
echo "left:$left"
