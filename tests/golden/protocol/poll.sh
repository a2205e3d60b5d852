_alive() { if command -v ps >/dev/null 2>&1; then ps -s "$1" -o stat= 2>/dev/null | grep -qv "^Z"; else kill -0 -- "-$1" 2>/dev/null; fi; }
cd /var/tmp/reproduce/runs/20260101T000000Z-abcdef 2>/dev/null || { echo gone; exit 0; }
if [ -f exit_code ]; then echo "exit $(cat exit_code)"
elif [ -s pid ] && _alive "$(cat pid)"; then echo alive
else echo gone; fi
