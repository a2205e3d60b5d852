"""Directories to attest, made the way the launcher makes them, and keys to sign them with.

`real_run` drives the real runner (`Runner.execute`, the seed's Plan, `--cluster local`) over a
node script that prints the stage markers, writes the node's result files in the shapes
scripts/preflight.py, node.sh's image stage and stack_probe.py give, and runs the stand-in miles
as its train stage: the run directory (logs split by stage, timeline, collected results, run.json,
measure.json, result.yaml, verdict.json, report.html) is the runner's own. `measured_out` is a
`reproduce measure LOG --out DIR` directory, made by the CLI.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from support.cli import completed_here
from support.measure import REPO, SEED, STANDIN, seed_raw, standin_words, step_times_for_tps
from support.nodescript import job

CLAIM = seed_raw()["result"]["tokens_per_s_per_gpu"]
IMAGE = "radixark/miles@sha256:45ae7833f97a01369dbd8f336784830a87d94587bc010c7b8065291cc15cd7ca"


def cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`reproduce ARGS` in this process (support.cli.completed_here): attest, verify, keygen and
    measure read files and print; none of them is about the interpreter's start-up or signals."""
    return completed_here(*args, env=env, cwd=REPO)


def keypair(where: Path, name: str = "key") -> tuple[Path, Path]:
    """A fresh ed25519 pair made by `reproduce keygen` (private, .pub)."""
    proc = cli("keygen", where / name)
    assert proc.returncode == 0, proc.stderr
    return where / name, where / f"{name}.pub"


def _gpu_report(n: int) -> dict:
    return {
        "schema": 1,
        "ok": True,
        "host": "gpu-host-0",
        "gpus": [
            {
                "index": str(i),
                "name": "NVIDIA H200",
                "uuid": f"GPU-c2209cba-c99e-aef0-bfc4-8b6a6ac963f{i}",
                "serial": f"165242300{i:04d}",
                "pci.bus_id": f"00000000:{i:02X}:00.0",
            }
            for i in range(n)
        ],
        "checks": [{"name": "driver_version", "value": "580.159.04", "ok": True}],
    }


def _node_body(step_time_s: float) -> str:
    q = shlex.quote
    argv = standin_words(seed_raw(), 20)
    image = {
        "image": IMAGE,
        "digest": IMAGE.split("@")[1],
        "id": "sha256:" + "ab" * 32,
        "repo_digests": [IMAGE],
    }
    return f"""
_mark preflight start
printf '%s\\n' {q(json.dumps({"schema": 1, "ok": True, "host": "gpu-host-0"}))} > "$NODE_RUN_DIR/preflight.json"
echo host preflight ok
_mark preflight end ok
_mark image start
printf '%s\\n' {q(json.dumps(image))} > "$NODE_RUN_DIR/image.json"
_mark image end ok
_mark preflight-gpu start
printf '%s\\n' {q(json.dumps(_gpu_report(8)))} > "$NODE_RUN_DIR/preflight-gpu.json"
_mark preflight-gpu end ok
_mark stack start
printf '%s\\n' {q(json.dumps({"schema": 1, "policy": "fail", "ok": True, "checks": [{"name": "torch", "value": "2.11.0", "ok": True}]}))} > "$NODE_RUN_DIR/stack.json"
_mark stack end ok
_mark train start
(cd {q(str(STANDIN))} && STANDIN_START_EPOCH=1792576800 STANDIN_STEP_TIME_S={step_time_s} {q(sys.executable)} train.py {argv})
_mark train end ok
"""


def real_run(runs_root: Path, node_root: Path, *, tps: float = CLAIM) -> Path:
    """A run directory made by the real runner on this host, measured and judged."""
    from launcher.clusters.local import LocalCluster
    from launcher.runner.runner import Runner

    rd, plan = job(runs_root, node_root, _node_body(step_times_for_tps(tps)))
    rd.write_inputs(
        recipe_text=SEED.read_text(),
        profile=plan.profile.path.read_text(),
        plan=plan.to_dict(),
        node_script=plan.node_script,
    )
    scripts = node_root.parent / "scripts"
    scripts.mkdir(exist_ok=True)
    outcome = Runner(scripts_dir=scripts, poll_s=0.05, measure=True).execute(
        plan, rd, LocalCluster()
    )
    assert outcome.state == "done", outcome
    from launcher.pages import write_run_page

    write_run_page(rd.path)
    return rd.path


def measured_out(where: Path, *, tps: float = CLAIM) -> Path:
    """`reproduce measure LOG --recipe SEED --out DIR` on a stand-in log: DIR."""
    from support.measure import run_standin

    log = where / "logs" / "train.log"
    run_standin(log, steps=20, step_time_s=step_times_for_tps(tps))
    out = where / "measured"
    proc = cli("measure", log, "--recipe", SEED, "--out", out)
    assert proc.returncode in (0, 1), proc.stderr
    return out
