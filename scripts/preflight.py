#!/usr/bin/env python3
"""GPU preflight: is this node fit to run the recipe? Checked before the first training minute.

Runs ON the node (inside the training container, or on the host): standard library plus PyTorch,
never the `launcher` package. Every check reports a measured value, the expected value and
pass/fail; `--json` prints one JSON object, otherwise a terminal table. Exit 0 only when every
check passed, 1 when one failed, 2 on bad arguments. Without nvidia-smi or PyTorch it fails with a
clear check, never a traceback.

Checks: GPU count, model and memory against the recipe's `gpu`; driver and CUDA versions against
the stack; ECC errors and Xid events; NVLink between every GPU pair; EFA devices against the
instance type (retried: p5en's EFA comes up late); free disk; and, one process per GPU, the bf16
matrix-product rate, the device memory copy bandwidth, and the NCCL all-reduce bus bandwidth across
the node's GPUs (and across nodes, given torch.distributed rendezvous settings).

Thresholds come from preflight_thresholds.json beside this file (the one table the launcher reads
too), overridable with `--threshold NAME=VALUE`.

This file parses the arguments, runs the checks in order and prints the report. Its siblings do
one job each: preflight_checks.py the verdicts (report, thresholds, parsers, `check_*`),
preflight_probes.py the questions to the machine (nvidia-smi, kernel log, EFA), preflight_bench.py
the GPU benchmarks. Every public name of theirs stays reachable as `preflight.<name>`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # siblings import by name, also when loaded by path

# NVLink multicast can put a host's GPUs out of service: force it off before torch or NCCL is
# imported or initialised (preflight_bench.py, whose workers start NCCL, holds the switch).
from preflight_bench import MULTICAST_OFF, force_multicast_off  # noqa: E402

force_multicast_off(os.environ)

import argparse  # noqa: E402  (after the environment is fixed, on purpose)
import json  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any  # noqa: E402

from preflight_bench import (  # noqa: E402
    ALLREDUCE_ITERS,
    ALLREDUCE_SIZES,
    ALLREDUCE_WARMUP,
    COPY_BYTES,
    COPY_ITERS,
    COPY_WARMUP,
    GIB,
    MATMUL_ITERS,
    MATMUL_N,
    MATMUL_WARMUP,
    MIB,
    bench_checks,
    bench_worker,
    busbw_factor,
    run_benchmarks,
)
from preflight_checks import (  # noqa: E402
    ANSI_RE,
    NA_VALUES,
    SCHEMA_VERSION,
    THRESHOLDS_FILE,
    XID_RE,
    Check,
    Threshold,
    check_cuda,
    check_disk,
    check_driver,
    check_ecc,
    check_efa,
    check_gpu_count,
    check_gpu_memory,
    check_gpu_model,
    check_min,
    check_nvlink,
    check_xid,
    format_table,
    format_value,
    is_na,
    load_thresholds,
    parse_csv_rows,
    parse_cuda_version,
    parse_threshold_overrides,
    parse_topo,
    parse_xids,
    report_dict,
    resolve_threshold,
    threshold_names,
    version_at_least,
    version_tuple,
    visible_filter,
)
from preflight_probes import (  # noqa: E402
    HEALTH_FIELDS,
    count_efa,
    free_port,
    probe_efa,
    read_kernel_log,
    run_cmd,
    smi_health,
    smi_query,
    smi_serials,
)

# The names tests and other programs reach as preflight.<name>: this file's own and its siblings'.
__all__ = [
    "ALLREDUCE_ITERS",
    "ALLREDUCE_SIZES",
    "ALLREDUCE_WARMUP",
    "ANSI_RE",
    "COPY_BYTES",
    "COPY_ITERS",
    "COPY_WARMUP",
    "GIB",
    "GPU_FIELDS",
    "HEALTH_FIELDS",
    "MATMUL_ITERS",
    "MATMUL_N",
    "MATMUL_WARMUP",
    "MIB",
    "MULTICAST_OFF",
    "NA_VALUES",
    "SCHEMA_VERSION",
    "THRESHOLDS_FILE",
    "XID_RE",
    "Check",
    "Threshold",
    "bench_checks",
    "bench_worker",
    "build_parser",
    "busbw_factor",
    "check_cuda",
    "check_disk",
    "check_driver",
    "check_ecc",
    "check_efa",
    "check_gpu_count",
    "check_gpu_memory",
    "check_gpu_model",
    "check_min",
    "check_nvlink",
    "check_xid",
    "count_efa",
    "force_multicast_off",
    "format_table",
    "format_value",
    "free_port",
    "is_na",
    "load_thresholds",
    "main",
    "parse_csv_rows",
    "parse_cuda_version",
    "parse_threshold_overrides",
    "parse_topo",
    "parse_xids",
    "probe_efa",
    "read_kernel_log",
    "report_dict",
    "resolve_threshold",
    "run_benchmarks",
    "run_cmd",
    "run_preflight",
    "smi_health",
    "smi_query",
    "smi_serials",
    "threshold_names",
    "torch_probe",
    "version_at_least",
    "version_tuple",
    "visible_filter",
]

GPU_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version", "pci.bus_id")


# --------------------------------------------------------------------------------------------
# Main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--gpu-type", default=None, help="the recipe's gpu.type, e.g. H200")
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs this node must have (the recipe's gpu.per_node)",
    )
    p.add_argument("--gpu-memory-gb", type=float, default=None, help="the recipe's gpu.memory_gb")
    p.add_argument(
        "--driver-min", default=None, help="lowest NVIDIA driver version the stack runs on"
    )
    p.add_argument(
        "--cuda", default=None, help="the stack's CUDA version; the driver must support it"
    )
    p.add_argument(
        "--efa-expected",
        type=int,
        default=None,
        help="EFA devices the instance type has (none: not checked)",
    )
    p.add_argument("--efa-retries", type=int, default=3, help="EFA counts to try before failing")
    p.add_argument("--efa-retry-wait", type=float, default=5.0, help="seconds between EFA counts")
    p.add_argument("--disk-path", default="/", help="where the image and assets go")
    p.add_argument("--disk-min-gb", type=float, default=0.0, help="free GB needed at --disk-path")
    p.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a threshold of preflight_thresholds.json (repeatable)",
    )
    p.add_argument(
        "--nnodes", type=int, default=1, help="nodes in the run (all-reduce across them when > 1)"
    )
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument(
        "--master-addr", default=None, help="rendezvous address (node 0); needed when --nnodes > 1"
    )
    p.add_argument(
        "--master-port", type=int, default=None, help="rendezvous port; needed when --nnodes > 1"
    )
    p.add_argument(
        "--no-bench", action="store_true", help="skip the GPU benchmarks (matmul, copy, all-reduce)"
    )
    p.add_argument(
        "--bench-timeout", type=float, default=300.0, help="seconds the GPU benchmarks may take"
    )
    # sizes (defaults keep 8 GPUs under 60 s); smaller ones are for tests only
    p.add_argument("--matmul-n", type=int, default=MATMUL_N, help=argparse.SUPPRESS)
    p.add_argument("--copy-gib", type=float, default=COPY_BYTES / GIB, help=argparse.SUPPRESS)
    p.add_argument(
        "--allreduce-mib",
        type=float,
        nargs="+",
        default=[s / MIB for s in ALLREDUCE_SIZES],
        help=argparse.SUPPRESS,
    )
    return p


def torch_probe() -> tuple[Check, dict[str, Any], int]:
    """Import PyTorch (in this process: no CUDA context) and count the GPUs it sees."""
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - ImportError, or a broken install: a failed check
        return (
            Check(
                "torch",
                None,
                "PyTorch importable, CUDA available",
                False,
                warning=f"PyTorch is not importable here ({type(err).__name__}: {err}); "
                "run the preflight inside the training container",
            ),
            {},
            0,
        )
    info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    try:
        info["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - a CPU-only build has no NCCL
        info["nccl"] = None
    try:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as err:  # noqa: BLE001 - a broken CUDA setup is a failed check
        return Check("torch", torch.__version__, "CUDA available", False, warning=str(err)), info, 0
    value = f"{torch.__version__} (CUDA {torch.version.cuda}), {n} GPU(s)"
    ok = n > 0 and torch.version.cuda is not None
    return (
        Check(
            "torch",
            value,
            "PyTorch with CUDA sees the GPUs",
            ok,
            warning=None if ok else "PyTorch sees no CUDA device",
        ),
        info,
        n,
    )


def run_preflight(
    args: argparse.Namespace, overrides: dict[str, float], table: dict[str, Any]
) -> dict[str, Any]:
    started = time.time()
    t0 = time.monotonic()
    gpu_type = args.gpu_type or ""
    checks: list[Check] = []
    meta: dict[str, Any] = {
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "node_rank": args.node_rank,
        "nnodes": args.nnodes,
        "environment": {k: os.environ.get(k) for k in MULTICAST_OFF},
    }

    # --no-bench is the host-side pass before the image is pulled: the host (a DLAMI, say) need not
    # have PyTorch, so it is neither imported nor checked there; the in-image pass checks it.
    torch_info: dict[str, Any]
    if args.no_bench:
        torch_check, torch_info, ngpu = None, {}, 0
    else:
        torch_check, torch_info, ngpu = torch_probe()
    meta["environment"].update(torch_info)
    rows = smi_query(GPU_FIELDS) if shutil.which("nvidia-smi") else None
    if rows is None:
        why = "not found on PATH" if not shutil.which("nvidia-smi") else "failed"
        checks.append(
            Check(
                "nvidia_smi",
                why,
                "nvidia-smi lists the GPUs",
                False,
                warning=f"nvidia-smi {why}: no NVIDIA GPU or driver here "
                "(a container needs --gpus all)",
            )
        )
    else:
        rows = visible_filter(rows, os.environ.get("CUDA_VISIBLE_DEVICES"))
        _, smi_text, _ = run_cmd(["nvidia-smi"])
        _, topo_text, _ = run_cmd(["nvidia-smi", "topo", "-m"])
        frac = resolve_threshold(table, "memory_fraction_min", gpu_type, overrides).min or 0.95
        links = resolve_threshold(table, "nvlink_links_min", gpu_type, overrides).min
        checks += [
            check_gpu_count(rows, args.gpus),
            check_gpu_model(rows, args.gpu_type),
            check_gpu_memory(rows, args.gpu_memory_gb, frac),
            check_driver(rows, args.driver_min),
            check_cuda(parse_cuda_version(smi_text), args.cuda, torch_info.get("torch_cuda")),
            check_ecc(smi_health(rows)),
            check_nvlink(parse_topo(topo_text), [int(r["index"]) for r in rows], links),
        ]
        serials = smi_serials()
        keys = ("index", "name", "uuid", "pci.bus_id")
        meta["gpus"] = [dict({k: r[k] for k in keys}, serial=serials.get(r["index"])) for r in rows]
    log, source = read_kernel_log()
    critical = set(table.get("xid_critical", {}).get("codes", []))
    checks.append(check_xid(None if log is None else parse_xids(log), source, critical))
    efa_count, attempts = probe_efa(args.efa_expected, args.efa_retries, args.efa_retry_wait)
    checks.append(check_efa(efa_count, args.efa_expected, attempts))
    checks.append(check_disk(args.disk_path, args.disk_min_gb))
    if torch_check is not None:
        checks.append(torch_check)
    if torch_check is not None and torch_check.ok:
        results = run_benchmarks(args, ngpu, args.bench_timeout)
        checks += bench_checks(results, table, gpu_type, overrides, args.nnodes)
    meta["duration_s"] = round(time.monotonic() - t0, 1)
    return report_dict(checks, meta)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    table = load_thresholds()
    try:
        overrides = parse_threshold_overrides(args.threshold, threshold_names(table))
    except ValueError as err:
        parser.error(str(err))
    if args.nnodes > 1 and (not args.master_addr or not args.master_port):
        parser.error(
            "--nnodes > 1 needs --master-addr and --master-port (node 0's address and a free port)"
        )
    if not 0 <= args.node_rank < args.nnodes:
        parser.error("--node-rank must be in [0, --nnodes)")
    try:
        report = run_preflight(args, overrides, table)
    except KeyboardInterrupt:
        print("preflight: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_table(report))
    sys.stdout.flush()
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
