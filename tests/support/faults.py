"""The node programs behind a shim that slows a stage down or makes it fail, for running the
Plan's real node.sh with faults (tests/e2e/test_overlap_exec.py).

`fault_scripts(dir, ...)` copies scripts/ to `dir` and puts a shim in front of each program a
parallel stage runs (launcher/plan/stage_graph.py): the shim tells the stage from its arguments,
sleeps `slow_programs[stage]` seconds (inside the program: in the container for a stage that runs
one), then runs the real program. `with_probe` makes each background stage of node.sh start with
a probe that sleeps `slow[stage]` seconds or fails (exit 7) when the stage is `fail`. Every sleep
is a child process whose command line names this test's scripts dir (`sleeping` finds what is
left). No GPU here: the preflight's shim prints a passing report instead of measuring. The shim
runs on the host and in the containers (scripts/ is mounted there), so it is Python 3.8.
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
sleep_word = lambda fault: "shim-sleep:" + fault["token"]
me = stage(sys.argv[1:])
if me is not None:
    print("shim: %s in stage %s" % (NAME, me), file=sys.stderr, flush=True)
    pause = fault.get("slow_programs", {{}}).get(me, 0)
    if pause:
        code = "import sys, time; time.sleep(float(sys.argv[1]))"
        subprocess.call([sys.executable, "-c", code, str(pause), sleep_word(fault)])
if NAME == "preflight.py":  # no GPU here: a passing report
    print(json.dumps({{"ok": True, "checks": []}}))
    sys.exit(0)
sys.argv[0] = os.path.join(HERE, "_real_" + NAME)
runpy.run_path(sys.argv[0], run_name="__main__")
'''


# The first command of each background stage's function in node.sh, added by `with_probe`: what
# the Plan runs in a stage here may be nothing at all (the test profile's assets are in place).
PROBE = '''"""Test probe (tests/support/faults.py): stage ARGV[1] sleeps or fails, per _fault.json."""
import json, os, subprocess, sys, time

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fault.json")) as fh:
    fault = json.load(fh)
sleep_word = lambda fault: "shim-sleep:" + fault["token"]
me = sys.argv[1]
if me == fault.get("fail"):
    time.sleep(1.0)  # the stages beside it have started
    print("shim: stage %s fails here" % me, file=sys.stderr, flush=True)
    sys.exit(7)
pause = fault.get("slow", {}).get(me, 0)
if pause:
    code = "import sys, time; time.sleep(float(sys.argv[1]))"
    subprocess.call([sys.executable, "-c", code, str(pause), sleep_word(fault)])
'''


def fault_scripts(
    to: Path,
    *,
    slow: dict[str, float] | None = None,
    fail: str | None = None,
    slow_programs: dict[str, float] | None = None,
) -> Path:
    """scripts/ at `to`: `_fault.py` (the probe: `slow` and `fail` at a stage's start) and each
    parallel stage's program behind the shim (`slow_programs`: inside the program, so in the
    container for the stages that run one)."""
    shutil.copytree(REPO / "scripts", to, ignore=shutil.ignore_patterns("__pycache__"))
    for name in SHIMMED:
        (to / name).rename(to / f"_real_{name}")
        (to / name).write_text(SHIM.format(name=name))
    (to / "_fault.py").write_text(PROBE)
    config = {
        "slow": slow or {},
        "fail": fail,
        "slow_programs": slow_programs or {},
        "token": str(to),  # in each sleep's command line: this test's, no other's
    }
    (to / "_fault.json").write_text(json.dumps(config))
    return to


def sleeping(scripts: Path) -> list[str]:
    """The sleeps of the shims and probes of `scripts` (fault_scripts' dir) still running."""
    from .helpers import processes_mentioning

    return processes_mentioning(f"shim-sleep:{scripts}")


def with_probe(node_script: str) -> str:
    """node.sh with the probe as the first command of each background stage's function."""
    for name in stage_graph.PARALLEL:
        head = f"{stage_graph.function_name(name)}() {{\n"
        assert head in node_script, name
        probe = f'python3 "$NODE_RUN_DIR/scripts/_fault.py" {name}\n'
        node_script = node_script.replace(head, head + probe, 1)
    return node_script


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
