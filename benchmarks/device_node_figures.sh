#!/usr/bin/env bash
# The node figures of docs/benchmarks.md ("Node programs: bytes and hashes", "GPU stages on an
# H200") measured on a device machine: run from a copy of the repository root with OUT set to a
# folder for the results; boto3 and moto installed beside it (PYTHONPATH) for the S3 part.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT}
t() { local s=$EPOCHREALTIME; "$@"; local rc=$?; echo "wall $(awk "BEGIN{printf \"%.2f\", $EPOCHREALTIME - $s}") s rc=$rc: $*" | tee -a "$OUT/walls.txt" >&2; return 0; }
{ date -u; nproc; uname -r; python3 -V; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'; nvidia-smi; free -g; df -h /tmp; } > "$OUT/machine.txt" 2>&1
t python3 scripts/preflight.py --json --gpu-type H200 --gpus 1 --gpu-memory-gb 141 --driver-min 580.65.06 \
    --cuda 13.0 --disk-path /tmp --disk-min-gb 10 > "$OUT/preflight-gpu.json"
t python3 scripts/preflight.py --json --gpu-type H200 --gpus 1 --gpu-memory-gb 141 --driver-min 580.65.06 \
    --cuda 13.0 --disk-path /tmp --disk-min-gb 10 --no-bench > "$OUT/preflight-host.json"
t python3 scripts/stack_probe.py --json --policy warn --expect '{"cuda": "13.0", "deepep": "1.2.1", "megatron_commit": "37f91617", "miles_commit": "78527b91", "nccl": "2.28.9", "python": "3.12.3", "torch": "2.11.0", "transformer_engine": "2.17.0"}' > "$OUT/stack.json"
t python3 benchmarks/node_transfer.py --files 16 --mib 512 --s3-mib 128 --rows-convs 10000 --json "$OUT/transfer-16x512.json" > "$OUT/transfer.txt" 2>&1
t python3 benchmarks/node_transfer.py --files 8 --mib 512 --s3-mib 128 --rows-convs 2000 --json "$OUT/transfer-8x512.json" >> "$OUT/transfer.txt" 2>&1
PYTHONPATH="$PWD:$PWD/tests:${PYTHONPATH:-}" t python3 -m pytest --noconftest -o addopts="" -q tests/scripts/test_preflight_gpu.py > "$OUT/gpu-tests.txt" 2>&1
cat "$OUT/walls.txt" "$OUT/transfer.txt"; tail -3 "$OUT/gpu-tests.txt"
