#!/usr/bin/env bash
# One call on a machine of several GPUs: lanes side by side, each a list of steps run in order
# (each time-boxed), one measuring process per GPU at a time. Lane i runs on GPU i, or on the
# GPUs listed in GPUS<i> (the tp step needs two or more). Logs and results are packed into
# $OUT/results.tgz (the device tool returns at most 8 files).
#   LANE0="tests sweep:v4" LANE1="grid:<shapes>:<m>" GPUS2=2,3 LANE2="tp" \
#     bash benchmarks/run_device_lanes.sh
# Steps: tests (all GPU-marked tests; PYTEST_K selects by -k), grid:<shapes>:<m> (FP8 grid of bench_matmul.py),
#        fp4:<shapes>:<m> (NVFP4/MX grid of bench_fp4_mx.py), sweep:<parts> (sweep_fp8.py,
#        e.g. sweep:v4), fp4parts:<parts> (bench_fp4_mx.py --parts, e.g. fp4parts:decode),
#        tp (tests/models/tp_check.py and bench_tp.py over the lane's GPUs; TP_CHECKS selects
#        tp_check's groups, TP_ARGS bench_tp's arguments),
#        probe (benchmarks/probe_det_mgpu.py; T_PROBE),
#        probew4[:<shapes>:<m>] (benchmarks/probe_w4_mgpu.py; T_PROBE, PROBE_ARGS),
#        ncu (Nsight Compute on benchmarks/profile_cases.py's decode kernels; T_NCU),
#        prefill (benchmarks/profile_prefill.py's per-kernel times; T_PREFILL, PREFILL_CALLS,
#        PREFILL_ONLY: a regex of the cases).
set -u
DEADLINE=${DEADLINE:-560}  # seconds after start by which every step has ended (call limit 600)
box() { local left=$(( DEADLINE - SECONDS )); (( left < $1 )) && echo $(( left > 5 ? left : 5 )) || echo "$1"; }
PACK=${OUT:-/tmp/out}; OUT=/tmp/lanes_out; rm -rf "$OUT"; mkdir -p "$PACK" "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0  # NVLink multicast stays off (device README)
FP8_FORMATS=${FP8_FORMATS:-fp8_per_tensor_a16,fp8_per_channel_a16,fp8_block_a16,fp8_per_tensor,fp8_ptpc,fp8_block}
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
lane() {  # lane <gpus> <steps...>
  local gpus=$1; shift
  local gpu=${gpus%%,*}  # steps other than tp run on the lane's first GPU
  local n=0
  for step in "$@"; do
    IFS=: read -r what shapes ms <<< "$step"; n=$((n + 1))
    echo "== gpu$gpu $step $(date +%T)"
    case $what in
      tp)
        local ngpu=$(( $(tr -cd , <<< "$gpus" | wc -c) + 1 ))
        { if [[ ${T_TPCHECK:-200} != 0 ]]; then  # T_TPCHECK=0: benchmark only
            CUDA_VISIBLE_DEVICES=$gpus timeout "$(box ${T_TPCHECK:-200})" \
              python3 tests/models/tp_check.py .fixtures "$ngpu" ${TP_CHECKS:-}
            echo "tp_check rc=$?"; fi
          CUDA_VISIBLE_DEVICES=$gpus timeout "$(box ${T_TPBENCH:-250})" python3 benchmarks/bench_tp.py \
            ${TP_ARGS:-} --out "$OUT/tp_x$ngpu.json"
          echo "bench_tp rc=$?"; } > "$OUT/tp_x$ngpu.log" 2>&1
        grep -E "^ok|ALL OK|rc=|Error|layers=" "$OUT/tp_x$ngpu.log";;
      tests)
        XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.1 \
          CUDA_VISIBLE_DEVICES=$gpu timeout "$(box ${T_TESTS:-300})" python3 -m pytest -q -m gpu -n 8 \
          -rf -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} tests/kernels/test_pallas_fp8.py \
          tests/kernels/test_pallas_fp4_gpu.py tests/kernels/test_fp8_block_mgpu.py \
          tests/kernels/test_fp8_block_a16_mgpu.py tests/kernels/test_fp8_a16_decode_mgpu.py tests/kernels/test_group_a16_mgpu.py \
          tests/kernels/test_fp8_widen.py tests/kernels/test_group_dequant.py \
          tests/test_dispatch.py 2>&1 | tail -40
        echo "pytest rc=${PIPESTATUS[0]}";;
      grid)
        CUDA_VISIBLE_DEVICES=$gpu timeout "$(box ${T_GRID:-500})" python3 benchmarks/bench_matmul.py \
          --formats $FP8_FORMATS --reps 3 --det-formats "${GRID_DET-fp8_per_channel_a16,fp8_ptpc,fp8_block}" \
          --fast-convert-variant "${GRID_FAST-fp8_per_channel_a16,fp8_block_a16}" --shapes "$shapes" --m "$ms" \
          ${GRID_EXTRA:-} --out "/tmp/grid$gpu" 2>&1 | grep -E "device:|cases:|Error|rror:" | head -40
        echo "grid rc=${PIPESTATUS[0]}"; cp /tmp/grid$gpu/bench.jsonl "$OUT/grid_gpu${gpu}_$n.jsonl";;
      fp4)
        CUDA_VISIBLE_DEVICES=$gpu timeout "$(box ${T_FP4:-500})" python3 benchmarks/bench_fp4_mx.py \
          --parts grid --reps 3 --shapes "$shapes" --m "$ms" ${FP4_EXTRA:-} --out "/tmp/fp4_$gpu" 2>&1 \
          | grep -E "device:|cases:|Error|rror:" | head -40
        echo "fp4 rc=${PIPESTATUS[0]}"; cp /tmp/fp4_$gpu/*.jsonl "$OUT/fp4_gpu${gpu}_$n.jsonl";;
      sweep)
        CUDA_VISIBLE_DEVICES=$gpu timeout "$(box ${T_SWEEP:-300})" python3 benchmarks/sweep_fp8.py \
          --parts "$shapes" --out "$OUT/sweep_gpu${gpu}_$n.json" > "/tmp/sweep$gpu.log" 2>&1
        echo "sweep rc=$?"; python3 benchmarks/sweep_fp8.py --summary "$OUT/sweep_gpu${gpu}_$n.json";;
      probe)  # are the Mosaic kernels bitwise the Triton deterministic schedules?
        CUDA_VISIBLE_DEVICES=$gpu timeout "$(box ${T_PROBE:-200})" python3 \
          benchmarks/probe_det_mgpu.py --out "$OUT/probe_det_gpu$gpu.json" > "/tmp/probe$gpu.log" 2>&1
        echo "probe rc=$?"; grep -oE "'kind': '[a-z0-9_]+', 'k': [0-9]+, 'n': [0-9]+, 'm': [0-9]+|'bitwise': [A-Za-z]+, 'equal_frac': [0-9.e-]+" \
          "/tmp/probe$gpu.log" | paste - - | head -60; grep -E "Error|rror:" "/tmp/probe$gpu.log" | head -5;;
      probew4)  # how fast a Mosaic kernel streams 4-bit weights (benchmarks/probe_w4_mgpu.py)
        CUDA_VISIBLE_DEVICES=$gpu timeout "$(box ${T_PROBE:-300})" python3 \
          benchmarks/probe_w4_mgpu.py --shapes "${shapes:-all}" --m "${ms:-1,16}" ${PROBE_ARGS:-} \
          --out "$OUT/probe_w4_gpu$gpu.json" > "/tmp/probew4$gpu.log" 2>&1
        echo "probew4 rc=$?"; grep -E " bf16 | nvfp4_a16:| fp8_block_a16:|rror" "/tmp/probew4$gpu.log" \
          | cut -c1-130 | head -80;;
      ncu)  # Nsight Compute on the decode kernels of profile_cases.py (filtered by name)
        CUDA_VISIBLE_DEVICES=$gpu timeout "$(box ${T_NCU:-240})" ncu --target-processes all \
          -k regex:fp8_w8a -c 8 --csv --page details --section SpeedOfLight \
          --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
          --section WarpStateStats python3 benchmarks/profile_cases.py \
          > "$OUT/ncu_gpu$gpu.csv" 2> "$OUT/ncu_gpu$gpu.err"
        echo "ncu rc=$?"; tail -3 "$OUT/ncu_gpu$gpu.err"
        python3 benchmarks/ncu_summary.py "$OUT/ncu_gpu$gpu.csv" --kernels fp8_w8a 2>&1 | head -60;;
      prefill)  # per-kernel times at M=4096, 8192x8192 (benchmarks/profile_prefill.py)
        CUDA_VISIBLE_DEVICES=$gpu timeout "$(box ${T_PREFILL:-240})" python3 \
          benchmarks/profile_prefill.py --calls "${PREFILL_CALLS:-10}" ${PREFILL_ONLY:+--only "$PREFILL_ONLY"} \
          --out "$OUT/prefill_gpu${gpu}_$n.json" > "/tmp/prefill$gpu.log" 2>&1
        echo "prefill rc=$?"; grep -E " us,|bitwise|rror" "/tmp/prefill$gpu.log" | cut -c1-160 | head -60;;
      fp4parts)
        CUDA_VISIBLE_DEVICES=$gpu timeout "$(box ${T_FP4:-500})" python3 benchmarks/bench_fp4_mx.py \
          --parts "$shapes" --reps 3 --out "/tmp/fp4p_$gpu" > "/tmp/fp4p$gpu.log" 2>&1
        echo "fp4parts rc=$?"; cp /tmp/fp4p_$gpu/*.jsonl "$OUT/fp4parts_gpu${gpu}_$n.jsonl"
        grep -E "var\[|ERROR" "/tmp/fp4p$gpu.log" | head -80;;
    esac
  done
}
used=" "  # one measuring process per GPU: lanes may not share one (session 2's lesson)
for i in 0 1 2 3 4 5 6 7; do
  steps=LANE$i gpus=GPUS$i
  [[ -z ${!steps:-} ]] && continue
  for g in $(tr , ' ' <<< "${!gpus:-$i}"); do
    [[ $used == *" $g "* ]] && { echo "run_device_lanes: GPU $g is in two lanes (LANE$i)"; exit 2; }
    used+="$g "
  done
done
for i in 0 1 2 3 4 5 6 7; do
  steps=LANE$i gpus=GPUS$i
  [[ -n ${!steps:-} ]] && lane "${!gpus:-$i}" ${!steps} > "$OUT/lane$i.log" 2>&1 &
done
wait
cat "$OUT"/lane*.log | grep -vE "Warning|warn" | cut -c1-300 | tail -120
nvidia-smi --query-gpu=index,name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
tar -C "$OUT" -czf "$PACK/results.tgz" . && ls -la "$OUT"
