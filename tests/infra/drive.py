"""Run launcher.execute.execute in its own process (so tests can kill it, or send it Ctrl-C).

    python tests/infra/drive.py SPEC.json    SPEC: {"cluster": record, "node_script", "run_dir",
                                             "run_id", "node_run_dir", "container", "on_interrupt",
                                             "recipe_raw"?, "poll_s"?}
Exits with the code the CLI would use.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from launcher.errors import ReproduceError
from launcher.execute import cluster_from_record, execute
from launcher.rundir import RunDir


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    cluster = cluster_from_record(spec["cluster"])
    try:
        execute(
            cluster,
            node_script=spec["node_script"],
            run_id=spec["run_id"],
            node_run_dir=spec["node_run_dir"],
            container=spec["container"],
            run_dir=RunDir(Path(spec["run_dir"])),
            recipe_raw=spec.get("recipe_raw"),
            on_interrupt=spec.get("on_interrupt", "ask"),
            poll_s=spec.get("poll_s", 0.2),
            reconnect_s=spec.get("reconnect_s", 10),
        )
    except ReproduceError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
