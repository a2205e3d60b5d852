cd /var/tmp/reproduce/runs/20260101T000000Z-abcdef && if [ -e pid ]; then echo 'a run was already launched in '/var/tmp/reproduce/runs/20260101T000000Z-abcdef >&2; exit 1; fi
REPRODUCE_RUN_DIR="$(pwd -P)" setsid nohup bash run_node.sh </dev/null >/dev/null 2>&1 &
for _ in $(seq 200); do [ -s pid ] && break; sleep 0.05; done
cat pid
