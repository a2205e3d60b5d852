#!/usr/bin/env python3
"""The GPU preflight's benchmarks: one process per GPU, figures in (a module of preflight.py).

Its one job is measuring the GPUs: the bf16 matrix-product rate, the device memory copy bandwidth
and the NCCL all-reduce bus bandwidth (within the node and across nodes), timed with CUDA events,
then judged against the thresholds (bench_checks). It also owns the NVLink-multicast switch,
because its workers start NCCL: preflight.py forces it off before anything else, and every worker
again. `bench_worker` runs in processes started by torch.multiprocessing's spawn, which import it
by this module's name: the scripts directory is on sys.path there (preflight.py puts it there, and
spawn hands the parent's sys.path to the child). Runs on the node under python 3.8 or later with
the standard library; PyTorch is imported only inside the functions that run the benchmarks.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from preflight_checks import Check, check_min, resolve_threshold
from preflight_probes import free_port

# NVLink multicast can put a host's GPUs out of service: force it off before torch or NCCL is
# imported or initialised, whatever the caller's environment says (setdefault could leave it on).
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def force_multicast_off(environ: os._Environ[str] | dict[str, str]) -> None:
    """Set the NVLink-multicast switches to their off values in `environ`, overriding any value."""
    for key, value in MULTICAST_OFF.items():
        environ[key] = value


GIB = 1 << 30
MIB = 1 << 20

# Sizes: chosen so that the whole preflight takes well under 60 s on 8 GPUs.
MATMUL_N = 8192
MATMUL_WARMUP, MATMUL_ITERS = 5, 20
COPY_BYTES = 4 * GIB
COPY_WARMUP, COPY_ITERS = 3, 20
ALLREDUCE_SIZES = (64 * MIB, 256 * MIB, 1 * GIB, 4 * GIB)
ALLREDUCE_WARMUP, ALLREDUCE_ITERS = 3, 10


def busbw_factor(world: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor: busbw = algbw * 2(n-1)/n."""
    return 2 * (world - 1) / world


# --------------------------------------------------------------------------------------------
# GPU benchmarks: one process per GPU (torch only imported here)


def _time_cuda(torch: Any, fn: Callable[[], Any], warmup: int, iters: int) -> float:
    """Mean seconds per call of `fn`, by CUDA events around `iters` calls after `warmup`."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / iters


def bench_worker(local_rank: int, cfg: dict[str, Any], queue: Any) -> None:
    """One GPU: matmul and copy on its own, then the all-reduce with the others. Puts one dict."""
    force_multicast_off(os.environ)
    out: dict[str, Any] = {"local_rank": local_rank}
    try:
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        out["device_name"] = torch.cuda.get_device_name(dev)
        n = cfg["matmul_n"]
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        # F821: ruff checks the lambda at the end of the scope, after `del`; it runs before.
        t = _time_cuda(
            torch,
            lambda: torch.matmul(a, b, out=c),  # noqa: F821 - called before `del a, b, c`
            MATMUL_WARMUP,
            MATMUL_ITERS,
        )
        out["matmul_bf16_tflops"] = 2 * n**3 / t / 1e12
        del a, b, c
        nbytes = cfg["copy_bytes"]
        src = torch.empty(nbytes, device=dev, dtype=torch.uint8).fill_(1)
        dst = torch.empty_like(src)
        t = _time_cuda(
            torch,
            lambda: dst.copy_(src),  # noqa: F821 - called before `del src, dst`
            COPY_WARMUP,
            COPY_ITERS,
        )
        out["copy_tbps"] = 2 * nbytes / t / 1e12
        del src, dst
        torch.cuda.empty_cache()

        nlocal, nnodes = cfg["nlocal"], cfg["nnodes"]
        world = nlocal * nnodes
        rank = cfg["node_rank"] * nlocal + local_rank
        if world > 1:
            dist.init_process_group(
                "nccl",
                init_method=f"tcp://{cfg['master_addr']}:{cfg['master_port']}",
                rank=rank,
                world_size=world,
                device_id=dev,
            )
            groups: dict[str, Any] = {}
            if nnodes > 1:
                groups["multinode"] = None  # the default group: every GPU of every node
                if nlocal > 1:
                    groups["node"], _ = dist.new_subgroups(group_size=nlocal)
            else:
                groups["node"] = None
            for key, group in groups.items():
                out[f"allreduce_{key}"] = _allreduce(
                    torch, dist, dev, group, cfg["allreduce_sizes"]
                )
            dist.destroy_process_group()
    except BaseException as err:  # noqa: BLE001 - reported as a failed check, not a traceback
        out["error"] = f"{type(err).__name__}: {err}".strip()[:500]
    queue.put(out)


def _allreduce(torch: Any, dist: Any, dev: Any, group: Any, sizes: Sequence[int]) -> dict[str, Any]:
    """Sum-all-reduce of float32 at each size; the slowest rank's time gives algbw and busbw."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    probe = torch.full((1024,), float(rank + 1), device=dev)
    dist.all_reduce(probe, group=group)
    correct = bool(torch.all(probe == world * (world + 1) / 2).item())
    rows = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, device=dev, dtype=torch.float32)
        dist.barrier(group=group, device_ids=[dev.index])
        # B023/F821: the lambda only runs inside _time_cuda, in this iteration, before `del x`.
        t = _time_cuda(
            torch,
            lambda: dist.all_reduce(x, group=group),  # noqa: B023, F821
            ALLREDUCE_WARMUP,
            ALLREDUCE_ITERS,
        )
        tt = torch.tensor([t], device=dev, dtype=torch.float64)
        dist.all_reduce(tt, op=dist.ReduceOp.MAX, group=group)
        t = float(tt.item())
        algbw = nbytes / t / 1e9
        rows.append(
            {
                "bytes": nbytes,
                "time_ms": round(t * 1e3, 3),
                "algbw_gbps": round(algbw, 1),
                "busbw_gbps": round(algbw * busbw_factor(world), 1),
            }
        )
        del x
        torch.cuda.empty_cache()
    return {"world": world, "correct": correct, "sizes": rows}


