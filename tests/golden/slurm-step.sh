#!/bin/bash
# One job step of a nightly group's Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST are the allocation's),
# run on the login node; written by reproduce from the run's plan.

set -u
if [ -e /shared/reproduce/runs/20261201T120000Z-golden/state/cancelled ]; then
  echo "reproduce: the run was cancelled before its job started" >&2; exit 3
fi
# every node's address, in the job's node order (SLURM_NODEID)
addrs=()
for n in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
  a=$(scontrol show node "$n" | tr " " "\n" | sed -n "s/^NodeAddr=//p" | head -n 1)
  addrs+=("${a:-$n}")
done
export REPRODUCE_NODE_ADDRS="${addrs[*]}"
echo "reproduce: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST ($REPRODUCE_NODE_ADDRS)"
srun --jobid="$SLURM_JOB_ID" --job-name=reproduce-20261201T120000Z-golden --nodes=1 --ntasks=1 --ntasks-per-node=1 --kill-on-bad-exit=0 --gres=gpu:8 bash -c 'set -u
case "$SLURM_NODEID" in
  0) d=/shared/reproduce/runs/20261201T120000Z-golden; c=reproduce-20261201T120000Z-golden ;;
  *) echo "reproduce: no run directory for node $SLURM_NODEID" >&2; exit 3 ;;
esac
trap '"'"'echo "reproduce: task got SIGTERM" >&2'"'"' TERM
cd "$d" || exit 3
REPRODUCE_RUN_DIR="$(pwd -P)" bash run_node.sh </dev/null
rc=$?
if command -v docker >/dev/null 2>&1; then
  docker rm -f "$c" "$c-preflight-gpu" "$c-stack" "$c-rows" "$c-convert" >/dev/null 2>&1 || true
fi
exit "$rc"
'
