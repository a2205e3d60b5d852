if command -v docker >/dev/null 2>&1; then docker rm -f reproduce-20260101T000000Z-abcdef >/dev/null 2>&1 || true; fi
