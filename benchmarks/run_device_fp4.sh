#!/usr/bin/env bash
# One device call for the NVFP4 / MX kernels: GPU tests, then the benchmark; logs in $OUT.
# Usage: bash benchmarks/run_device_fp4.sh "<stages>" [bench args]   stages: tests,bench
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
STAGES=${1:-tests,bench}; shift || true
T_TESTS=${T_TESTS:-100}; T_BENCH=${T_BENCH:-230}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
if [[ $STAGES == *tests* ]]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.15 timeout "$T_TESTS" \
    python3 -m pytest -q -m gpu -n 6 -rf --durations=5 tests/kernels/test_pallas_fp4_gpu.py \
    > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?"; tail -40 "$OUT/pytest.log" | cut -c1-400
fi
if [[ $STAGES == *bench* ]]; then
  timeout "$T_BENCH" python3 benchmarks/bench_fp4_mx.py --out "$OUT" "$@" \
    > "$OUT/bench.log" 2>&1; echo "bench rc=$?"
  grep -vE "Deprecat|warn|^\s*$" "$OUT/bench.log" | grep -E "device:|cases:|x$|ERROR" | cut -c1-150 | tail -90
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
