#!/usr/bin/env bash
# One device call: GPU tests, config sweep, benchmark -- each stage time-boxed, logs in $OUT.
# Usage: bash benchmarks/run_device.sh "<stages>"
#   stages: any of probe,ncu,accuracy,sweep,tests,bench,full (run in that order); T_* env: boxes (s)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
STAGES=${1:-tests,sweep,bench}
T_TESTS=${T_TESTS:-120}; T_SWEEP=${T_SWEEP:-180}; T_BENCH=${T_BENCH:-80}; T_FULL=${T_FULL:-390}
FP8_FORMATS=fp8_per_tensor_a16,fp8_per_channel_a16,fp8_block_a16,fp8_per_tensor,fp8_ptpc,fp8_block
BENCH_ARGS=${BENCH_ARGS:---shapes 8192x8192 --m 1,16,4096 --formats $FP8_FORMATS}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
if [[ $STAGES == *probe* ]]; then
  timeout "${T_PROBE:-50}" python3 benchmarks/probe_fp8.py decode > "$OUT/probe_decode.log" 2>&1
  echo "probe decode rc=$?"; grep -E "us |TB/s|Error" "$OUT/probe_decode.log" | head -30
fi
if [[ $STAGES == *ncu* ]]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout "${T_NCU:-75}" "$NCU" --clock-control none -k regex:"w8a16|read" -c 6 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats python3 benchmarks/probe_fp8.py ncu \
    > "$OUT/ncu.txt" 2>&1; echo "ncu rc=$?"
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Stall|Block Limit" "$OUT/ncu.txt" | head -60
fi
if [[ $STAGES == *accuracy* ]]; then
  timeout "${T_ACC:-50}" python3 benchmarks/probe_fp8.py accuracy > "$OUT/probe_acc.log" 2>&1
  echo "probe accuracy rc=$?"; grep -vE "Warning|warn" "$OUT/probe_acc.log" | tail -30
fi
if [[ $STAGES == *sweep* ]]; then
  timeout "$T_SWEEP" python3 benchmarks/sweep_fp8.py --out "$OUT/sweep.json" \
    > "$OUT/sweep.log" 2>&1; echo "sweep rc=$?"
  python3 benchmarks/sweep_fp8.py --summary "$OUT/sweep.json"
fi
if [[ $STAGES == *tests* ]]; then
  XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.15 timeout "$T_TESTS" \
    python3 -m pytest -q -m gpu -n 8 -rf -s --durations=5 tests/kernels/test_pallas_fp8.py \
    > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?"; tail -25 "$OUT/pytest.log"
fi
if [[ $STAGES == *bench* ]]; then
  timeout "$T_BENCH" python3 benchmarks/bench_matmul.py $BENCH_ARGS --out "$OUT/bench" \
    > "$OUT/bench.log" 2>&1; echo "bench rc=$?"; grep -E "device:|cases:" "$OUT/bench.log"
fi
if [[ $STAGES == *full* ]]; then
  timeout "$T_FULL" python3 benchmarks/bench_matmul.py --formats $FP8_FORMATS --reps 3 \
    --det-formats fp8_per_channel_a16,fp8_ptpc,fp8_block \
    --fast-convert-variant fp8_per_channel_a16,fp8_block_a16 ${FULL_EXTRA:-} --out "$OUT/bench" \
    > "$OUT/bench.log" 2>&1; echo "bench rc=$?"; grep -E "device:|cases:" "$OUT/bench.log"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
