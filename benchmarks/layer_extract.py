"""The node's side of an image pull, taken apart: how fast this machine verifies, decompresses and
extracts an image's gzipped layers one after another (what dockerd does: it applies layers in
order) and all at once (what a runtime that unpacks layers in parallel would do: containerd 2.2's
`max_concurrent_unpacks`, the SOCI snapshotter's parallel pull-unpack mode), beside the machine's
own limits on the same blobs (read, sha256). Issue 24: the `pull` figure of
launcher/cost/figures.py is an assumption; this measures the part of it that is the node's.

Why not dockerd: the 16-core device machine runs no dockerd (no privileges for overlay mounts),
and the 2-core machine's dockerd measurement (benchmarks/image_pull.py) used incompressible
random layers. Here the layers are made of real files: the Python packages a training image
carries (PyTorch with its CUDA libraries, where the machine has them), so gzip has the ratio and
the decompression speed of a real image's layers. `gzip -dc | tar -x` is GNU zlib and tar; moby
decompresses with `unpigz` where it is installed (else Go's compress/gzip, slower than zlib) and
extracts with Go's archive/tar, so the sequential figure here is an upper bound on dockerd's.

Nothing is fetched: the layers are built from directories already on the machine (--source),
compressed untimed (gzip -LEVEL, one process per layer), then timed.

    python3 benchmarks/layer_extract.py --source "$(python3 -c 'import site; print(site.getsitepackages()[0])')" \
        --layers 8 --work /tmp/layers --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import TypedDict


class Layer(TypedDict):
    blob: str
    files: int
    raw_bytes: int
    gz_bytes: int


def _files(sources: list[Path]) -> list[tuple[Path, int]]:
    """Every regular file under the sources, with its size (links and the rest left out)."""
    found: list[tuple[Path, int]] = []
    for source in sources:
        for root, _dirs, names in os.walk(source):
            for name in names:
                path = Path(root) / name
                if path.is_file() and not path.is_symlink():
                    found.append((path, path.stat().st_size))
    return found


def _split(files: list[tuple[Path, int]], layers: int) -> list[list[tuple[Path, int]]]:
    """Files into `layers` bins by top-level package, largest package first into the lightest bin.

    Why by package: an image's layers are made by its build steps, each adding whole packages, so
    a layer holds whole directories; the biggest (libtorch, cuDNN, cuBLAS) make the biggest layer,
    which bounds the parallel case as it does on a real node.
    """
    groups: dict[str, list[tuple[Path, int]]] = {}
    for path, size in files:
        key = str(path.parent)
        for parent in path.parents:
            if parent.name in ("site-packages", "dist-packages"):
                key = str(path.relative_to(parent)).split(os.sep, 1)[0]
                break
        groups.setdefault(key, []).append((path, size))
    bins: list[list[tuple[Path, int]]] = [[] for _ in range(layers)]
    weight = [0] * layers
    for group in sorted(groups.values(), key=lambda g: -sum(s for _, s in g)):
        lightest = weight.index(min(weight))
        bins[lightest].extend(group)
        weight[lightest] += sum(s for _, s in group)
    return [b for b in bins if b]


def _build(bins: list[list[tuple[Path, int]]], work: Path, level: int) -> list[Layer]:
    """One gzipped tar per bin, all compressed at once (untimed: a registry holds them made)."""
    procs = []
    layers: list[Layer] = []
    for index, members in enumerate(bins):
        listing = work / f"layer{index}.list"
        listing.write_text("".join(f"{str(p).lstrip('/')}\n" for p, _ in members))
        blob = work / f"layer{index}.tar.gz"
        script = 'set -o pipefail; tar -cf - -C / --files-from "$1" | gzip -"$2" > "$3"'
        procs.append(
            subprocess.Popen(["bash", "-c", script, "-", str(listing), str(level), str(blob)])
        )
        layers.append(
            {
                "blob": str(blob),
                "files": len(members),
                "raw_bytes": sum(s for _, s in members),
                "gz_bytes": 0,
            }
        )
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit("building a layer failed")
    for layer in layers:
        layer["gz_bytes"] = Path(layer["blob"]).stat().st_size
    return layers


def _timed(commands: list[list[str]], parallel: bool) -> float:
    """Seconds for the commands, one after another or all at once; any failure stops it."""
    started = time.perf_counter()
    if parallel:
        procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL) for c in commands]
        if any(p.wait() != 0 for p in procs):
            raise SystemExit(f"failed: {commands}")
    else:
        for command in commands:
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def _extract(layers: list[Layer], work: Path, parallel: bool) -> tuple[float, float]:
    """Decompress and untar every layer into a fresh directory; then the time to make it durable."""
    target = work / "rootfs"
    shutil.rmtree(target, ignore_errors=True)
    commands = []
    for index, layer in enumerate(layers):
        dest = target / f"l{index}"
        dest.mkdir(parents=True)
        commands.append(
            [
                "bash",
                "-c",
                'set -o pipefail; gzip -dc "$1" | tar -xf - -C "$2"',
                "-",
                layer["blob"],
                str(dest),
            ]
        )
    took = _timed(commands, parallel)
    started = time.perf_counter()
    subprocess.run(["sync"], check=True)
    return took, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, action="append", required=True)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument(
        "--level", type=int, default=6, help="gzip level (6: gzip's and Go's default)"
    )
    parser.add_argument("--max-gb", type=float, default=12.0, help="cap the raw bytes taken")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    files = sorted(_files([s.resolve() for s in args.source]), key=lambda f: str(f[0]))
    kept, total = [], 0
    for path, size in files:
        if total + size > args.max_gb * 1e9:
            continue
        kept.append((path, size))
        total += size
    started = time.perf_counter()
    layers = _build(_split(kept, args.layers), args.work, args.level)
    built = time.perf_counter() - started
    gz = sum(layer["gz_bytes"] for layer in layers)
    raw = sum(layer["raw_bytes"] for layer in layers)
    blobs = [layer["blob"] for layer in layers]
    rounds = []
    for _ in range(args.repeat):
        row = {
            "read_all_at_once": _timed([["cat", b] for b in blobs], parallel=True),
            "sha256_all_at_once": _timed([["sha256sum", b] for b in blobs], parallel=True),
            "sha256_in_order": _timed([["sha256sum", b] for b in blobs], parallel=False),
        }
        row["extract_in_order"], row["sync_after_in_order"] = _extract(layers, args.work, False)
        row["extract_all_at_once"], row["sync_after_all_at_once"] = _extract(
            layers, args.work, True
        )
        rounds.append(row)
        print(json.dumps({k: round(v, 2) for k, v in row.items()}), flush=True)
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": platform.python_version(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gzip_level": args.level,
        "layers": layers,
        "raw_gb": raw / 1e9,
        "gz_gb": gz / 1e9,
        "build_s": built,
        "rounds": rounds,
        "rates_raw_gb_per_s": [
            {k: round(raw / 1e9 / v, 3) for k, v in row.items() if k.startswith("extract")}
            for row in rounds
        ],
        "rates_gz_gb_per_s": [
            {k: round(gz / 1e9 / v, 3) for k, v in row.items() if not k.startswith("sync")}
            for row in rounds
        ],
    }
    print(
        json.dumps(
            {
                k: report[k]
                for k in (
                    "machine",
                    "raw_gb",
                    "gz_gb",
                    "build_s",
                    "rates_gz_gb_per_s",
                    "rates_raw_gb_per_s",
                )
            },
            indent=1,
        )
    )
    print("largest layer gz GB:", max(layer["gz_bytes"] for layer in layers) / 1e9)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    shutil.rmtree(args.work / "rootfs", ignore_errors=True)


if __name__ == "__main__":
    main()
