"""How long `validate` takes to read a run block as bash does (launcher/inputs/runblock.py), on the
seed's block and on the largest blocks it reads (128 KiB: a larger one is refused unread, since
the container's script could not start): many short commands, one long word, many
here-documents, and the whole run-block check with `bash -n`.

    .venv/bin/python benchmarks/run_block_reader.py
"""

from __future__ import annotations

import time

import yaml

from launcher.inputs.runargs import run_block_problems
from launcher.inputs.runblock import read_run_block
from launcher.resources import data_dir

SEED = data_dir("recipes") / "qwen3-30b-a3b" / "h200" / "attune-tp1-pp1-ep8-mt16k.yaml"


def timed(what: str, fn, repeat: int = 5) -> None:
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    print(f"{what:<44} {(time.perf_counter() - t0) / repeat * 1000:8.1f} ms")


def main() -> None:
    raw = yaml.safe_load(SEED.read_text())
    call = "python3 train.py --lr 1\n"
    shapes = {
        "the seed's block (1.4 KB)": raw["run"],
        "65,000 commands `a;` (128 KiB)": "a;" * 65_000 + "\n" + call,
        "one 128 KiB word": ": " + "x" * 130_000 + "\n" + call,
        "8,000 here-documents (120 KiB)": "cat <<E\nit's\nE\n" * 8_000 + call,
    }
    for what, text in shapes.items():
        timed(what, lambda text=text: read_run_block(text))
    timed("the seed's whole run-block check (bash -n)", lambda: run_block_problems(raw))


if __name__ == "__main__":
    main()
