#!/usr/bin/env bash
# Issue 24's image figures on a device machine (docs/benchmarks.md, "An image's layers, unpacked
# on 16 cores" and "What the GPU stages read of the image"): run from a copy of the repository
# root with OUT set to a folder for the results. Nothing is fetched: the layers are made of the
# machine's own Python packages (PyTorch and its CUDA libraries).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT}
GT=H200 GB=141  # the preflight's expectations follow the card lent (the files it reads do not)
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && GT=H100 GB=80
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
{ date -u; nproc; uname -r; free -g; df -h /tmp; du -sh "$SP"; du -sh "$SP"/* 2>/dev/null | sort -h | tail -12
  command -v pigz unpigz zstd; tar --version | head -1; gzip --version | head -1; } > "$OUT/machine.txt" 2>&1
python3 benchmarks/lazy_bytes.py --exclude /usr/local/nvidia --exclude /usr/lib/x86_64-linux-gnu/libcuda \
  --exclude /usr/lib/x86_64-linux-gnu/libnvidia --json "$OUT/lazy-bytes.json" -- \
  "python3 scripts/preflight.py --json --gpu-type $GT --gpus 1 --gpu-memory-gb $GB --driver-min 580.65.06 --cuda 13.0 --disk-path /tmp --disk-min-gb 10" \
  "python3 scripts/stack_probe.py --json --policy warn --expect '{\"cuda\": \"13.0\", \"nccl\": \"2.28.9\", \"python\": \"3.12.3\", \"torch\": \"2.11.0\"}'" \
  > "$OUT/lazy-bytes.txt" 2>&1
# the GPU sampler (evidence check 7) on a real GPU: its gpu-marked test, then the sampler's median
# utilization while the card is idle and while a bf16 matmul loop keeps it busy (the check's 50%)
PYTHONPATH="$PWD:$PWD/tests:${PYTHONPATH:-}" timeout 120 python3 -m pytest --noconftest -o addopts="" -q \
  tests/scripts/test_gpu_sampler.py -k real_nvidia > "$OUT/gpu-sampler-test.txt" 2>&1; tail -3 "$OUT/gpu-sampler-test.txt"
for load in idle busy; do
  python3 scripts/gpu_sampler.py --out "$OUT/samples-$load.csv" --interval-ms 500 & S=$!
  if [ $load = busy ]; then timeout 60 python3 -c "
import time, torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16); end = time.time() + 12
while time.time() < end: (a @ a); torch.cuda.synchronize()"; else sleep 12; fi
  kill -TERM $S; wait $S
  python3 -c "
import statistics, sys
u = [int(l.split(',')[2]) for l in open(sys.argv[1]) if not l.startswith('#') and l.count(',') >= 3]
print(sys.argv[2], 'samples', len(u), 'median utilization', statistics.median(u) if u else None)" "$OUT/samples-$load.csv" $load
done
python3 benchmarks/layer_extract.py --source "$SP" --layers 12 --max-gb 3 --repeat 1 --work /tmp/layers \
  --json "$OUT/layer-extract.json" > "$OUT/layer-extract.txt" 2>&1
cat "$OUT/machine.txt"; head -12 "$OUT/lazy-bytes.txt"; grep -m3 -A3 '"bytes"\|by_directory' "$OUT/lazy-bytes.txt"; cat "$OUT/layer-extract.txt"
