"""The GPU preflight's node script on CPU: parsing real nvidia-smi output, thresholds, verdicts, and
failing cleanly where there is no GPU or no PyTorch (as on this machine).

Fixtures under tests/data/preflight/ were captured on the device machines (1 and 2 H200s).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO, TESTS

from launcher.plan.preflight import parse_report

ROOT = REPO
SCRIPT = ROOT / "scripts" / "preflight.py"
DATA = TESTS / "data" / "preflight"


def _load_script():
    spec = importlib.util.spec_from_file_location("preflight_node_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    saved = dict(os.environ)
    try:
        spec.loader.exec_module(module)
    finally:  # importing forces the multicast switches off: keep this test process as it was
        os.environ.clear()
        os.environ.update(saved)
    return module


pf = _load_script()
TABLE = pf.load_thresholds()


def fixture(name: str) -> str:
    return (DATA / name).read_text()


def gpu_rows(n: int) -> list[dict[str, str]]:
    return pf.parse_csv_rows(fixture(f"h200x{n}_query_gpu.csv"), pf.GPU_FIELDS)


def health_rows(n: int) -> list[dict[str, str]]:
    return pf.parse_csv_rows(fixture(f"h200x{n}_query_health.csv"), ("index",) + pf.HEALTH_FIELDS)


# ---- nvidia-smi parsing on captured output -------------------------------------------------------


def test_preflight_parses_captured_gpu_query() -> None:
    rows = gpu_rows(2)
    assert [r["index"] for r in rows] == ["0", "1"]
    assert {r["name"] for r in rows} == {"NVIDIA H200"}
    assert pf.check_gpu_count(rows, 2).ok
    assert pf.check_gpu_model(rows, "H200").ok
    mem = pf.check_gpu_memory(rows, 141, 0.95)
    assert mem.ok and mem.value == pytest.approx(140.4, abs=0.1)


def test_preflight_gpu_count_model_memory_fail_against_another_recipe() -> None:
    rows = gpu_rows(2)
    count = pf.check_gpu_count(rows, 8)
    assert not count.ok and count.value == 2 and count.expected == "== 8"
    assert not pf.check_gpu_model(rows, "H100").ok
    assert not pf.check_gpu_model(rows, "H20").ok  # no prefix match: an H200 is not an H20
    assert not pf.check_gpu_memory(rows, 192, 0.95).ok


def test_preflight_parses_topology_with_terminal_escapes_and_judges_nvlink() -> None:
    cells = pf.parse_topo(fixture("h200x2_topo.txt"))
    assert cells == {(0, 1): "NV18", (1, 0): "NV18"}
    assert pf.check_nvlink(cells, [0, 1], 18).ok
    assert not pf.check_nvlink(cells, [0, 1], 24).ok
    one = pf.check_nvlink(pf.parse_topo(fixture("h200x1_topo.txt")), [0], 18)
    assert one.ok and one.value == "single GPU"


def test_preflight_nvlink_fails_naming_a_pair_without_nvlink() -> None:
    topo = (
        "\tGPU0\tGPU1\tGPU2\tCPU Affinity\n"
        "GPU0\t X \tNV18\tSYS\t0-47\n"
        "GPU1\tNV18\t X \tNV18\t0-47\n"
        "GPU2\tSYS\tNV18\t X \t0-47\n"
    )
    check = pf.check_nvlink(pf.parse_topo(topo), [0, 1, 2], 18)
    assert not check.ok
    assert "GPU0-GPU2: SYS" in check.value


def test_preflight_driver_and_cuda_versions_compare_numerically() -> None:
    rows = gpu_rows(1)
    assert pf.check_driver(rows, "580.65.06").ok  # 159 > 65, though "1" < "6" as text
    assert not pf.check_driver(rows, "590.10").ok
    cuda = pf.parse_cuda_version(fixture("h200x1_smi.txt"))
    assert cuda == "13.0"
    assert pf.check_cuda(cuda, "13.0").ok
    assert pf.check_cuda(cuda, "12.8").ok
    assert not pf.check_cuda(cuda, "13.1").ok
    assert not pf.check_cuda(None, "13.0").ok


def test_preflight_ecc_passes_on_captured_health_and_fails_on_errors() -> None:
    assert pf.check_ecc(health_rows(2)).ok
    bad = [dict(r) for r in health_rows(2)]
    bad[1]["ecc.errors.uncorrected.volatile.total"] = "3"
    check = pf.check_ecc(bad)
    assert not check.ok and "GPU1: 3 uncorrected" in check.value
    pending = [dict(r) for r in health_rows(1)]
    pending[0]["remapped_rows.pending"] = "Yes"
    assert not pf.check_ecc(pending).ok


def test_preflight_ecc_not_readable_is_a_warning_not_a_failure() -> None:
    rows = [dict(r) for r in health_rows(1)]
    rows[0]["ecc.errors.uncorrected.volatile.total"] = "[N/A]"
    check = pf.check_ecc(rows)
    assert check.ok and "not readable" in check.warning


def test_preflight_xid_critical_fails_other_codes_warn_unreadable_warns() -> None:
    log = (
        "[  12.1] NVRM: loading NVIDIA UNIX Open Kernel Module\n"
        "[ 801.5] NVRM: Xid (PCI:0000:00:06): 13, pid=4242, name=python3, Graphics Exception\n"
        "[ 905.0] NVRM: Xid (PCI:0000:00:07): 79, pid=0, GPU has fallen off the bus.\n"
    )
    xids = pf.parse_xids(log)
    assert [(x["code"], x["device"]) for x in xids] == [
        (13, "PCI:0000:00:06"),
        (79, "PCI:0000:00:07"),
    ]
    critical = set(TABLE["xid_critical"]["codes"])
    assert not pf.check_xid(xids, "dmesg", critical).ok
    benign = pf.check_xid(xids[:1], "dmesg", critical)
    assert benign.ok and "13" in benign.warning
    unreadable = pf.check_xid(None, "dmesg: Operation not permitted", critical)
    assert (
        unreadable.ok and unreadable.value == "not readable" and "not checked" in unreadable.warning
    )
    assert pf.parse_xids(fixture("h200x1_device_log.txt")) == []


def test_preflight_visible_devices_filter_by_index_and_uuid() -> None:
    rows = gpu_rows(2)
    assert [r["index"] for r in pf.visible_filter(rows, "1")] == ["1"]
    assert [r["index"] for r in pf.visible_filter(rows, "GPU-59022ae6")] == ["1"]
    assert [r["index"] for r in pf.visible_filter(rows, "1,0")] == ["1", "0"]
    assert pf.visible_filter(rows, None) == rows


# ---- EFA and disk --------------------------------------------------------------------------------


def test_preflight_efa_retries_until_the_late_devices_appear() -> None:
    counts, sleeps = iter([0, 8, 16]), []
    count, attempts = pf.probe_efa(16, 3, 5.0, counter=lambda: next(counts), sleep=sleeps.append)
    assert (count, attempts, sleeps) == (16, 3, [5.0, 5.0])
    check = pf.check_efa(count, 16, attempts)
    assert check.ok


def test_preflight_efa_fails_after_retries_and_expects_none_when_instance_unknown() -> None:
    count, attempts = pf.probe_efa(16, 3, 0.0, counter=lambda: 8, sleep=lambda s: None)
    check = pf.check_efa(count, 16, attempts)
    assert not check.ok and check.value == 8 and attempts == 3
    none = pf.check_efa(0, None, 1)
    assert none.ok and none.expected.startswith("none expected")


def test_preflight_efa_counts_sysfs_devices(tmp_path: Path) -> None:
    for name in ("rdmap16s27", "rdmap17s27"):
        (tmp_path / name).mkdir()
    assert pf.count_efa(tmp_path) == 2
    assert pf.count_efa(tmp_path / "absent") == 0


def test_preflight_disk_measures_the_nearest_existing_parent(tmp_path: Path) -> None:
    check = pf.check_disk(str(tmp_path / "not" / "yet"), 0.001)
    assert check.ok and check.value > 0 and "does not exist yet" in check.warning
    assert not pf.check_disk(str(tmp_path), 1e12).ok


# ---- thresholds ----------------------------------------------------------------------------------


def test_preflight_thresholds_per_gpu_type_and_count_with_overrides() -> None:
    two = pf.resolve_threshold(TABLE, "allreduce_busbw_gbps", "H200", {}, 2)
    eight = pf.resolve_threshold(TABLE, "allreduce_busbw_gbps", "h200", {}, 8)
    assert two.min and not two.provisional
    assert eight.min is not None
    assert pf.resolve_threshold(TABLE, "allreduce_busbw_gbps", "H200", {}, 3).min is None
    over = pf.resolve_threshold(TABLE, "matmul_bf16_tflops", "H200", {"matmul_bf16_tflops": 500.0})
    assert over.min == 500.0 and "override" in over.source
    assert pf.resolve_threshold(TABLE, "matmul_bf16_tflops", "B200", {}).min is None
    assert pf.resolve_threshold(TABLE, "memory_fraction_min", "B200", {}).min == 0.95  # defaults


def test_preflight_threshold_overrides_reject_unknown_names_and_non_numbers() -> None:
    known = pf.threshold_names(TABLE)
    assert pf.parse_threshold_overrides(["copy_tbps=4", "matmul_bf16_tflops=700"], known) == {
        "copy_tbps": 4.0,
        "matmul_bf16_tflops": 700.0,
    }
    with pytest.raises(ValueError, match="NAME=VALUE"):
        pf.parse_threshold_overrides(["matmul=700"], known)
    with pytest.raises(ValueError, match="not a number"):
        pf.parse_threshold_overrides(["copy_tbps=fast"], known)


def test_preflight_thresholds_table_is_consistent() -> None:
    names = pf.threshold_names(TABLE)
    for gpu, entries in TABLE["gpu_types"].items():
        for name, entry in entries.items():
            assert name in names, (gpu, name)
            leaves = entry.values() if "min" not in entry else [entry]
            for leaf in leaves:
                assert isinstance(leaf["min"], (int, float)) and leaf["source"], (gpu, name)


# ---- benchmark verdicts --------------------------------------------------------------------------


def _results(
    world: int, busbw: float = 340.0, tflops: float = 780.0, correct: bool = True
) -> list[dict]:
    ar = {
        "world": world,
        "correct": correct,
        "sizes": [
            {"bytes": 64 << 20, "busbw_gbps": 250.0},
            {"bytes": 4 << 30, "busbw_gbps": busbw},
        ],
    }
    out = []
    for i in range(world):
        r = {"local_rank": i, "matmul_bf16_tflops": tflops - i, "copy_tbps": 4.2}
        if world > 1:
            r["allreduce_node"] = ar
        out.append(r)
    return out


def test_preflight_bench_verdicts_use_the_slowest_gpu_and_largest_size() -> None:
    checks = {c.name: c for c in pf.bench_checks(_results(2), TABLE, "H200", {}, 1)}
    assert checks["matmul_bf16"].value == 779.0 and checks["matmul_bf16"].ok
    assert checks["matmul_bf16"].detail["per_gpu"] == [780.0, 779.0]
    assert checks["allreduce_busbw"].value == 340.0 and checks["allreduce_busbw"].ok
    assert "4 GiB, 2 GPUs" in checks["allreduce_busbw"].expected
    slow = {
        c.name: c
        for c in pf.bench_checks(_results(2, busbw=120.0, tflops=500.0), TABLE, "H200", {}, 1)
    }
    assert not slow["matmul_bf16"].ok and not slow["allreduce_busbw"].ok
    assert slow["copy_bandwidth"].ok


def test_preflight_bench_single_gpu_has_no_allreduce_and_multinode_adds_one() -> None:
    assert "allreduce_busbw" not in {
        c.name for c in pf.bench_checks(_results(1), TABLE, "H200", {}, 1)
    }
    res = _results(1)
    res[0]["allreduce_multinode"] = {
        "world": 2,
        "correct": True,
        "sizes": [{"bytes": 4 << 30, "busbw_gbps": 341.6}],
    }
    names = [c.name for c in pf.bench_checks(res, TABLE, "H200", {}, 2)]
    assert names == ["matmul_bf16", "copy_bandwidth", "allreduce_multinode_busbw"]


def test_preflight_bench_worker_error_or_wrong_sum_fails() -> None:
    res = _results(2)
    res[1] = {
        "local_rank": 1,
        "error": "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    }
    checks = {c.name: c for c in pf.bench_checks(res, TABLE, "H200", {}, 1)}
    assert not checks["matmul_bf16"].ok and "uncorrectable ECC" in checks["matmul_bf16"].warning
    wrong = {c.name: c for c in pf.bench_checks(_results(2, correct=False), TABLE, "H200", {}, 1)}
    assert not wrong["allreduce_busbw"].ok and "wrong sum" in wrong["allreduce_busbw"].warning


def test_preflight_busbw_is_the_nccl_tests_factor() -> None:
    assert pf.busbw_factor(2) == 1.0
    assert pf.busbw_factor(8) == pytest.approx(1.75)


def test_preflight_unknown_gpu_type_passes_with_a_warning_and_keeps_the_figure() -> None:
    checks = {c.name: c for c in pf.bench_checks(_results(1), TABLE, "B200", {}, 1)}
    assert checks["matmul_bf16"].ok and checks["matmul_bf16"].value == 780.0
    assert "no threshold" in checks["matmul_bf16"].warning


# ---- the table and the environment ---------------------------------------------------------------


def test_preflight_terminal_table_from_a_real_report() -> None:
    report = json.loads(fixture("h200x2_report.json"))
    text = pf.format_table(report)
    assert "allreduce_busbw" in text and "preflight PASSED" in text
    report["checks"][0]["ok"] = False
    assert "preflight FAILED: gpu_count" in pf.format_table(report)


def test_preflight_force_multicast_off_overrides_values_that_turn_it_on() -> None:
    env = {"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0", "OTHER": "x"}
    pf.force_multicast_off(env)
    assert env == {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
        "OTHER": "x",
    }


# ---- end to end on this machine (no GPU, no torch) -----------------------------------------------


def _run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env
    )


def _bare_node_env(tmp_path: Path) -> dict[str, str]:
    """No nvidia-smi on PATH and a `torch` that cannot be imported, even on a GPU machine."""
    (tmp_path / "empty_bin").mkdir()
    (tmp_path / "no_torch" / "torch").mkdir(parents=True)
    (tmp_path / "no_torch" / "torch" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\")\n"
    )
    return {
        **os.environ,
        "PATH": str(tmp_path / "empty_bin"),
        "PYTHONPATH": str(tmp_path / "no_torch"),
    }


def test_preflight_without_gpu_or_torch_fails_cleanly_as_json(tmp_path: Path) -> None:
    p = _run_script("--json", "--gpu-type", "H200", "--gpus", "8", env=_bare_node_env(tmp_path))
    assert p.returncode == 1
    assert "Traceback" not in p.stderr + p.stdout
    report = parse_report(p.stdout)
    failed = {c.name: c for c in report.failures()}
    assert set(failed) == {"nvidia_smi", "torch"}
    assert "no NVIDIA GPU" in failed["nvidia_smi"].warning
    assert "PyTorch is not importable" in failed["torch"].warning


def test_preflight_without_gpu_prints_a_table_naming_the_failures(tmp_path: Path) -> None:
    p = _run_script("--gpu-type", "H200", env=_bare_node_env(tmp_path))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "preflight FAILED: nvidia_smi, torch" in p.stdout


def test_preflight_bad_threshold_is_a_usage_error() -> None:
    p = _run_script("--threshold", "matmul=1")
    assert p.returncode == 2 and "matmul_bf16_tflops" in p.stderr and "Traceback" not in p.stderr


def _fake_smi(tmp_path: Path, n: int) -> Path:
    """An `nvidia-smi` on PATH that answers with the outputs captured on the n-GPU device."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"d = {str(DATA)!r} + '/h200x{n}_'\n"
        "a = ' '.join(sys.argv[1:])\n"
        "name = ('smi.txt' if not a else 'topo.txt' if a == 'topo -m' else\n"
        "        'query_gpu.csv' if a.startswith('--query-gpu=index,uuid') else\n"
        "        'query_health.csv' if a.startswith('--query-gpu=index,ecc') else None)\n"
        "if name is None: sys.exit('unexpected arguments: ' + a)\n"
        "sys.stdout.write(open(d + name).read())\n"
    )
    smi.chmod(0o755)
    return bin_dir


