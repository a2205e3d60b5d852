"""The node programs behind a shim that slows a stage down or makes it fail, for running the
Plan's real node.sh with faults (tests/e2e/test_overlap_exec.py).

`fault_scripts(dir, slow=..., fail=...)` copies scripts/ to `dir` and puts a shim in front of each
program a parallel stage runs (launcher/plan/stage_graph.py): the shim tells the stage from its
arguments, sleeps `slow[stage]` seconds in a child process whose command line says `shim-sleep`
(so a test can see that none is left), exits 7 when the stage is `fail`, and otherwise runs the
real program. No GPU here: the preflight's shim prints a passing report instead of measuring.
The shim runs on the host and in the containers (scripts/ is mounted there), so it is Python 3.8.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from launcher.plan import stage_graph

REPO = Path(__file__).resolve().parents[2]
SHIMMED = ("preflight.py", "pull_progress.py", "stack_probe.py", "node_assets.py",
           "pretokenized_sft_rollout.py")  # fmt: skip

SHIM = '''"""Test shim (tests/support/faults.py) in front of _real_{name}."""
import json, os, runpy, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = {name!r}


def stage(argv):
    if NAME == "preflight.py":
        return "preflight" if "--no-bench" in argv else "preflight-gpu"
    if NAME == "pull_progress.py":
        return "image"
    if NAME == "stack_probe.py":
        return "stack"
    if NAME == "pretokenized_sft_rollout.py":
        return "rows"
    if NAME == "node_assets.py" and argv[:1] == ["resolve"]:
        return "resolve"
    if NAME == "node_assets.py" and argv[:1] == ["fetch"]:
        return "rows" if argv[-1] == "rows" else "assets"
    return None


with open(os.path.join(HERE, "_fault.json")) as fh:
    fault = json.load(fh)
me = stage(sys.argv[1:])
if me is not None:
    print("shim: %s in stage %s" % (NAME, me), file=sys.stderr, flush=True)
    if me == fault.get("fail"):
        time.sleep(1.0)  # the stages beside it have started
        print("shim: stage %s fails here" % me, file=sys.stderr, flush=True)
        sys.exit(7)
    pause = fault.get("slow", {{}}).get(me, 0)
    if pause:
        code = "import sys, time; time.sleep(float(sys.argv[1]))"
        subprocess.call([sys.executable, "-c", code, str(pause), "shim-sleep"])
if NAME == "preflight.py":  # no GPU here: a passing report
    print(json.dumps({{"ok": True, "checks": []}}))
    sys.exit(0)
sys.argv[0] = os.path.join(HERE, "_real_" + NAME)
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def fault_scripts(
    to: Path, *, slow: dict[str, float] | None = None, fail: str | None = None
) -> Path:
    """scripts/ at `to`, each parallel stage's program behind the shim."""
    shutil.copytree(REPO / "scripts", to, ignore=shutil.ignore_patterns("__pycache__"))
    for name in SHIMMED:
        (to / name).rename(to / f"_real_{name}")
        (to / name).write_text(SHIM.format(name=name))
    (to / "_fault.json").write_text(json.dumps({"slow": slow or {}, "fail": fail}))
    return to


def prerequisites(stage: str) -> set[str]:
    """Every stage `stage` waits for, directly or not."""
    found: set[str] = set()
    todo = list(stage_graph.AFTER[stage])
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += stage_graph.AFTER[name]
    return found
