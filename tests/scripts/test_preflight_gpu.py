"""The GPU preflight for real, on this machine's NVIDIA GPUs (marked `gpu`; skipped without them).

Runs scripts/preflight.py as the launcher does (a subprocess, --json) and reads its report with
launcher.plan.preflight.parse_report: a healthy node passes every check with real figures, and a node
held to an impossible threshold fails and says which check.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from support.paths import REPO

from launcher.plan.preflight import parse_report

SCRIPT = REPO / "scripts" / "preflight.py"


def _gpus() -> list[str]:
    """GPU names nvidia-smi lists, when PyTorch in this Python sees CUDA too; else []."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    names = [line.strip() for line in out.splitlines() if line.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return names[: torch.cuda.device_count()] if visible else names


GPUS = _gpus()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not GPUS, reason="needs NVIDIA GPUs with PyTorch (nvidia-smi and torch.cuda)"
    ),
]


def _gpu_type() -> str:
    name = GPUS[0].split()
    return name[1] if len(name) > 1 and name[0] == "NVIDIA" else name[0]


def _run(*extra: str) -> tuple[int, str]:
    argv = [
        sys.executable,
        str(SCRIPT),
        "--json",
        "--gpu-type",
        _gpu_type(),
        "--gpus",
        str(len(GPUS)),
        "--disk-path",
        "/tmp",
        "--disk-min-gb",
        "1",
        *extra,
    ]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout


def test_preflight_passes_on_a_healthy_gpu_node() -> None:
    rc, out = _run()
    report = parse_report(out)
    assert report.ok, report.summary()
    assert rc == 0
    by_name = {c.name: c for c in report.checks}
    assert by_name["gpu_count"].value == len(GPUS)
    for name in ("matmul_bf16", "copy_bandwidth"):
        per_gpu = by_name[name].detail["per_gpu"]
        assert len(per_gpu) == len(GPUS) and all(v > 0 for v in per_gpu)
    if len(GPUS) > 1:
        ar = by_name["allreduce_busbw"].detail
        assert ar["correct"] and ar["world"] == len(GPUS)
        assert [s["bytes"] for s in ar["sizes"]] == sorted(s["bytes"] for s in ar["sizes"])
    else:
        assert "allreduce_busbw" not in by_name
    assert report.raw["environment"]["NCCL_NVLS_ENABLE"] == "0"


def test_preflight_fails_and_names_the_check_below_threshold() -> None:
    rc, out = _run("--threshold", "matmul_bf16_tflops=100000")
    report = parse_report(out)
    assert rc == 1 and not report.ok
    assert [c.name for c in report.failures()] == ["matmul_bf16"]
    assert "matmul_bf16" in report.summary()


def test_preflight_gpu_worker_error_is_a_failed_check_not_a_traceback() -> None:
    rc, out = _run("--copy-gib", "1000")  # more than any GPU has: every worker fails its copy
    report = parse_report(out)
    assert rc == 1
    failed = {c.name: c for c in report.failures()}
    assert "copy_bandwidth" in failed and "OutOfMemoryError" in failed["copy_bandwidth"].warning
    assert "Traceback" not in out
