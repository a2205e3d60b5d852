"""How a failed node script ends for the user: a node that fails the preflight is an infrastructure
failure (exit 3) that says what was measured; a failed training is measured and judged "failed"
(exit 1); a failed download is exit 3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.nodescript import job
from support.paths import TESTS

from launcher.clusters.local import LocalCluster
from launcher.errors import CheckFailed, InfraError
from launcher.runner.runner import Runner

FAILED_PREFLIGHT = {
    "ok": False,
    "checks": [
        {"name": "gpu_count", "value": 7, "expected": "8", "ok": False},
        {
            "name": "matmul_bf16_tflops",
            "value": 512.3,
            "unit": "TFLOP/s",
            "expected": ">= 680",
            "ok": False,
        },
        {"name": "driver", "value": "580.159.04", "expected": ">= 580.65.06", "ok": True},
    ],
}


def _execute(tmp_path: Path, body: str):
    """The seed's Plan running `body`, judged as a real run is (against the seed's claim)."""
    rd, plan = job(tmp_path / "runs", tmp_path / "node", body, slug="test/failures")
    scripts = tmp_path / "scripts"
    scripts.mkdir(exist_ok=True)
    runner = Runner(scripts_dir=scripts, poll_s=0.05)
    return rd, lambda: runner.execute(plan, rd, LocalCluster())


def test_failed_preflight_is_exit_3_naming_each_failed_check(tmp_path: Path) -> None:
    report = json.dumps(FAILED_PREFLIGHT).replace("'", "'\\''")
    body = f"_mark preflight start; echo '{report}' > \"$NODE_RUN_DIR/preflight.json\"; exit 1\n"
    rd, run = _execute(tmp_path, body)
    with pytest.raises(InfraError) as err:  # the node is unfit: fewer GPUs than the recipe needs
        run()
    message = str(err.value)
    assert err.value.exit_code == 3
    assert "gpu_count: 7 (expected 8)" in message and "matmul_bf16_tflops: 512.3" in message
    assert "driver" not in message.split("\n")[0]  # only the failed checks are named
    assert json.loads((rd.path / "preflight.json").read_text()) == FAILED_PREFLIGHT
    assert not (rd.path / "verdict.json").exists()  # nothing trained, nothing judged


def test_failed_training_is_measured_and_judged_failed(tmp_path: Path) -> None:
    standin = TESTS / "standin_miles" / "train.py"
    body = f"_mark train start; STANDIN_FAIL_AT=8 python3 {standin} --num-rollout 20 --global-batch-size 128\n"
    rd, run = _execute(tmp_path, body)
    with pytest.raises(CheckFailed) as err:
        run()
    assert err.value.exit_code == 1 and "stage train" in str(err.value)
    verdict = json.loads((rd.path / "verdict.json").read_text())
    assert verdict["status"] == "failed"
    assert (rd.path / "steps.jsonl").read_text().count(
        "\n"
    ) >= 5  # the steps before the crash are kept


def test_failed_download_is_an_infrastructure_error(tmp_path: Path) -> None:
    rd, run = _execute(tmp_path, '_mark assets start; echo "HTTP 503 from the hub" >&2; exit 3\n')
    with pytest.raises(InfraError) as err:
        run()
    assert (
        err.value.exit_code == 3
        and "stage assets" in str(err.value)
        and "HTTP 503" in str(err.value)
    )
