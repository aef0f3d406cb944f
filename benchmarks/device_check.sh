#!/usr/bin/env bash
# Every check that needs a CUDA device, in one call (a lent GPU machine's lease is minutes): the
# CUDA tests, bench_gram (gram.json: SparseGPT's Gram sums by precision), then bench_gpu
# (benchmarks/results/gpu.json, rewritten after each of its stages).
# Logs and a copy of gpu.json go to $OUT (default benchmarks/results/device). Needs only a stock
# GPU image (torch, transformers, safetensors, numpy, scipy, pytest) and a plain checkout:
#   OUT=/tmp/out benchmarks/device_check.sh COMMIT
# COMMIT names what is measured where the checkout has no .git. BENCH_SECONDS (default 420) stops
# bench_gpu in time for gpu.json to be copied out.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/device}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
commit=${1:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/nvidia-smi.csv" 2>&1
python -m pytest -q -rs -p no:cacheprovider tests/test_device.py tests/test_gpu_path.py tests/test_sparsegpt.py \
    2>&1 | tee "$OUT/pytest.log"
tests=${PIPESTATUS[0]}
python benchmarks/bench_gram.py --source-commit "$commit" 2>&1 | tee "$OUT/bench_gram.log"
cp benchmarks/results/gram.json "$OUT/" 2>/dev/null
timeout "${BENCH_SECONDS:-420}" python benchmarks/bench_gpu.py --source-commit "$commit" 2>&1 | tee "$OUT/bench_gpu.log"
bench=${PIPESTATUS[0]}
cp benchmarks/results/gpu.json "$OUT/" 2>/dev/null
echo "device_check: tests exit $tests, bench_gpu exit $bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
