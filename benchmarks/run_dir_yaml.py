"""Benchmark: reading a run directory's YAML (records/rundir.read_yaml) against PyYAML's
pure-Python safe_load, on the files a real measurement writes.

The run directory is a `reproduce measure LOG --out DIR` of the stand-in miles' log with the
seed's arguments (`--steps` steps); result.yaml and recipe.yaml are each read REPEAT times by both,
and the CPU time per read (process time, which a loaded machine changes least) is printed.

    .venv/bin/python benchmarks/run_dir_yaml.py [--steps 20] [--repeat 200]
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def per_read_ms(read, path: Path, repeat: int) -> float:
    started = time.process_time()
    for _ in range(repeat):
        read(path)
    return (time.process_time() - started) / repeat * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    import yaml
    from support.measure import SEED, run_standin, seed_raw, step_times_for_tps

    from launcher.records.rundir import Files, read_yaml

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = root / "train.log"
        run_standin(
            log,
            steps=args.steps,
            step_time_s=step_times_for_tps(seed_raw()["result"]["tokens_per_s_per_gpu"]),
        )
        out = root / "measured"
        done = subprocess.run(
            [sys.executable, "-m", "launcher", "measure", str(log), "--recipe", str(SEED), "--out", str(out)],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False,
        )  # fmt: skip
        assert done.returncode in (0, 1), done.stderr
        (out / Files.RECIPE).write_text(SEED.read_text())
        rows = {}
        for name in (Files.RESULT, Files.RECIPE):
            path = out / name
            rows[name] = {
                "bytes": path.stat().st_size,
                "read_yaml_ms": round(per_read_ms(read_yaml, path, args.repeat), 3),
                "safe_load_ms": round(
                    per_read_ms(lambda p: yaml.safe_load(p.read_text()), path, args.repeat), 3
                ),
            }
            rows[name]["ratio"] = round(rows[name]["safe_load_ms"] / rows[name]["read_yaml_ms"], 1)
    print(
        json.dumps(
            {
                "files": rows,
                "libyaml": bool(getattr(yaml, "__with_libyaml__", False)),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "load_average": os.getloadavg(),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
