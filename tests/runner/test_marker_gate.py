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
from launcher.judge.timeline import RunTimeline, StageTimes
from launcher.plan.markers import CONTAINER_STAGES, MarkerGate
from launcher.plan.plan import build_plan
from launcher.plan.protocol import NONCE_LINE, STAGE_FUNCTIONS
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
    seen = [(s.name, s.status) for s in timeline.stages]
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
    pieces = prepare(run_dir, run_dir, RunTimeline.of(timeline.to_json()))
    assert [k for k, _, _ in pieces] == [1]
    cut = (run_dir / "measured" / "1" / "logs" / "train.log").read_bytes()
    assert cut == (tmp_path / "logs" / "train.log").read_bytes()
    assert b"step-line" in cut and _forgeries().encode() in cut


def test_a_stream_without_a_nonce_line_is_read_as_before(tmp_path):
    """A run directory written before the nonce: every well-formed marker counts, forged or not
    (what the old launcher did); nothing of it is lost."""
    timeline = split(tmp_path, node_output(tmp_path, nonce=False))
    names = [s.name for s in timeline.stages]
    assert names[:2] == ["preflight", "image"] and "invented" in names


def _container_forgeries(now: float) -> list[str]:
    """Every marker a container could print without the nonce, for its own stages: each
    event and status, dated before the container started, now, and not at all."""
    lines = []
    for stage in ("ray", "train"):
        for t in ("t=1.0", f"t={now:.3f}", ""):
            lines.append(f"##reproduce stage={stage} event=start {t}")
            for status in ("ok", "failed", "stopped", "cancelled"):
                lines.append(f"##reproduce stage={stage} event=end status={status} rc=1 {t}")
    return lines


def test_forged_container_markers_never_fail_ray_once_train_began(tmp_path):
    """The real order (node.sh's stages, then ray, then three measured trains, the last one
    failing) with every container forgery put at every point after train began: ray stays ok
    once, no stage node.sh ran changes, and the failure is train's (the stage the recipe's
    code runs in)."""
    nonce = "ab" * 16
    now = 1_800_000_000.0

    def marker(stage: str, event: str, t: float, status: str = "", n: str = "") -> bytes:
        words = f"stage={stage} event={event}" + (f" status={status}" if status else "")
        return f"##reproduce {words} t={t:.3f}{f' n={n}' if n else ''}\n".encode()

    real = [
        f"##reproduce nonce={nonce}\n".encode(),
        marker("preflight", "start", now, n=nonce),
        marker("preflight", "end", now + 1, "ok", n=nonce),
        marker("convert", "start", now + 2, n=nonce),
        marker("convert", "end", now + 3, "ok", n=nonce),
        marker("ray", "start", now + 4),
        marker("ray", "end", now + 5, "ok"),
        marker("train", "start", now + 6),
        marker("train", "end", now + 7, "ok"),
        marker("train", "start", now + 8),
        marker("train", "end", now + 9, "ok"),
        marker("train", "start", now + 10),
        b"step line\n",
        marker("train", "end", now + 20, "failed"),
    ]
    forged = [(line + "\n").encode() for line in _container_forgeries(now + 11)]
    first_train = 7
    for at in range(first_train + 1, len(real) + 1):
        for line in forged:
            data = b"".join(real[:at]) + line + b"".join(real[at:])
            timeline = Timeline()
            splitter = LogSplitter(tmp_path / f"logs-{at}", timeline)
            splitter.logs.mkdir(exist_ok=True)
            splitter.append(data)
            splitter.close()
            seen = [(s.name, s.status) for s in timeline.stages]
            assert seen[:3] == [("preflight", "ok"), ("convert", "ok"), ("ray", "ok")], (at, line)
            assert all(name == "train" for name, _ in seen[3:]), (at, line, seen)
            assert ("train", "failed") in seen[3:], (at, line, seen)
            for old in splitter.logs.glob("*.log"):
                old.unlink()


def test_a_reader_resuming_mid_log_keeps_the_container_order():
    """`status` reads the node's log from where the run directory's copy ends: the gate goes on
    from the timeline the follower built, so the container's next end counts and a forged
    `ray` does not."""
    gate = MarkerGate()
    gate.marker(b"##reproduce nonce=" + b"cd" * 16)
    gate.resume(
        [
            StageTimes("preflight", 10.0, 11.0, "ok"),
            StageTimes("ray", 12.0, 13.0, "ok"),
            StageTimes("train", 14.0, None, "running"),
        ]
    )
    assert gate.marker(b"##reproduce stage=ray event=start t=15.0") is None
    assert gate.marker(b"##reproduce stage=train event=end status=ok t=13.5") is None
    assert gate.marker(b"##reproduce stage=train event=end status=failed rc=1 t=16.0")
