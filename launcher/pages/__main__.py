"""`python -m launcher.pages RUN_DIR [RUN_DIR ...]`: write each run directory's report.html again
from its files, offline (nothing is measured again; `reproduce measure RUN_DIR` does that)."""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.pages.run_page import write_run_page


def main(argv: list[str]) -> int:
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0 if argv else 2
    code = 0
    for arg in argv:
        run_dir = Path(arg)
        if not run_dir.is_dir():
            print(f"{run_dir}: not a directory", file=sys.stderr)
            code = 2
            continue
        print(write_run_page(run_dir))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
