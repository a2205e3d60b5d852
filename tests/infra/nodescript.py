"""Hand-written node scripts in the shape the Plan renders (stage markers, pull by digest, RepoDigests
check, `docker run ... bash -s` with Ray and the recipe's run), for testing the runner on its own.
"""

from __future__ import annotations

import shlex

from .ports import free_ports

HEADER = """#!/bin/bash
set -euo pipefail
RUN_ID={run_id}
NODE_RUN_DIR={node_run_dir}
CONTAINER={container}
_mark() {{ printf '##reproduce stage=%s event=%s%s t=%s\\n' "$1" "$2" "${{3:+ status=$3}}" "$(date +%s.%N)"; }}
_stage() {{  # _stage NAME COMMAND...: markers around a command, status from its exit code
  local name=$1; shift
  _mark "$name" start
  if "$@"; then _mark "$name" end ok; else local rc=$?; _mark "$name" end failed; return $rc; fi
}}
cd "$NODE_RUN_DIR"
"""


def script(run_id: str, node_run_dir: str, container: str, body: str) -> str:
    q = shlex.quote
    return HEADER.format(run_id=q(run_id), node_run_dir=q(node_run_dir), container=q(container)) + body


def ray_start_args() -> str:
    """`ray start --head` options binding every port to a free loopback one (tests share a host)."""
    p = free_ports(8)
    return (
        f"--head --node-ip-address 127.0.0.1 --port {p[0]} --node-manager-port {p[1]} --object-manager-port {p[2]} "
        f"--dashboard-agent-grpc-port {p[3]} --dashboard-agent-listen-port {p[4]} "
        f"--metrics-export-port {p[5]} --runtime-env-agent-port {p[6]} --min-worker-port {p[7]} "
        f"--max-worker-port {p[7] + 20} --include-dashboard=false --num-cpus 1 --num-gpus 0 "
        "--object-store-memory 100000000 --disable-usage-stats"
    )


def docker_body(image_ref: str, run_args: list[str], train: str, *, ray: bool = True, env: dict | None = None) -> str:
    """preflight -> image (pull by digest, RepoDigests check) -> train (container: Ray, then `train`)."""
    q = shlex.quote
    exports = "".join(f"export {k}={q(v)}\n" for k, v in (env or {}).items())
    ray_part = (
        f"trap 'ray stop --force >/dev/null 2>&1 || true' EXIT\nray start {ray_start_args()} >/tmp/ray-start.log 2>&1 "
        "|| { cat /tmp/ray-start.log; exit 1; }\n"
        if ray
        else ""
    )
    return f"""IMAGE={q(image_ref)}
preflight() {{ command -v docker >/dev/null || {{ echo "docker is not installed on this node" >&2; return 1; }}; }}
pull() {{
  case "$IMAGE" in *@sha256:*) ;; *) echo "refusing $IMAGE: pin the image by digest" >&2; return 1;; esac
  docker pull -q "$IMAGE" >/dev/null || {{ echo "docker pull $IMAGE failed" >&2; return 1; }}
  docker image inspect --format '{{{{range .RepoDigests}}}}{{{{println .}}}}{{{{end}}}}' "$IMAGE" | grep -Fxq "$IMAGE" \\
    || {{ echo "the pulled image's RepoDigests do not hold $IMAGE" >&2; return 1; }}
}}
train() {{
  docker run --rm --name "$CONTAINER" --network none --shm-size 256m -i \\
    -v "$NODE_RUN_DIR:/reproduce/run" {' '.join(q(a) for a in run_args)} \\
    "$IMAGE" bash -s <<'CONTAINER_EOF'
set -euo pipefail
{exports}{ray_part}cd /root/miles
{train}
CONTAINER_EOF
}}
_stage preflight preflight
_stage image pull
_stage train train
echo '{{"image": "'"$IMAGE"'"}}' > "$NODE_RUN_DIR/stack.json"
"""
