"""Benchmark: how long `reproduce verify` takes on an attested run of the seed recipe.

Target: well under a second for the seed's run (20 steps, the recipe's own steps_per_run), the
whole command as a user runs it (a fresh process: start-up, signature, every subject's sha256,
the log parsed and judged again). The run directory is a `reproduce measure LOG --out DIR` of
the stand-in miles' log with the seed's arguments, attested with a fresh key; `--steps` makes a
longer log to show how the time grows with it.

    .venv/bin/python benchmarks/verify_attestation.py [--steps 20] [--repeat 7]

Prints one JSON object: the wall times of each `verify` (seconds), their median and best, the
in-process time verify reports (without the interpreter's start-up), the CPU time (user + system)
of each verify process, which a loaded machine changes least, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def reproduce(*args: str | Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "launcher", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    from support.measure import SEED, run_standin, seed_raw, step_times_for_tps

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = root / "logs" / "train.log"
        claim = seed_raw()["result"]["tokens_per_s_per_gpu"]
        run_standin(log, steps=args.steps, step_time_s=step_times_for_tps(claim))
        out = root / "measured"
        for step in (
            ("measure", log, "--recipe", SEED, "--out", out),
            ("keygen", root / "key"),
            ("attest", out, "--key", root / "key"),
        ):
            done = reproduce(*step)
            assert done.returncode in (0, 1), done.stderr
        walls, inside, cpu = [], [], []
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            done = reproduce("verify", out, "--key", root / "key.pub", "--json")
            walls.append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            assert done.returncode == 0, done.stderr
            inside.append(json.loads(done.stdout)["seconds"])
        print(
            json.dumps(
                {
                    "steps": args.steps,
                    "log_bytes": log.stat().st_size,
                    "verify_wall_s": [round(w, 3) for w in walls],
                    "median_wall_s": round(statistics.median(walls), 3),
                    "best_wall_s": round(min(walls), 3),
                    "median_in_process_s": round(statistics.median(inside), 3),
                    "median_cpu_s": round(statistics.median(cpu), 3),
                    "load_average_1m": round(os.getloadavg()[0], 1),
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
