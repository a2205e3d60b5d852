"""The recipe's claimed figures held to each other by the recipe's own formulas.

Why: tokens/s per GPU, MFU, $ per 1M tokens and GPU-hours are four statements about one run,
related by the formulas of docs/measurement.md ("The figures"). A recipe whose figures contradict
each other claims a run that cannot have happened (an MFU its throughput does not give, a price
no catalog entry of its instance has, fewer GPU-hours than its own window took), and its verdict
would compare a run with one figure of an impossible set. Each contradiction is refused with the
numbers on both sides. Tolerances allow the figures' own rounding (the recipe rounds MFU to 4
decimals, $ and tokens/s to 2, GPU-hours as it likes) and nothing more.
"""

from __future__ import annotations

from typing import Any

from launcher import catalog

# Relative slack for a figure computed from rounded figures (MFU to 4 decimals of a 0.1 is 0.05%;
# $ to 2 decimals of 0.32 is 1.6%: that one's absolute rounding is added below).
RELATIVE = 0.01
MFU_ROUNDING = 0.00005  # half the last of 4 decimals
USD_ROUNDING = 0.005  # half a cent per 1M tokens
HOURS_ROUNDING = 0.005  # half the last of 2 decimals


def claim_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for each claimed figure its companions contradict."""
    result, gpu, workload = raw["result"], raw["gpu"], raw["workload"]
    tps = float(result["tokens_per_s_per_gpu"])
    gpus = int(gpu["count"])
    problems: list[tuple[str, str]] = []
    problems += _mfu(result, gpu, tps)
    problems += _usd(result, gpu, tps, gpus)
    problems += _gpu_hours(result, workload, tps, gpus)
    return problems


def _mfu(result: dict[str, Any], gpu: dict[str, Any], tps: float) -> list[tuple[str, str]]:
    spec = catalog.gpu(gpu.get("type"))
    active = (result.get("active_params") or {}).get("count")
    if spec is None or spec.peak_bf16_flops is None or not active:
        return []  # no peak or no N: the recipe's MFU has no formula here
    computed = 6 * int(active) * tps / spec.peak_bf16_flops
    formula = (
        f"6 x {int(active):,} active params x {tps:g} tokens/s per GPU / {spec.name}'s "
        f"{spec.peak_bf16_flops:.4g} FLOP/s = {computed:.4f}"
    )
    if computed > 1:
        return [
            (
                "result.tokens_per_s_per_gpu",
                f"{tps:g} gives an MFU above 1 ({formula}): more than the GPU's peak, which no "
                "run reaches; expected a throughput the GPU can give",
            )
        ]
    claimed = result.get("mfu")
    if claimed is None or result.get("mfu_note"):
        return []  # not claimed, or computed another way the note states
    if abs(claimed - computed) > MFU_ROUNDING + RELATIVE * computed:
        return [
            (
                "result.mfu",
                f"{claimed:g}, but the recipe's formula gives {formula}; expected the same "
                "(or result.mfu_note saying how it was computed)",
            )
        ]
    return []


def _usd(
    result: dict[str, Any], gpu: dict[str, Any], tps: float, gpus: int
) -> list[tuple[str, str]]:
    claimed = result.get("usd_per_million_tokens")
    entry = catalog.instance(gpu.get("instance"))
    if claimed is None or entry is None or not entry.on_demand_usd_per_hour:
        return []  # nothing claimed, or no price to hold it to (a block-only or no instance)
    nodes = -(-gpus // int(gpu["per_node"]))
    million_per_hour = tps * gpus * 3600 / 1e6
    low, high = (
        min(entry.on_demand_usd_per_hour.values()),
        max(entry.on_demand_usd_per_hour.values()),
    )
    # the $ figure's own rounding, as a price: +-half a cent per 1M tokens
    slack = USD_ROUNDING * million_per_hour / nodes
    implied = claimed * million_per_hour / nodes
    if low * (1 - RELATIVE) - slack <= implied <= high * (1 + RELATIVE) + slack:
        return []
    return [
        (
            "result.usd_per_million_tokens",
            f"{claimed:g}, which at {tps:g} tokens/s per GPU x {gpus} GPUs "
            f"({million_per_hour:.2f}M tokens an hour) on {nodes} node(s) is ${implied:.2f} "
            f"per {entry.name} hour, but the catalog's prices of it are ${low:g} to ${high:g} "
            f"({entry.price_source}); expected $/1M = price x nodes / {million_per_hour:.2f}M, "
            f"{low * nodes / million_per_hour:.2f} to {high * nodes / million_per_hour:.2f}",
        )
    ]


def _gpu_hours(
    result: dict[str, Any], workload: dict[str, Any], tps: float, gpus: int
) -> list[tuple[str, str]]:
    claimed = result.get("gpu_hours")
    if claimed is None:
        return []
    first, last = result["window"]
    tokens = (last - first + 1) * int(workload["global_batch"]) * int(workload["row_tokens"])
    window_hours = tokens / (tps * gpus) / 3600 * gpus
    if claimed >= window_hours * (1 - RELATIVE) - HOURS_ROUNDING:
        return []
    return [
        (
            "result.gpu_hours",
            f"{claimed:g}, but the window alone took {window_hours:.3f} GPU-hours: {tokens:,} "
            f"tokens at {tps:g} tokens/s per GPU is {tokens / (tps * gpus):.1f} s on {gpus} GPUs; "
            "expected GPU-hours that count the whole run (acquired to released), at least the "
            "window's",
        )
    ]
