#!/usr/bin/env python3
"""STAND-IN for miles' tools/convert_hf_to_torch_dist.py (tests only: this converts nothing).

What the real converter leaves behind, near enough for the asset path around it: `--save DIR`
gets `latest_checkpointed_iteration.txt` saying `release` and a `release/` directory whose one
file is derived from every file of `--hf-checkpoint` (a conversion of another checkpoint
differs). Model arguments are accepted and ignored. It says that it ran, on stdout and in
`$REPRODUCE_OUT_DIR/standin-converted`, so a test can show that a run whose converted checkpoint
came from a store converted nothing. Standard library only.
"""

import argparse
import hashlib
import os
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-checkpoint", required=True, type=Path)
    parser.add_argument("--save", required=True, type=Path)
    args, _model_args = parser.parse_known_args()
    files = sorted(p for p in args.hf_checkpoint.rglob("*") if p.is_file())
    if not any(p.name == "config.json" for p in files):
        print(f"standin convert: no config.json in {args.hf_checkpoint}", file=sys.stderr)
        return 1
    digest = hashlib.sha256()
    for path in files:
        if path.name.startswith(".reproduce"):
            continue  # the launcher's manifest of the checkpoint, not a checkpoint file
        digest.update(path.relative_to(args.hf_checkpoint).as_posix().encode())
        digest.update(path.read_bytes())
    release = args.save / "release"
    release.mkdir(parents=True, exist_ok=True)
    (release / "__0_0.distcp").write_bytes(digest.digest() * 4096)
    (args.save / "latest_checkpointed_iteration.txt").write_text("release")
    out = os.environ.get("REPRODUCE_OUT_DIR")
    if out:
        with open(Path(out) / "standin-converted", "a") as fh:
            fh.write(f"{args.hf_checkpoint} -> {args.save}\n")
    print(f"standin convert: {len(files)} files of {args.hf_checkpoint} -> {args.save} (release)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
