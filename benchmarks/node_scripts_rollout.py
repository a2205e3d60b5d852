#!/usr/bin/env python3
"""Cost of pretokenized_sft_rollout.generate_rollout per step: 128 rows x 8,192 tokens (the seed's batch).

    .venv/bin/python benchmarks/node_scripts_rollout.py [--rows 128] [--row-tokens 8192] [--repeat 5]

Prints the best of --repeat timings. The rows are random ids under 151,000 and random masks starting
within the first 2,000 tokens; the cost does not depend on the values, only on the sizes.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pretokenized_sft_rollout.py"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--row-tokens", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("pretokenized_sft_rollout", SCRIPT)
    ro = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ro)

    r = random.Random(0)
    rows = []
    for _ in range(args.rows):
        toks = [r.randrange(151_000) for _ in range(args.row_tokens)]
        first = r.randrange(min(2000, args.row_tokens))
        mask = [0] * first + [r.choice((0, 1, 1)) for _ in range(args.row_tokens - first)]
        mask[first] = 1
        rows.append((toks, {"loss_mask": mask, "supervised_tokens": sum(mask)}))

    class Sample:
        def __init__(self, prompt, metadata):
            self.prompt, self.metadata = prompt, metadata

    class Source:
        def get_samples(self, n):
            return [[Sample(*rows[i])] for i in range(n)]

    class Args:
        rollout_batch_size = args.rows

    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        ro.generate_rollout(Args, 0, Source())
        times.append(time.perf_counter() - t)
    print(
        f"generate_rollout {args.rows} x {args.row_tokens}: best {min(times) * 1000:.1f} ms, "
        f"all {', '.join(f'{x * 1000:.1f}' for x in times)} ms"
    )


if __name__ == "__main__":
    main()