def test_preflight_end_to_end_with_captured_nvidia_smi_judges_the_node(tmp_path: Path) -> None:
    bin_dir = _fake_smi(tmp_path, 2)
    env = {
        **_bare_node_env(tmp_path),
        "PATH": str(bin_dir),
        "NCCL_NVLS_ENABLE": "1",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0",
        "NVSHMEM_DISABLE_NVLS": "0",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    p = _run_script(
        "--json",
        "--gpu-type",
        "H200",
        "--gpus",
        "8",
        "--gpu-memory-gb",
        "141",
        "--driver-min",
        "580.65.06",
        "--cuda",
        "13.0",
        "--disk-path",
        str(tmp_path),
        "--efa-expected",
        "16",
        "--efa-retries",
        "2",
        "--efa-retry-wait",
        "0",
        env=env,
    )
    report = parse_report(p.stdout)
    by_name = {c.name: c for c in report.checks}
    assert p.returncode == 1
    assert by_name["gpu_count"].value == 2 and not by_name["gpu_count"].ok  # recipe wants 8
    for name in (
        "gpu_model",
        "gpu_memory",
        "driver_version",
        "cuda_version",
        "ecc",
        "nvlink",
        "disk",
    ):
        assert by_name[name].ok, by_name[name]
    assert not by_name["efa"].ok and by_name["efa"].detail == {"attempts": 2}
    for key, off in pf.MULTICAST_OFF.items():
        assert report.raw["environment"][key] == off


def test_preflight_host_pass_needs_no_torch(tmp_path: Path) -> None:
    """--no-bench is the pass on the host before the image is pulled: a DLAMI host has the driver but
    no PyTorch, and a fit node must pass there (torch is checked in the image)."""
    bin_dir = _fake_smi(tmp_path, 2)
    env = {**_bare_node_env(tmp_path), "PATH": str(bin_dir)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    p = _run_script(
        "--json",
        "--no-bench",
        "--gpu-type",
        "H200",
        "--gpus",
        "2",
        "--gpu-memory-gb",
        "141",
        "--driver-min",
        "580.65.06",
        "--cuda",
        "13.0",
        "--disk-path",
        str(tmp_path),
        env=env,
    )
    report = parse_report(p.stdout)
    assert p.returncode == 0, [c for c in report.checks if not c.ok]
    assert report.ok and "torch" not in {c.name for c in report.checks}


def test_gpu_serials_are_read_where_the_driver_gives_them_and_null_where_not(monkeypatch) -> None:
    """An attestation names the GPUs a run used (UUID and board serial): the serial comes from its
    own nvidia-smi query, [N/A] is null, and a driver that refuses the field leaves every serial
    null without failing the preflight."""
    answers = {"--query-gpu=index,serial": "0, 1652423019876\n1, [N/A]\n"}

    def fake(argv, timeout=60.0):
        out = answers.get(argv[1]) if len(argv) > 1 else None
        return (0, out, "") if out is not None else (6, "", "Field 'serial' is not a valid field")

    # smi_serials asks through run_cmd of its own module (preflight_probes.py): patch it there
    monkeypatch.setattr(sys.modules[pf.smi_serials.__module__], "run_cmd", fake)
    assert pf.smi_serials() == {"0": "1652423019876", "1": None}
    answers.clear()
    assert pf.smi_serials() == {}
