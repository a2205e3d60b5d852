"""The host side of the GPU preflight: the command line the launcher builds (accepted by the node
script itself), reading the report out of mixed output, and stopping before training on a failure.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shlex
import sys

import pytest
from rich.console import Console
from support.paths import REPO, SEED, TESTS

from launcher.errors import BadInput, InfraError
from launcher.inputs.recipe import load_recipe
from launcher.plan.preflight import (
    driver_min_for_cuda,
    expected_efa_devices,
    parse_report,
    preflight_argv,
    preflight_command,
    threshold_names,
)

ROOT = REPO
DATA = TESTS / "data" / "preflight"


def _node_parser():
    spec = importlib.util.spec_from_file_location(
        "preflight_node_script_l", ROOT / "scripts" / "preflight.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    saved = dict(os.environ)
    try:
        spec.loader.exec_module(module)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return module


NODE = _node_parser()


def _seed_argv(**over) -> list[str]:
    recipe = load_recipe(SEED)
    kw = {
        "gpu_type": recipe.gpu_type,
        "gpus_per_node": recipe.gpus_per_node,
        "gpu_memory_gb": recipe.gpu_memory_gb,
        "driver_min": driver_min_for_cuda(recipe.cuda),
        "cuda": recipe.cuda,
        "efa_expected": expected_efa_devices(recipe.instance_type),
        "disk_path": "/opt/dlami/nvme/reproduce cache",
        "disk_min_gb": 400,
        "thresholds": {"matmul_bf16_tflops": 700, "allreduce_busbw_gbps": 310.5},
    }
    kw.update(over)
    return preflight_argv(**kw)


def test_preflight_argv_for_the_seed_recipe_is_what_the_node_script_parses() -> None:
    argv = _seed_argv()
    assert argv[0] == "--json"
    args = NODE.build_parser().parse_args(shlex.split(shlex.join(argv)))  # quoted, as in node.sh
    assert (args.gpu_type, args.gpus, args.gpu_memory_gb) == ("H200", 8, 141)
    assert (args.cuda, args.driver_min, args.efa_expected) == ("13.0", "580.65.06", 16)
    assert args.disk_path == "/opt/dlami/nvme/reproduce cache" and args.disk_min_gb == 400
    assert NODE.parse_threshold_overrides(
        args.threshold, NODE.threshold_names(NODE.load_thresholds())
    ) == {"allreduce_busbw_gbps": 310.5, "matmul_bf16_tflops": 700.0}
    assert args.nnodes == 1 and args.master_addr is None


def test_preflight_command_quotes_every_part() -> None:
    line = preflight_command("/opt/reproduce/scripts/", _seed_argv())
    parts = shlex.split(line)
    assert parts[:3] == ["python3", "/opt/reproduce/scripts/preflight.py", "--json"]
    assert "'/opt/dlami/nvme/reproduce cache'" in line
    assert parts[1 + parts.index("--disk-path")] == "/opt/dlami/nvme/reproduce cache"


def test_preflight_argv_multinode_carries_the_rendezvous() -> None:
    argv = _seed_argv(nnodes=2, node_rank=1, master_addr="10.0.0.5", master_port=29510)
    args = NODE.build_parser().parse_args(argv)
    assert (args.nnodes, args.node_rank, args.master_addr, args.master_port) == (
        2,
        1,
        "10.0.0.5",
        29510,
    )
    with pytest.raises(BadInput):
        _seed_argv(nnodes=2)


def test_preflight_argv_omits_what_is_unknown() -> None:
    argv = _seed_argv(
        gpu_memory_gb=None, driver_min=None, cuda=None, efa_expected=None, thresholds={}
    )
    for flag in ("--gpu-memory-gb", "--driver-min", "--cuda", "--efa-expected", "--threshold"):
        assert flag not in argv


def test_preflight_argv_rejects_an_unknown_threshold_name() -> None:
    with pytest.raises(BadInput) as err:
        _seed_argv(thresholds={"matmul_tflop": 700})
    assert "matmul_tflop" in str(err.value) and "matmul_bf16_tflops" in str(err.value)
    assert err.value.exit_code == 2


def test_preflight_threshold_names_come_from_the_one_table() -> None:
    table = json.loads((ROOT / "scripts" / "preflight_thresholds.json").read_text())
    assert threshold_names() == set(table["names"])


def test_preflight_expected_efa_devices_by_instance_type() -> None:
    assert expected_efa_devices("p5en.48xlarge") == 16
    assert expected_efa_devices("p5.48xlarge") == 32
    assert expected_efa_devices("p5e.48xlarge") == 32
    assert expected_efa_devices("g6.xlarge") is None
    assert expected_efa_devices(None) is None


def test_preflight_driver_min_for_cuda() -> None:
    assert driver_min_for_cuda("13.0") == "580.65.06"
    assert driver_min_for_cuda("12.8.1") == "570.26"
    assert driver_min_for_cuda("11.8") is None and driver_min_for_cuda(None) is None


# ---- reading the report --------------------------------------------------------------------------


def test_preflight_report_parsed_from_output_with_other_lines() -> None:
    text = (DATA / "h200x2_report.json").read_text()
    noisy = (
        "vm:1234:1234 [0] NCCL INFO Bootstrap: Using eth0\n{not json\n"
        + text
        + "\nNCCL WARN something\n"
    )
    report = parse_report(noisy)
    assert report.ok and report.failures() == []
    names = [c.name for c in report.checks]
    assert names[:2] == ["gpu_count", "gpu_model"] and names[-1] == "allreduce_busbw"
    ar = next(c for c in report.checks if c.name == "allreduce_busbw")
    assert ar.unit == "GB/s" and ar.value > 0
    assert report.summary().startswith("preflight passed")


def test_preflight_report_missing_is_an_infra_error() -> None:
    with pytest.raises(InfraError) as err:
        parse_report("bash: python3: command not found\n")
    assert "command not found" in str(err.value)


def _failing_report() -> str:
    report = json.loads((DATA / "h200x2_report.json").read_text())
    for c in report["checks"]:
        if c["name"] == "allreduce_busbw":
            c["value"], c["ok"] = 120.5, False
    report["ok"] = False
    return json.dumps(report, indent=1)


def test_preflight_failure_stops_before_training_naming_value_and_expectation() -> None:
    report = parse_report(_failing_report())
    assert not report.ok
    assert [c.name for c in report.failures()] == ["allreduce_busbw"]
    msg = (
        report.summary()
    )  # what the run's error names when the node fails (tests/runner/test_run_failures.py)
    assert "allreduce_busbw: 120.5 GB/s (expected >= 300 GB/s at 4 GiB, 2 GPUs)" in msg
    assert "--skip-preflight" in msg
    assert (
        parse_report((DATA / "h200x2_report.json").read_text())
        .summary()
        .startswith("preflight passed")
    )


def test_preflight_report_not_ok_when_the_top_level_says_so() -> None:
    report = json.loads((DATA / "h200x1_report.json").read_text())
    report["ok"] = False
    assert not parse_report(json.dumps(report)).ok


def test_preflight_renders_a_rich_table_with_failures_and_warnings() -> None:
    report = parse_report((DATA / "h200x2_two_nodes_node0_report.json").read_text())
    console = Console(file=io.StringIO(), width=200, record=True)
    report.render(console)
    text = console.export_text()
    assert "GPU preflight" in text and "matmul_bf16" in text and "pass (warning)" in text
    assert "threshold provisional" in text  # the multi-node threshold is not a measured one
    console = Console(file=io.StringIO(), width=200, record=True)
    parse_report(_failing_report()).render(console)
    assert "FAIL" in console.export_text()