def run_benchmarks(args: argparse.Namespace, nlocal: int, timeout_s: float) -> list[dict[str, Any]]:
    """Spawn one worker per local GPU and collect their dicts (errors included, never raised)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    cfg = {
        "matmul_n": args.matmul_n,
        "copy_bytes": int(args.copy_gib * GIB),
        "allreduce_sizes": [int(m * MIB) for m in args.allreduce_mib],
        "nlocal": nlocal,
        "nnodes": args.nnodes,
        "node_rank": args.node_rank,
        "master_addr": args.master_addr or "127.0.0.1",
        "master_port": args.master_port or free_port(),
    }
    procs = [
        ctx.Process(target=bench_worker, args=(i, cfg, queue), daemon=True) for i in range(nlocal)
    ]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < nlocal:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                item = queue.get(timeout=min(left, 1.0))
            # queue.Empty, or a pipe broken by a dying worker: see whether a worker died
            except Exception:  # noqa: BLE001 - a timeout must never crash the preflight
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead and len(results) + len(dead) >= nlocal:
                    break
                continue
            results.append(item)
            if "error" in item:
                break  # the others may wait forever in NCCL for the failed one
    finally:
        for p in procs:
            p.join(timeout=5 if len(results) == nlocal else 0.5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
    got = {r["local_rank"] for r in results}
    failed_first = any("error" in r for r in results)
    for i in range(nlocal):
        if i not in got:
            why = (
                "stopped after another GPU's worker failed"
                if failed_first
                else (f"gave no result within {timeout_s:g} s (exit code {procs[i].exitcode})")
            )
            results.append({"local_rank": i, "error": f"worker for GPU {i} {why}"})
    return sorted(results, key=lambda r: r["local_rank"])


def bench_checks(
    results: list[dict[str, Any]],
    table: dict[str, Any],
    gpu_type: str,
    overrides: dict[str, float],
    nnodes: int,
) -> list[Check]:
    """Matmul, copy and all-reduce checks from the workers' results (pure)."""
    errors = [f"GPU{r['local_rank']}: {r['error']}" for r in results if "error" in r]
    err_text = "; ".join(errors) or None
    checks = []
    for name, key, unit in (
        ("matmul_bf16", "matmul_bf16_tflops", "TFLOP/s"),
        ("copy_bandwidth", "copy_tbps", "TB/s"),
    ):
        per = [r.get(key) for r in results]
        measured = [v for v in per if v is not None]
        value = min(measured) if measured and len(measured) == len(per) else None
        checks.append(
            check_min(
                name,
                value,
                unit,
                resolve_threshold(table, key, gpu_type, overrides),
                detail={"per_gpu": [None if v is None else round(v, 3) for v in per]},
                error=err_text,
            )
        )
    nlocal = len(results)
    wanted: list[tuple[str, str, str, int | None]] = []
    if nlocal > 1:
        wanted.append(("allreduce_busbw", "allreduce_node", "allreduce_busbw_gbps", nlocal))
    if nnodes > 1:
        wanted.append(
            (
                "allreduce_multinode_busbw",
                "allreduce_multinode",
                "allreduce_multinode_busbw_gbps",
                None,
            )
        )
    for name, key, thr_name, count in wanted:
        ar = next((r[key] for r in results if key in r), None)
        thr = resolve_threshold(table, thr_name, gpu_type, overrides, count)
        if ar is None:
            checks.append(check_min(name, None, "GB/s", thr, error=err_text))
            continue
        largest = max(ar["sizes"], key=lambda s: s["bytes"])
        check = check_min(name, largest["busbw_gbps"], "GB/s", thr, detail=ar)
        check.expected += f" at {largest['bytes'] / GIB:g} GiB, {ar['world']} GPUs"
        if not ar["correct"]:
            check.ok = False
            check.warning = "all-reduce gave a wrong sum"
        checks.append(check)
    return checks
