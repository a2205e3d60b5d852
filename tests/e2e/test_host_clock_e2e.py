"""The host's clock through the whole CLI (`reproduce RECIPE --cluster local`): the real node.sh,
the real stamper (scripts/host_clock.py) on the training container's output, the stand-in miles
in the container. A stand-in that claims faster steps than it paces is judged mismatch (exit 1)
by the host clock check, naming both spans; one that paces what it claims passes that check.

The stand-in's pace and claims are its own test knobs: STANDIN_STEP_TIME_S is what it claims,
STANDIN_SLEEP_S what it really sleeps per step (tests/standin_miles/train.py).

The GPUs at work (check 7) through the same CLI: node.sh's real sampler (scripts/gpu_sampler.py)
on the host meets the stand-in nvidia-smi (tests/standin_gpu: no GPU here), first on the PATH
node.sh inherits, modelling idle GPUs (a mismatch naming the check) or busy ones (it passes).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from support.helpers import assert_log_collected, cli
from support.paths import STANDIN_GPU
from support.plan_env import write_profile, write_recipe

from launcher.plan.protocol import MarkerGate

pytestmark = [pytest.mark.docker]


@pytest.fixture(autouse=True)
def _standin_nvidia_smi(monkeypatch):
    """node.sh runs on this host (--cluster local) with the launcher's environment: the stand-in
    nvidia-smi first on its PATH, its load set per test (STANDIN_GPU_UTIL)."""
    monkeypatch.setenv("PATH", f"{STANDIN_GPU}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_GPU_UTIL", "97")


def _run(
    tmp_path: Path, test_image, container_run_args, claims: float, sleeps: float, util: int = 97
):
    recipe = write_recipe(tmp_path, test_image)
    env = {"STANDIN_STEP_TIME_S": str(claims), "STANDIN_SLEEP_S": str(sleeps)}
    os.environ["STANDIN_GPU_UTIL"] = str(util)  # the host's stand-in nvidia-smi (node.sh's env)
    profile = write_profile(
        tmp_path, {"kind": "local"}, container_run_args, env=env, docker={"host_clock": True}
    )
    runs = tmp_path / "runs"
    result = cli(str(recipe), "--cluster", str(profile), "--runs-dir", str(runs), timeout=400)
    (run_json,) = runs.glob("**/run.json")
    rd = run_json.parent
    assert_log_collected(rd)
    return result, rd


def _clock_reached_node_log(rd: Path) -> None:
    """The stamper's lines are in node.log (and train.log), carrying node.sh's nonce."""
    nonce = MarkerGate.of_log(rd / "logs" / "node.log").nonce
    assert nonce is not None
    train = (rd / "logs" / "train.log").read_text()
    clocks = re.findall(rf"^##reproduce clock t=[0-9]+\.[0-9]{{9}} n={nonce}$", train, re.M)
    assert len(clocks) >= 5, train[:2000]  # steps 0.4 s apart: one every other step or more
    measure = json.loads((rd / "measure.json").read_text())
    assert measure["clock_nonce"] == nonce  # what `verify` re-measures with


def test_a_stand_in_claiming_faster_steps_than_it_paces_is_judged_mismatch(
    test_image, container_run_args, tmp_path
):
    result, rd = _run(tmp_path, test_image, container_run_args, claims=0.02, sleeps=0.4)
    assert result.returncode == 1, result.stderr[-3000:]
    _clock_reached_node_log(rd)
    verdict = json.loads((rd / "verdict.json").read_text())
    assert verdict["status"] == "mismatch", verdict["reasons"]
    (reason,) = [r for r in verdict["reasons"] if r.startswith("host clock:")]
    assert "steps 5 to 19 arrived" in reason and "perf/step_time adds up to 0.280 s" in reason
    assert "verdict: MISMATCH" in result.stderr or "mismatch" in result.stderr.lower()


def test_a_stand_in_pacing_what_it_claims_passes_the_host_clock(
    test_image, container_run_args, tmp_path
):
    result, rd = _run(tmp_path, test_image, container_run_args, claims=0.4, sleeps=0.4)
    _clock_reached_node_log(rd)
    evidence = yaml.safe_load((rd / "result.yaml").read_text())["provenance"]["evidence"]
    assert any(c.startswith("the host's clock: steps 5-19") for c in evidence["checked"])
    assert not [d for d in evidence["disagreements"] if d["check"] == "host clock"]
    assert not evidence["disagreements"]
    verdict = json.loads((rd / "verdict.json").read_text())
    # 0.4 s steps are 47 x the seed's claim, an MFU no chip reaches: never a speed verdict
    assert verdict["status"] == "mismatch", verdict["reasons"]
    assert [r for r in verdict["reasons"] if r.startswith("impossible figure: MFU")]
    assert result.returncode == 1


def test_a_stand_in_whose_gpus_the_host_saw_idle_is_judged_mismatch_naming_the_check(
    test_image, container_run_args, tmp_path
):
    """The lines come at the pace they claim (check 6 passes); the host saw the GPUs at 0%."""
    result, rd = _run(tmp_path, test_image, container_run_args, claims=0.4, sleeps=0.4, util=0)
    assert result.returncode == 1, result.stderr[-3000:]
    assert (rd / "gpu-samples.csv").is_file()  # collected from the node run directory
    verdict = json.loads((rd / "verdict.json").read_text())
    assert verdict["status"] == "mismatch", verdict["reasons"]
    assert not [r for r in verdict["reasons"] if r.startswith("host clock:")]
    busy = [r for r in verdict["reasons"] if r.startswith("gpus busy:")]
    assert len(busy) == 8 and "GPU 0's median utilization.gpu over steps 5 to 19" in busy[0]
    assert "is 0%, under the 50%" in busy[0]


def test_a_stand_in_whose_gpus_the_host_saw_busy_passes_the_check(
    test_image, container_run_args, tmp_path
):
    result, rd = _run(tmp_path, test_image, container_run_args, claims=0.4, sleeps=0.4, util=97)
    evidence = yaml.safe_load((rd / "result.yaml").read_text())["provenance"]["evidence"]
    (seen,) = [c for c in evidence["checked"] if c.startswith("the GPUs at work:")]
    assert "GPU 0 97%" in seen and "GPU 7 97%" in seen
    assert not [d for d in evidence["disagreements"] if d["check"] == "gpus busy"]
    assert not evidence["disagreements"]  # every check of the gate passed, 6 and 7 included
    verdict = json.loads((rd / "verdict.json").read_text())
    # the stand-in's 0.4 s steps are 47 x the claim (MFU about 6): no chip computes that, so
    # never a speed verdict (policy v6), whatever the host saw
    assert verdict["status"] == "mismatch"
    assert [r for r in verdict["reasons"] if r.startswith("impossible figure: MFU")]
    # the host clocked the window and saw the GPUs work: the strongest assurance
    assert verdict["assurance"]["level"] == "host-verified"
