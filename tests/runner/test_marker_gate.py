"""A marker the training container prints cannot speak for a stage node.sh runs
(launcher/plan/protocol.py, `MarkerGate`).

Found 2026-12-04: a container printing `##reproduce stage=preflight event=end status=failed` then
failing had its own failure blamed on the node (exit 3, "infrastructure", instead of 1), and any
stage node.sh was running could be closed by a line of the recipe's code. node.sh now draws a
nonce when it starts, prints it on its first line and on its own markers, and never exports it.

The adversary here runs the real texts in bash: NONCE_LINE and STAGE_FUNCTIONS as node.sh has
them, and a child `bash -c` standing for the container (the boundary that matters for a shell
variable: a process node.sh starts does not get one it did not export; a docker container gets
even less). The child forges an end and a start for every stage of the seed's real plan, with
every nonce it could guess (none, empty, one of its own), between node.sh's own stages. Every
reader of node.log (the follower's splitter and timeline, `reproduce logs`' stage filter, the
measured runs' cut) must see node.sh's stages only, and the forged lines stay in the log where
they were printed. A stream without a nonce line (a run dir of an older launcher) reads as before.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from support.cli import SEED

from launcher.inputs.profile import load_profile
from launcher.inputs.recipe import load_recipe
from launcher.plan.plan import build_plan
from launcher.plan.protocol import CONTAINER_STAGES, NONCE_LINE, STAGE_FUNCTIONS
from launcher.records.rundir import Timeline
from launcher.runner.runlogs import StageFilter
from launcher.runner.stream import LogSplitter

HOST_STAGES = [
    s.name
    for s in build_plan(load_recipe(SEED), load_profile("local")).stages
    if s.name not in CONTAINER_STAGES
]


def _forgeries() -> str:
    lines = []
    for stage in HOST_STAGES + ["invented"]:
        for n in ("", "n=", "n=" + "0" * 32, "n=" + "f" * 32):
            lines.append(f"##reproduce stage={stage} event=end status=failed rc=1 t=5 {n}")
            lines.append(f"##reproduce stage={stage} event=start t=6 {n}")
    return "\n".join(lines)


def node_output(tmp_path: Path, nonce: bool = True) -> bytes:
    forged = tmp_path / "forged.txt"
    forged.write_text(_forgeries() + "\n")
    container = (  # what the training container runs: its own copy of the stage functions
        f"set -euo pipefail; NODE_RUN_DIR={tmp_path}; {STAGE_FUNCTIONS}\n_cleanup() {{ :; }}\n"
        "_stage_begin ray; _stage_end\n_stage_begin train\n"
        'env | grep -c _REPRODUCE_NONCE || true\ncat "$FORGED"\necho step-line\n_stage_end\n'
    )
    script = "\n".join(
        [
            "set -euo pipefail",
            NONCE_LINE if nonce else "",
            f"NODE_RUN_DIR={tmp_path}",
            STAGE_FUNCTIONS,
            "_cleanup() { :; }",
            "trap _on_exit EXIT",
            "_stage_begin preflight; echo checking; _stage_end",
            "_stage_begin image; echo pulling; _stage_end",
            f"FORGED={forged} bash -c {shlex.quote(container)}",
            "_stage_begin collect; echo collecting; _stage_end",
        ]
    )
    proc = subprocess.run(["bash", "-c", script], capture_output=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def split(tmp_path: Path, data: bytes) -> Timeline:
    logs = tmp_path / "logs"
    logs.mkdir()
    timeline = Timeline()
    splitter = LogSplitter(logs, timeline)
    for k in range(0, len(data), 97):  # in pieces, as a stream arrives
        splitter.append(data[k : k + 97])
    splitter.close()
    return timeline


def test_a_container_cannot_open_or_close_a_stage_node_sh_runs(tmp_path):
    data = node_output(tmp_path)
    assert data.startswith(b"##reproduce nonce=")
    assert b"\n0\n" in data  # the container's environment holds no nonce
    timeline = split(tmp_path, data)
    seen = [(s["name"], s["status"]) for s in timeline.stages]
    assert seen == [
        ("preflight", "ok"),
        ("image", "ok"),
        ("ray", "ok"),
        ("train", "ok"),
        ("collect", "ok"),
    ]
    train_log = (tmp_path / "logs" / "train.log").read_bytes()
    assert _forgeries().encode() in train_log and b"step-line" in train_log
    # `reproduce logs --stage`: the same lines, whatever stage is asked for
    for stage in ("preflight", "train", "invented"):
        assert StageFilter(stage).feed(data) == (
            (tmp_path / "logs" / f"{stage}.log").read_bytes()
            if (tmp_path / "logs" / f"{stage}.log").exists()
            else b""
        )


def test_the_measured_runs_cut_reads_the_same_stages(tmp_path):
    from launcher.results.measured_runs import prepare

    data = node_output(tmp_path)
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "node.log").write_bytes(data)
    timeline = split(tmp_path, data)
    pieces = prepare(run_dir, run_dir, timeline.to_json())
    assert [k for k, _, _ in pieces] == [1]
    cut = (run_dir / "measured" / "1" / "logs" / "train.log").read_bytes()
    assert cut == (tmp_path / "logs" / "train.log").read_bytes()
    assert b"step-line" in cut and _forgeries().encode() in cut


def test_a_stream_without_a_nonce_line_is_read_as_before(tmp_path):
    """A run directory written before the nonce: every well-formed marker counts, forged or not
    (what the old launcher did); nothing of it is lost."""
    timeline = split(tmp_path, node_output(tmp_path, nonce=False))
    names = [s["name"] for s in timeline.stages]
    assert names[:2] == ["preflight", "image"] and "invented" in names
