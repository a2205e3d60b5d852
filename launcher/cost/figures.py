"""The figures the estimate computes with (launcher/cost/estimate.py), each with its source.

Why a module of their own: every figure says where it comes from ("measured: <docs/benchmarks.md
section>: ...", "published: <AWS's page>: ..." or "assumed: ..."; tests/cost holds each to that
form), and those sources are most of the text; the arithmetic stays in estimate.py.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
MIB = 2**20


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    # where the figure comes from: "measured: <docs/benchmarks.md section>: ...", "published:
    # <where>: ..." or "assumed: ..." (tests/cost/test_assets_estimate.py holds each to its form)
    source: str


NODE = "docs/benchmarks.md, 'Node programs: bytes and hashes'"
GPU_STAGES = "docs/benchmarks.md, 'GPU stages on an H200'"
FIGURES: dict[str, Figure] = {
    "provision": Figure(
        600,
        "s",
        "assumed: an on-demand p5en from RunInstances to SSH (DLAMI boot, status checks); "
        "docs/aws.md notes that it can take up to 30 minutes",
    ),
    "staging": Figure(
        10,
        "s",
        "measured: docs/benchmarks.md, 'Staging a run on N nodes over SSH': 2.7 s for four nodes "
        "over loopback SSH; 10 s allowed for the handshake and round trips over a real network "
        "(assumed)",
    ),
    "preflight": Figure(
        2,
        "s",
        f"measured: {GPU_STAGES}: 0.34 s wall on one H200 (--no-bench); 2 s allowed for 8 GPUs "
        "and the EFA listing",
    ),
    "resolve": Figure(10, "s", "assumed: manifests, the Hub's listings, one byte per repo"),
    "image_bytes": Figure(
        20 * GB, "B", "assumed: the training image, compressed; recipes do not state its size"
    ),
    "pull": Figure(
        0.15 * GB,
        "B/s",
        "assumed: docker pull with layer extraction; its node side measured at 0.13-0.16 GB/s "
        "from a loopback registry on the 2-core machine, and a docker load of the same image no "
        "faster (docs/benchmarks.md, 'Image pull and load'); the registry's network not included. "
        "The root volume docker writes to gets 1000 MiB/s provisioned (root_volume_throughput): "
        "at gp3's 125 MiB/s baseline (Amazon EBS User Guide, 'Amazon EBS General Purpose SSD "
        "volumes') the disk alone would hold a pull near 0.13 GB/s. Layers of real files (Python "
        "packages) extracted at 0.011-0.033 gzipped GB/s on the same machine, the cost being the "
        "files (docs/benchmarks.md, 'An image's layers made of real files'). AWS's Machine "
        "Learning Blog "
        "('Reducing container cold start times using SOCI index on DLAMI and DLC', 2026; read "
        "through copies of the post) reports "
        "4-6 minutes for a standard pull of a 15-20 GB image on a DLAMI (0.04-0.08 GB/s, its "
        "volume not stated), so this figure may be optimistic by up to 3x",
    ),
    "image_present": Figure(5, "s", "assumed: docker pull of an image the node holds"),
    "image_check": Figure(
        2,
        "s",
        "measured: docs/benchmarks.md, 'Image pull and load': node.sh's check of an image a "
        "baked AMI holds (docker image inspect, RepoDigests, image.json; no registry) took "
        "0.11-0.15 s on the busy 2-core machine; 2 s allowed for a node's docker with a 20 GB "
        "image",
    ),
    "lazy_bytes": Figure(
        8 * GB,
        "B",
        "assumed: what the GPU preflight and the stack probe read of the image on first use "
        "(Python, PyTorch with its CUDA, cuDNN and NCCL libraries, Transformer Engine, DeepEP), "
        "read by both at once so fetched once; nobody measured it yet",
    ),
    "ebs_init": Figure(
        100 * MIB,
        "B/s",
        "published: Amazon EBS User Guide, 'Initialize Amazon EBS volumes' (docs.aws.amazon.com/"
        "ebs/latest/userguide/initalize-volume.html): a volume made from a snapshot (an AMI's "
        "root) downloads each block from Amazon S3 on its first read; the default rate "
        "fluctuates and is not published, an Amazon EBS Provisioned Rate for Volume "
        "Initialization (RunInstances' Ebs.VolumeInitializationRate) is 100-300 MiB/s: its "
        "floor is taken (assumed), and the blocks initialized in the background while the "
        "instance boots are not counted; Fast Snapshot Restore (fully initialized at creation) "
        "would make it 0",
    ),
    "preflight-gpu": Figure(
        15,
        "s",
        f"measured: {GPU_STAGES}: 9.4 s wall on one H200, 9-13 s on two with the all-reduce "
        "(docs/benchmarks.md, 'GPU preflight'); 15 s allowed for 8 GPUs and the container's "
        "start (no 8-GPU machine was lent)",
    ),
    "stack": Figure(
        10,
        "s",
        f"measured: {GPU_STAGES}: 4.6 s wall on the H200 machine without Transformer Engine and "
        "DeepEP; 10 s allowed for their imports and the container's start",
    ),
    "hub": Figure(
        0.2 * GB,
        "B/s",
        "assumed: the Hugging Face Hub's CDN to one host, 8 files at a time; varies widely",
    ),
    "s3": Figure(
        12.5 * GB,
        "B/s",
        "published: AWS, 'Performance guidelines for Amazon S3' (docs.aws.amazon.com/AmazonS3/"
        "latest/userguide/optimizing-performance-guidelines.html): parallel byte-range GETs, up "
        "to 100 Gb/s to one instance in the bucket's region; not measurable here",
    ),
    "fetch": Figure(
        1.24 * GB,
        "B/s",
        f"measured: {NODE}: asset_store.fetch, 8 files at a time, ranged reads hashed as they "
        "arrive and written durably, on the 16-core H200 machine: the lower of two runs (1.24, "
        "1.57 GB/s; that disk's durable copy limit 1.8-2.2 GB/s)",
    ),
    "nvme": Figure(
        6.0 * GB,
        "B/s",
        f"measured: {NODE}: asset_store.hash_files, 8 threads, on the 16-core H200 machine: the "
        "lowest of three runs (6.0-7.5 GB/s; openssl of the same files at once 6.4-8.7 GB/s)",
    ),
    "dataset_bytes": Figure(
        1.5 * GB, "B", "assumed: the dataset's parquet files; recipes do not state their size"
    ),
    "rows_build": Figure(
        5e5,
        "tokens/s",
        f"assumed: miles' loss-mask generator on the host's CPUs, in the image ({NODE}: the "
        "build around a test tokenizer ran at 1.1M tokens/s; the real tokenizer was not timed)",
    ),
    "convert_fixed": Figure(120, "s", "assumed: the converter's start and model set-up"),
    "convert": Figure(0.5 * GB, "B/s", "assumed: checkpoint read, converted and written"),
    "converted_ratio": Figure(
        1.0, "x", "assumed: the converted checkpoint is the bf16 weights again (no optimizer)"
    ),
    "collect": Figure(
        5,
        "s",
        "measured: docs/benchmarks.md, 'reproduce verify' and 'Execution: log streaming': the "
        "log judged in 0.4 s, one SSH round trip 0.3 s; 5 s allowed for the container's removal "
        "and the result files",
    ),
    "release": Figure(
        2,
        "s",
        "published: the Amazon EC2 User Guide, 'Instance lifecycle': an instance is not billed "
        "once it is shutting-down, so only the TerminateInstances call is paid (docs/"
        "benchmarks.md, 'AWS: request builder': acquire and release 0.13 s against moto)",
    ),
    "release_kept": Figure(2, "s", "assumed: the container removed on a node that stays"),
}
