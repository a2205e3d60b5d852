"""The one catalog of hardware facts: instance types, GPU peaks and on-demand prices.

Why one place: the AWS request builder (network cards, EFA count), the preflight (GPUs and EFA
devices to expect), the price of a run ($/h) and MFU (the GPU's peak) all read the same facts, and
a fact written twice drifts. Every entry names where its figures come from; a figure nobody could
source is None (the tool then says it does not know, rather than guessing).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gpu:
    """One GPU model: its dense bf16 peak (no sparsity), the denominator of MFU."""

    name: str
    memory_gb: float
    peak_bf16_flops: float
    source: str


@dataclass(frozen=True)
class InstanceType:
    """One cloud instance type, as far as the launcher needs to know it."""

    name: str
    provider: str
    gpu: str  # a key of GPUS
    gpus: int
    memory_gib: int
    vcpus: int
    network_cards: int
    max_efa: int
    source: str
    on_demand_usd_per_hour: dict[str, float] = field(default_factory=dict)  # region -> $/h
    price_source: str | None = None


GPUS: dict[str, Gpu] = {
    "H200": Gpu(
        "H200",
        141,
        989e12,
        "NVIDIA H200 datasheet: 1,979 TFLOPS bf16 with sparsity, 989 dense (SXM); also the "
        "perf/mfu_peak_tflops miles logs",
    ),
}

INSTANCE_TYPES: dict[str, InstanceType] = {
    "p5en.48xlarge": InstanceType(
        "p5en.48xlarge",
        "aws",
        "H200",
        8,
        2048,
        192,
        16,
        16,
        "AWS EC2 accelerated-computing instance specs and describe_instance_types (as bundled by moto)",
        {
            "us-east-1": 63.296,
            "us-east-2": 63.296,
            "us-west-2": 63.296,
            "eu-north-1": 67.73,
            "us-west-1": 79.12,
        },
        "AWS EC2 on-demand pricing page, Linux, 2026",
    ),
}


def split_instance(text: str | None) -> tuple[str | None, str | None]:
    """'AWS p5en.48xlarge' -> ('aws', 'p5en.48xlarge'); 'p5en.48xlarge' -> (None, 'p5en.48xlarge').

    Recipes name the cloud before the type in gpu.instance; this is the only place that reads it.
    """
    if not text or not str(text).strip():
        return None, None
    words = str(text).split()
    provider = words[0].lower() if len(words) > 1 else None
    return provider, words[-1]


def instance(name: str | None) -> InstanceType | None:
    """The catalog entry of an instance type (bare or with its cloud's name), or None."""
    return INSTANCE_TYPES.get(split_instance(name)[1] or "")


def gpu(name: str | None) -> Gpu | None:
    """The catalog entry of a GPU model ('H200', 'h200', 'NVIDIA H200'), or None."""
    key = str(name or "").upper().replace("NVIDIA", "").strip()
    return GPUS.get(key)
