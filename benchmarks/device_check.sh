#!/usr/bin/env bash
# Every check that needs a CUDA device, in one call (a lent GPU machine's lease is minutes), most
# wanted first: bench_sparse_inference (sparse_inference.json: a 2:4 model through the semi-structured
# kernels against the same model dense), bench_gpu (the clients at the 7B shape and the start-up
# floor under them), the CUDA tests, and, with GRAM=1, bench_gram (SparseGPT's Gram sums by precision).
# Each stage runs under its own time limit, so one that hangs leaves the others their time.
# Logs and copies of the JSON records go to $OUT (default benchmarks/results/device). Needs only a
# stock GPU image (torch, transformers, safetensors, numpy, scipy, pytest) and a plain checkout:
#   OUT=/tmp/out benchmarks/device_check.sh COMMIT
# COMMIT names what is measured where the checkout has no .git. Settings (environment):
#   GPU_METHODS  bench_gpu's --methods (default: wanda sparsegpt_update)
#   GPU_NAME     bench_gpu's --name (default gpu: benchmarks/results/gpu.json)
#   SPARSE_SECONDS, BENCH_SECONDS, TEST_SECONDS  each stage's limit (default 240, 420, 300)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/device}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
commit=${1:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
name=${GPU_NAME:-gpu}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/nvidia-smi.csv" 2>&1

timeout "${SPARSE_SECONDS:-240}" python benchmarks/bench_sparse_inference.py --source-commit "$commit" --profile 2>&1 \
    | tee "$OUT/bench_sparse_inference.log"
sparse=${PIPESTATUS[0]}
cp benchmarks/results/sparse_inference.json "$OUT/" 2>/dev/null

# shellcheck disable=SC2086 # GPU_METHODS is a list of words
timeout "${BENCH_SECONDS:-420}" python benchmarks/bench_gpu.py --source-commit "$commit" --name "$name" \
    --methods ${GPU_METHODS:-wanda sparsegpt_update} 2>&1 | tee "$OUT/bench_gpu.log"
bench=${PIPESTATUS[0]}
cp "benchmarks/results/$name.json" "$OUT/" 2>/dev/null

timeout "${TEST_SECONDS:-300}" python -m pytest -q -rs -p no:cacheprovider tests/test_device.py \
    tests/test_gpu_path.py tests/test_sparsegpt.py 2>&1 | tee "$OUT/pytest.log"
tests=${PIPESTATUS[0]}

gram=0
if [ "${GRAM:-0}" = 1 ]; then
    python benchmarks/bench_gram.py --source-commit "$commit" 2>&1 | tee "$OUT/bench_gram.log"
    gram=${PIPESTATUS[0]}
    cp benchmarks/results/gram.json "$OUT/" 2>/dev/null
fi
echo "device_check: bench_sparse_inference exit $sparse, bench_gpu exit $bench, tests exit $tests, bench_gram exit $gram"
[ "$sparse" -eq 0 ] && [ "$bench" -eq 0 ] && [ "$tests" -eq 0 ] && [ "$gram" -eq 0 ]
