"""The one catalog of hardware facts: instance types, GPU peaks and on-demand prices.

Why one place: the AWS request builder (network cards, EFA count), the preflight (GPUs and EFA
devices to expect), the price of a run ($/h) and MFU (the GPU's peak) all read the same facts, and
a fact written twice drifts. Every entry names where its figures come from and when they were
read; a figure nobody could source is None, and the tool then says it does not know (no price,
no MFU) rather than guessing. Why a table as well as AWS's live prices: a run on AWS looks its
price up (launcher/clusters/aws/prices.py) and the table is its offline fallback, the dry run's
price and the price of every other kind; the price a run used is recorded with its source
(`Price`), so a saved run directory is judged the same way offline. A profile's price_per_hour
or --price-per-hour overrides both.

To add an instance type: copy its row of DescribeInstanceTypes (GPU count and model, memory,
vCPUs, network cards, maximum EFA interfaces), its on-demand price per region from AWS's pricing
page, and say where and when each was read. docs/measurement.md explains how the peak and the
price enter MFU and $ per 1M tokens.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.errors import BadInput

DEFAULT_REGION = "us-east-1"  # the region a price is quoted for when none is given


@dataclass(frozen=True)
class Gpu:
    """One GPU model: its dense bf16 peak (no sparsity), the denominator of MFU."""

    name: str
    memory_gb: float | None
    peak_bf16_flops: float | None
    source: str
    read_on: str  # when the figures were read from their source (YYYY-MM-DD)


@dataclass(frozen=True)
class InstanceType:
    """One cloud instance type, as far as the launcher needs to know it."""

    name: str
    provider: str
    gpu: str  # a key of GPUS
    gpus: int
    memory_gib: int  # host memory
    vcpus: int
    network_cards: int
    max_efa: int  # EFA interfaces the instance type takes (= EFA devices the node shows)
    source: str
    on_demand_usd_per_hour: dict[str, float] = field(default_factory=dict)  # region -> $/h
    price_source: str | None = None
    gpu_memory_gib: float | None = None  # per GPU, as DescribeInstanceTypes reports it
    read_on: str | None = None  # when the facts were read (YYYY-MM-DD)
    price_read_on: str | None = None  # when the prices were read (YYYY-MM-DD)


# Where a run's price came from: the user's word (option, profile), this table (catalog), or a
# live lookup (AWS's Price List API for on-demand, the spot price history, a Capacity Block
# offering's fee). launcher/clusters/aws/prices.py makes the live ones; docs/aws.md says how.
PRICE_SOURCES = (
    "option",
    "profile",
    "catalog",
    "price-list-api",
    "spot-history",
    "capacity-block",
)
PRICE_UNIT = "USD per node-hour"


@dataclass(frozen=True)
class Price:
    """The price a run used: decided once per run, recorded in run.json and result.yaml, and
    the one input of every $ figure (the cost gate, the budget, the cost so far, $/1M tokens).

    `source` is one of PRICE_SOURCES; `detail` says exactly where (the citation, the request);
    `read_at` when the figure was read (ISO UTC; for the catalog, the day its source was read);
    `fallback` why a live lookup was not used, when the catalog stood in for it.
    """

    value: float
    source: str
    instance_type: str | None = None
    region: str | None = None
    read_at: str | None = None
    detail: str = ""
    fallback: str | None = None
    unit: str = PRICE_UNIT

    def describe(self) -> str:
        """One line beside every $ figure: 'catalog: <citation>, p5en.48xlarge us-east-1'."""
        text = f"{self.source}: {self.detail}" if self.detail else self.source
        if self.read_at:
            text += f" (read {self.read_at})"
        return text + (f"; {self.fallback}" if self.fallback else "")

    def to_dict(self) -> dict[str, str | float | None]:
        return {
            "usd_per_hour": self.value,
            "unit": self.unit,
            "source": self.source,
            "detail": self.detail,
            "instance_type": self.instance_type,
            "region": self.region,
            "read_at": self.read_at,
            "fallback": self.fallback,
        }

    @classmethod
    def from_dict(cls, data: object) -> Price | None:
        """A recorded price (run.json's `price`) read back; None when it is not one (a run
        directory from before prices were recorded, or a damaged one: then nothing is assumed)."""
        if not isinstance(data, dict):
            return None
        value = data.get("usd_per_hour")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if not 0 < value < float("inf") or data.get("source") not in PRICE_SOURCES:
            return None

        def text(key: str) -> str | None:
            found = data.get(key)
            return str(found) if found is not None else None

        return cls(
            float(value),
            str(data["source"]),
            text("instance_type"),
            text("region"),
            text("read_at"),
            text("detail") or "",
            text("fallback"),
        )


# --- GPUs -----------------------------------------------------------------------------------------
# NVIDIA's datasheets give tensor-core figures "with sparsity" (2:4 structured); the dense figure,
# the one a training step can reach, is half of it. MFU divides by the dense figure.

_READ = "2026-12-01"

GPUS: dict[str, Gpu] = {
    "H100": Gpu(
        "H100",
        80,
        989e12,
        "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100): H100 SXM "
        "BF16 Tensor Core 1,979 TFLOPS with sparsity, so 989 dense; the Hopper whitepaper's "
        "dense table gives 989.4",
        _READ,
    ),
    "H200": Gpu(
        "H200",
        141,
        989e12,
        "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200): H200 SXM "
        "BF16 Tensor Core 1,979 TFLOPS with sparsity, so 989 dense (the H100's GH100 compute with "
        "more memory); also the perf/mfu_peak_tflops miles logs",
        _READ,
    ),
    "B200": Gpu(
        "B200",
        180,
        2250e12,
        "NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx): per GPU FP16/BF16 "
        "Tensor Core 4.5 PFLOPS with sparsity, so 2.25 dense, 180 GB HBM3e; a dense table "
        "(glennklockwood.com/garden/processors/B200, HGX B200 at 1,000 W) gives BF16 2,250",
        _READ,
    ),
    "A100": Gpu(
        "A100",
        40,
        312e12,
        "NVIDIA A100 Tensor Core GPU datasheet "
        "(nvidia.com, nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): BF16 Tensor Core "
        "312 TFLOPS dense, 624 with sparsity; A100 40GB SXM4",
        _READ,
    ),
    "A100-80GB": Gpu(
        "A100-80GB",
        80,
        312e12,
        "NVIDIA A100 Tensor Core GPU datasheet: A100 80GB SXM4, the same BF16 Tensor Core "
        "312 TFLOPS dense (624 with sparsity) as the 40 GB part",
        _READ,
    ),
}

# --- Instance types -------------------------------------------------------------------------------
# GPU count and model, memory, vCPUs, network cards and EFA interfaces: AWS's DescribeInstanceTypes
# as bundled by moto 5.2.5 (moto/ec2/resources/instance_types.json.gz, copied from AWS).

_DESCRIBE = "AWS DescribeInstanceTypes, as bundled by moto 5.2.5 (copied from AWS)"
# On-demand list prices (Linux, shared tenancy, per instance-hour) as instances.vantage.sh
# publishes them from AWS's price list, copied with their date into a public repository:
# github.com/tsaol/aws-gpu, data/<family>_instances.js at commit 299375be ("Last updated:
# 2026-08-26"). These are after AWS's June 2025 cut of P4 and P5 prices (p5.48xlarge was $98.32).
_VANTAGE = (
    "AWS on-demand list price, Linux, shared tenancy, from instances.vantage.sh as copied into "
    "github.com/tsaol/aws-gpu data/{file} (commit 299375be, updated 2026-08-26)"
)
_PRICES_READ = "2026-08-26"

INSTANCE_TYPES: dict[str, InstanceType] = {
    "p5.48xlarge": InstanceType(
        "p5.48xlarge",
        "aws",
        "H100",
        8,
        2048,
        192,
        32,
        32,
        f"{_DESCRIBE}; AWS's Capacity Blocks pricing page lists the same 8 x H100, 192 vCPU, "
        "2048 GiB, 640 GB HBM3",
        {
            "us-east-1": 55.04,
            "us-east-2": 55.04,
            "us-west-2": 55.04,
            "us-west-1": 68.8,
            "ca-central-1": 63.296,
            "eu-north-1": 58.8928,
            "eu-west-2": 71.552,
            "ap-northeast-1": 68.8,
            "ap-south-1": 66.048,
            "ap-southeast-2": 71.552,
            "sa-east-1": 92.4672,
        },
        _VANTAGE.format(file="p5_instances.js"),
        gpu_memory_gib=80,
        read_on=_READ,
        price_read_on=_PRICES_READ,
    ),
    "p5e.48xlarge": InstanceType(
        "p5e.48xlarge",
        "aws",
        "H200",
        8,
        2048,
        192,
        32,
        32,
        f"{_DESCRIBE}; torchx's named resources also give 32 EFA devices",
        # No on-demand price on purpose: AWS sells p5e.48xlarge through EC2 Capacity Blocks only
        # (instances.vantage.sh lists it with no on-demand price in any region:
        # github.com/tsaol/aws-gpu data/p5e_instances.js, commit 299375be).
        price_source=(
            "no on-demand price: AWS sells p5e.48xlarge through Capacity Blocks only (no region "
            "lists an on-demand price: instances.vantage.sh via github.com/tsaol/aws-gpu "
            "data/p5e_instances.js, 2026-08-26); a run in a block is priced from its offering's "
            "fee (capacity.type capacity-block), else give price_per_hour or --price-per-hour"
        ),
        gpu_memory_gib=141,
        read_on=_READ,
        price_read_on=_PRICES_READ,
    ),
    "p5en.48xlarge": InstanceType(
        "p5en.48xlarge",
        "aws",
        "H200",
        8,
        2048,
        192,
        16,
        16,
        f"{_DESCRIBE}; torchx's named resources also give 16 EFA devices",
        {
            "us-east-1": 63.296,
            "us-east-2": 63.296,
            "us-west-2": 63.296,
            "eu-north-1": 67.73,
            "us-west-1": 79.12,
            "eu-south-2": 68.35968,
            "ap-northeast-1": 79.12,
            "ap-south-1": 75.9552,
        },
        # As AWS's price list gave them to `dstack offer` (github.com/dstackai/dstack pull
        # 4110, 2026-08-06); eu-north-1 is $67.7267 there, kept here to the cent. The same
        # figures, and the three Asian and Spanish regions, in instances.vantage.sh's list.
        "AWS on-demand list price, Linux, 2026-08-06 (dstack pull 4110); the same in "
        "instances.vantage.sh's list (github.com/tsaol/aws-gpu data/p5en_instances.js)",
        gpu_memory_gib=141,
        read_on=_READ,
        price_read_on=_READ,
    ),
    "p4d.24xlarge": InstanceType(
        "p4d.24xlarge",
        "aws",
        "A100",
        8,
        1152,
        96,
        4,
        4,
        f"{_DESCRIBE}; AWS's Capacity Blocks pricing page lists the same 8 x A100, 96 vCPU, "
        "1152 GiB, 320 GB HBM2",
        {
            "us-east-1": 21.957642,
            "us-east-2": 21.95764,
            "us-west-2": 21.95764,
            "ca-central-1": 25.25174,
            "eu-west-1": 23.71569,
            "eu-north-1": 23.71569,
            "eu-central-1": 27.43298,
            "ap-northeast-1": 30.09784,
            "ap-south-1": 26.3444,
            "sa-east-1": 35.5569,
        },
        _VANTAGE.format(file="p4d_instances.js"),
        gpu_memory_gib=40,
        read_on=_READ,
        price_read_on=_PRICES_READ,
    ),
    "p4de.24xlarge": InstanceType(
        "p4de.24xlarge",
        "aws",
        "A100-80GB",
        8,
        1152,
        96,
        4,
        4,
        _DESCRIBE,
        {
            "us-east-1": 27.44705,
            "us-west-2": 27.44705,
            "eu-central-1": 34.29122,
            "ap-northeast-1": 37.6223,
            "ap-southeast-1": 32.93646,
        },
        _VANTAGE.format(file="p4de_instances.js"),
        gpu_memory_gib=80,
        read_on=_READ,
        price_read_on=_PRICES_READ,
    ),
    "p6-b200.48xlarge": InstanceType(
        "p6-b200.48xlarge",
        "aws",
        "B200",
        8,
        2048,
        192,
        8,
        8,
        f"{_DESCRIBE} (GPU memory 183,359 MiB each)",
        {
            "us-east-1": 113.9328,
            "us-east-2": 113.9328,
            "us-west-2": 113.9328,
            "ap-south-1": 160.64525,
        },
        _VANTAGE.format(file="p6-b200_instances.js"),
        gpu_memory_gib=179,
        read_on=_READ,
        price_read_on=_PRICES_READ,
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


def instance_type_of(text: str | None) -> str | None:
    """'AWS p5en.48xlarge' -> 'p5en.48xlarge'; None when nothing is named."""
    return split_instance(text)[1]


def instance(name: str | None) -> InstanceType | None:
    """The catalog entry of an instance type (bare or with its cloud's name), or None."""
    return INSTANCE_TYPES.get((instance_type_of(name) or "").lower())


def gpu(name: str | None) -> Gpu | None:
    """The catalog entry of a GPU model ('H200', 'h200', 'NVIDIA H200', 'A100 80GB'), or None."""
    key = str(name or "").upper().replace("NVIDIA", "").replace("SXM", "").strip()
    key = "-".join(key.replace("-", " ").split())
    return GPUS.get(key)


def price_per_hour(
    instance_type: str | None,
    region: str | None = None,
    override: float | None = None,
    *,
    override_source: str = "option",
) -> Price | None:
    """The hourly price of one instance, or None when it is unknown (never a guess).

    `override` (a profile's price_per_hour, `override_source="profile"`, or --price-per-hour,
    "option") wins over the catalog. A region missing from a priced type raises BadInput:
    silently taking another region's price would misstate the cost.
    """
    itype = instance_type_of(instance_type)
    if override is not None:
        if not 0 < override < float("inf"):  # NaN too: a NaN price never reaches a budget
            raise BadInput(f"price override must be a positive number, got {override}")
        said = "--price-per-hour" if override_source == "option" else "the profile's price_per_hour"
        return Price(float(override), override_source, itype, region, detail=f"{said} (override)")
    entry = instance(itype)
    if entry is None or not entry.on_demand_usd_per_hour:
        return None
    by_region = entry.on_demand_usd_per_hour
    chosen = region or DEFAULT_REGION
    if chosen not in by_region:
        known = ", ".join(sorted(by_region))
        raise BadInput(
            f"no price for {entry.name} in region {chosen!r} (known: {known}).",
            hint="Pass --price-per-hour to give one.",
        )
    note = "" if region else " (no region given: the default)"
    return Price(
        by_region[chosen],
        "catalog",
        entry.name,
        chosen,
        read_at=entry.price_read_on,
        detail=f"{entry.price_source}, {entry.name} {chosen}{note}",
    )


# Memory per GPU as the recipe states it (GB, vendor figures) may differ from the catalog's by
# rounding (141 vs 140.4, 180 vs 179): more than this is another part.
MEMORY_TOLERANCE = 0.03


def _family(name: str) -> str:
    return name.split("-")[0]


def gpu_name_matches(gpu_type: str, name: str) -> bool:
    """Whether a GPU named `name` (as nvidia-smi says it) is of `gpu_type`: the type as a whole
    word of the name, case aside. The preflight decides on the node by the same rule
    (scripts/preflight_checks.py, check_gpu_model; tests/test_catalog.py holds the two equal), so
    what `validate` lets through the node does not refuse after it was paid for: "H20" is not an
    H200, "H200 NVL" not the H200 of a p5en (a substring would take both)."""
    pattern = rf"(?<![A-Za-z0-9]){re.escape(gpu_type)}(?![A-Za-z0-9])"
    return bool(gpu_type) and re.search(pattern, name, re.I) is not None


def instance_problems(gpu_block: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Where a recipe's `gpu` block contradicts the catalog's facts of its gpu.instance: the GPU
    model, the GPUs per node and the memory per GPU, as (field, message).

    Why in `validate` (launcher/inputs/recipe.py calls it for every target): the instance names what
    the figures were measured on and prices them, so an H200 recipe on an H100 instance, or 16
    GPUs per node of an 8-GPU instance, is a claim no node can reproduce and a price of the wrong
    hardware. An instance type the catalog does not know is refused, naming the known ones: a
    typo ("p5en.48xlarg") would otherwise get no facts, no price and an AWS plan that says NO
    PRICE; a cluster that is no cloud instance states null.
    """
    named = gpu_block.get("instance")
    if named is None:
        return []
    entry = instance(named)
    provider = split_instance(named)[0]
    if entry is None or (provider is not None and provider != entry.provider):
        known = ", ".join(f"{t.provider.upper()} {t.name}" for t in INSTANCE_TYPES.values())
        return [
            (
                "gpu.instance",
                f"{named!r} is not an instance type the catalog knows (launcher/catalog.py: its "
                f"GPUs, network and price); expected one of {known}, or null for a cluster "
                "that is no cloud instance (its price then comes from the profile or "
                "--price-per-hour)",
            )
        ]
    where = f"gpu.instance {named!r}"
    problems: list[tuple[str, str]] = []
    wanted = gpu(gpu_block.get("type"))
    have = str(entry.gpu).upper()
    if wanted is not None:
        same = _family(wanted.name) == _family(entry.gpu)
    else:  # the preflight's rule (scripts/preflight_checks.py, check_gpu_model): a whole word
        same = gpu_name_matches(str(gpu_block.get("type") or ""), f"NVIDIA {have}")
    if not same:
        problems.append(
            (
                "gpu.type",
                f"{gpu_block.get('type')!r}, but {where} has {entry.gpus} x {entry.gpu} "
                f"({entry.source}); expected {entry.gpu} or another instance type",
            )
        )
    per_node = gpu_block.get("per_node")
    if per_node != entry.gpus:
        problems.append(
            (
                "gpu.per_node",
                f"{per_node}, but {where} has {entry.gpus} GPUs per node; expected "
                f"{entry.gpus} (a node is a whole instance, and its price pays for all of them)",
            )
        )
    memory, part = gpu_block.get("memory_gb"), GPUS.get(entry.gpu)
    if same and memory is not None and part is not None and part.memory_gb:
        if abs(float(memory) - part.memory_gb) > MEMORY_TOLERANCE * part.memory_gb:
            problems.append(
                (
                    "gpu.memory_gb",
                    f"{memory:g} GB, but the {entry.gpu} GPUs of {where} have "
                    f"{part.memory_gb:g} GB each; expected {part.memory_gb:g} or null",
                )
            )
    return problems


def no_price_reason(instance_type: str | None) -> str:
    """Why the catalog has no price for a type (its own words where it says why: p5e)."""
    entry = instance(instance_type)
    if entry is not None and not entry.on_demand_usd_per_hour and entry.price_source:
        return entry.price_source
    return f"the catalog has no on-demand price for {instance_type or 'this instance type'}"


def with_fallback(price: Price, why: str) -> Price:
    """The catalog's price standing in for a live lookup that failed, saying why."""
    return replace(price, fallback=why)
