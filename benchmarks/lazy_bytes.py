"""What the GPU preflight and the stack probe read of the image: the files every Python process
they start maps or imports, with their sizes (issue 24: `lazy_bytes` in launcher/cost/figures.py).

Why it matters: on a node from a baked AMI (`ami: baked`) the image is in docker's store on an EBS
volume restored from a snapshot, and each block comes from S3 on its first read; the GPU stages
are the first to read the image, so the bytes they touch, at the volume's initialization rate,
are what the baked path pays instead of a pull. The estimate assumed 8 GB; this measures it on a
machine whose Python holds PyTorch with its CUDA libraries (the device machine, `runtime: host`).

How: a `sitecustomize` put first on PYTHONPATH makes every Python process of the commands (the
preflight's benchmark children too) write, at exit, the files in its /proc/self/maps and the
source and bytecode of every module it imported. The union of all processes is summed by file
size: an upper bound on the bytes read from them (a mapped library is read only where touched),
and what a lazily loaded volume fetches is whole blocks of those files. Files under --exclude
(the driver's, which the NVIDIA container toolkit mounts from the host, not the image) are left
out. The commands run as given, one after another (node.sh runs the two stages at once; the union
is what both read).

    python3 benchmarks/lazy_bytes.py --exclude /usr/local/nvidia --json out.json -- \
        "python3 scripts/preflight.py --json ..." "python3 scripts/stack_probe.py --json ..."
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HOOK = """
import atexit, os, sys

def _reproduce_record_files():
    seen = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    seen.add(parts[5].strip())
    except OSError:
        pass
    for module in list(sys.modules.values()):
        for attr in ("__file__", "__cached__"):
            path = getattr(module, attr, None)
            if isinstance(path, str):
                seen.add(os.path.abspath(path))
    with open(os.environ["REPRODUCE_LAZY_LOG"], "a") as log:
        log.write("".join(p + "\\n" for p in seen))

atexit.register(_reproduce_record_files)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exclude", action="append", default=[], help="a path prefix left out")
    parser.add_argument("--json", type=Path)
    parser.add_argument("commands", nargs="+", help="shell commands, run one after another")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as hook_dir:
        Path(hook_dir, "sitecustomize.py").write_text(_HOOK)
        log = Path(hook_dir, "files.log")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [hook_dir, env.get("PYTHONPATH")]))
        env["REPRODUCE_LAZY_LOG"] = str(log)
        walls = []
        for command in args.commands:
            started = time.perf_counter()
            done = subprocess.run(["bash", "-c", command], env=env, stdout=subprocess.DEVNULL)
            walls.append(
                {
                    "command": command,
                    "rc": done.returncode,
                    "wall_s": round(time.perf_counter() - started, 2),
                }
            )
        paths = set(log.read_text().split("\n")) - {""} if log.exists() else set()
    sizes: dict[str, int] = {}
    for path in sorted(paths):
        if any(path.startswith(prefix) for prefix in args.exclude) or path.startswith(
            ("/proc", "/dev", "/sys", hook_dir)
        ):
            continue
        try:
            stat = os.stat(path)
        except OSError:
            continue
        sizes[os.path.realpath(path)] = stat.st_size
    by_top: dict[str, int] = {}
    for path, size in sizes.items():
        parts = Path(path).parts
        key = "/".join(parts[: 7 if "site-packages" in parts else 4])
        if "site-packages" in parts:
            key = "/".join(parts[: parts.index("site-packages") + 2])
        by_top[key] = by_top.get(key, 0) + size
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": sys.version.split()[0],
        "commands": walls,
        "files": len(sizes),
        "bytes": sum(sizes.values()),
        "largest": sorted(((s, p) for p, s in sizes.items()), reverse=True)[:25],
        "by_directory": dict(sorted(by_top.items(), key=lambda kv: -kv[1])[:30]),
    }
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
