"""How fast this machine's dockerd takes in an image: a pull by digest from a loopback registry,
and a `docker load` of the same image saved as a tar (what an image kept in the asset store would
cost on the node instead of a pull; issue 24), and the check node.sh makes instead of a pull on a
node whose AMI holds the image (`ami: baked`: docker image inspect, the RepoDigests check,
image.json), timed with the registry stopped, so no pull could hide in it.

Why loopback: the registry's network is taken out, so what is measured is the node's own side of
a pull (download over loopback, sha256 of every blob, gunzip, extraction into overlay2) and of a
load (read, sha256 of every layer against the image's config, extraction). A real pull on a p5en
adds the registry's network (ECR or Docker Hub) on top; launcher/cost/estimate.py keeps its pull
rate an assumption and names this measurement beside it.

The image is made here: LAYERS layers of random bytes (incompressible, as model code and CUDA
libraries nearly are once gzip has had its go), FROM scratch, so nothing is fetched from
anywhere. Needs dockerd and Debian's docker-registry (tests/run.sh installs and starts both).

    .venv/bin/python benchmarks/image_pull.py --layers 4 --layer-mb 256 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.docker import Registry, docker  # noqa: E402

from launcher.plan.image_record import present_or_pull  # noqa: E402

# node.sh's digest check and image.json after the image stage's pull (launcher/plan/node_script.py)
_CHECK = [
    "docker image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' \"$IMAGE\" "
    '> "$NODE_RUN_DIR/image.digests"',
    'grep -qxF "$IMAGE" "$NODE_RUN_DIR/image.digests"',
    'printf \'{"image": "%s", "id": "%s", "repo_digests": %s, "source": "%s"}\\n\' "$IMAGE" '
    '"$(docker image inspect --format \'{{.Id}}\' "$IMAGE")" '
    '"$(docker image inspect --format \'{{json .RepoDigests}}\' "$IMAGE")" "$IMAGE_SOURCE" '
    '> "$NODE_RUN_DIR/image.json"',
]


def _present_check(ref: str, where: Path, repeat: int) -> list[float]:
    """node.sh's `ami: baked` image lines on an image docker holds: seconds per round."""
    script = "\n".join(
        ["set -euo pipefail", f"IMAGE={ref}", f"NODE_RUN_DIR={where}"]
        + present_or_pull(['docker pull "$IMAGE"'])
        + _CHECK
    )
    took = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(["bash", "-c", script], check=True, capture_output=True, timeout=600)
        took.append(round(time.perf_counter() - started, 3))
    assert json.loads((where / "image.json").read_text())["source"] == "ami"
    return took


def _build(where: Path, layers: int, layer_mb: int, tag: str) -> None:
    lines = ["FROM scratch"]
    for i in range(layers):
        with open(where / f"layer{i}.bin", "wb") as fh:
            for _ in range(layer_mb):
                fh.write(os.urandom(1 << 20))
        lines.append(f"COPY layer{i}.bin /layer{i}.bin")
    (where / "Dockerfile").write_text("\n".join(lines) + "\n")
    docker("build", "-q", "-t", tag, str(where), timeout=3600)


def _timed(*args: str) -> float:
    started = time.perf_counter()
    docker(*args, timeout=3600)
    return time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--layer-mb", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    total_mb = args.layers * args.layer_mb
    with tempfile.TemporaryDirectory(prefix="image-pull-") as tmp:
        root = Path(tmp)
        registry = Registry(root / "registry").start()
        repo = f"{registry.address}/bench/image"
        try:
            (root / "ctx").mkdir()
            _build(root / "ctx", args.layers, args.layer_mb, f"{repo}:src")
            docker("push", f"{repo}:src", timeout=3600)
            digest = json.loads(docker("image", "inspect", f"{repo}:src").stdout)[0]["RepoDigests"][
                0
            ]
            docker("save", "-o", str(root / "image.tar"), f"{repo}:src", timeout=3600)
            docker("image", "rm", "-f", f"{repo}:src", check=False)
            rounds = []
            for _ in range(args.repeat):
                pull = _timed("pull", "-q", digest)
                docker("image", "rm", "-f", digest, check=False)
                load = _timed("load", "-q", "-i", str(root / "image.tar"))
                docker("image", "rm", "-f", f"{repo}:src", check=False)
                rounds.append({"pull_s": round(pull, 2), "load_s": round(load, 2)})
            docker("pull", "-q", digest, timeout=3600)
        finally:
            registry.stop()
        check_s = _present_check(digest, root, max(3, args.repeat))  # no registry to ask
        docker("image", "rm", "-f", digest, check=False)
    info = json.loads(docker("info", "--format", "{{json .}}").stdout)
    out = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs)",
        "docker": info.get("ServerVersion"),
        "storage_driver": info.get("Driver"),
        "image_mb": total_mb,
        "layers": args.layers,
        "rounds": rounds,
        "pull_MB_per_s": [round(total_mb / r["pull_s"], 1) for r in rounds],
        "load_MB_per_s": [round(total_mb / r["load_s"], 1) for r in rounds],
        "present_check_s": check_s,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
