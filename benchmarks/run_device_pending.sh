#!/usr/bin/env bash
# One device call for what CPU-only sessions left unverified on the GPU (sessions 32-33): the
# activation kernels' GPU tests (NaN rows included), the activation rules and NaN propagation on
# XLA:GPU, matmul under vmap / grad / x64 with the real kernels (session 34: test_transforms),
# the W8A8 GPU tests now that the FP8 codes kernel serves every M, then the MX operand
# kernel's time against XLA's rule and the products with it. Each stage time-boxed; logs and JSON
# in $OUT.
# Usage: bash benchmarks/run_device_pending.sh "<stages>"   stages: tests,w8a8,act,mx (in order),
#   then outdtype (test_out_dtype + bench_out_dtype), kgpu (the FP8 / 4-bit kernels' GPU tests),
#   krest (every other GPU test of the kernels, dispatch and numerics), ue8m0 (DeepSeek-V3.1's
#   activation rule on the FP8 block kernel: its GPU tests and time), group (session 40's
#   e4m3_group_codes: GPU tests -- with session 41's bounded fbgemm_fp8 codes -- and its A/B),
#   amax_ab (session 40's one-integer abs_max against OLD, the tree before it), rows8 / rows4
#   (README rows; ROWS8_FORMATS, ROWS8_MODES, M_ROWS8, ROWS8_SHAPES: rows8's), finish
#   (session 42's in-kernel finish of the decode kernels: their GPU
#   tests and its time beside XLA's finish), finrows (session 43's FP8 finish default from
#   N = 8192: the GPU tests it changes, then the README's FP8 W8A16 M = 1 / 16 rows -- H200
#   only), divide (session 44: div_full's GPU test, then the NVFP4 / finish / deterministic GPU
#   tests of the group kernels and the Triton FP4 ones), splits (session 44: the FP8 decode at
#   1, 2, 4 K ranges, each with XLA's and the in-kernel finish, at N = 4096), divtime (session
#   44: the NVFP4 W4A16 decode and its finishes, this tree and OLD_DIV -- a tree of 9ae5105 --
#   one after the other), closed (session 45: a weight closed over by jit against one passed
#   in, every format, bitwise; also in tests), detfin (session 45: deterministic mode's
#   in-kernel finish -- its GPU tests, then probe_decode_finish --det), fold (session 46:
#   deterministic mode's folded decode launch -- its GPU tests, then probe_decode_finish
#   --det), smallm (session 46: FP8 weight-only M = 2-8, XLA's dense GEMM -- the dispatcher's
#   -- beside the decode kernel's two finishes), subnormal (session 47: probe_subnormal.py's
#   sweep, then four cases with PTX / HLO dumped), blockdet (session 48: probe_det_w8a8_mgpu.py --
#   block W8A8's Mosaic kernel rows across M bitwise, its time at decode beside both modes),
#   detspread (session 48: the same probe's --spread -- deterministic W8A8's K parts in the
#   program against as split_k programs, the launch choice spread_k_parts makes by M);
#   wgdet (session 49: fp8_block_det -- deterministic block W8A8 on Mosaic at every M: its GPU
#   tests, then probe_det_block_mgpu.py's launches beside both modes; session 50 added park
#   with 64 / 96 of 128 columns in shared memory, the rest in registers, measured in session
#   51; WGDET_BITWISE: the probe's --bitwise-shapes if set ("" none), WGDET_RUN: a suffix of its
#   files); suite1 .. suite4 (session 53: the whole GPU suite, `pytest -m gpu tests`, in four
#   parts of one call each -- test_group_a16_mgpu; the two FP8 a16 Mosaic files; the FP8 / FP4
#   dispatch kernels and the 4-bit decode; the rest -- logs $OUT/pytest_suite{1..4}.log; T_SUITE
#   the box; on an H100 (3 workers) the rest as one part ran 126 of its 218 tests in 400 s;
#   session 54, H100, platform allocator, 6-8 workers: part 1 98 s, part 2 175 s, parts 3 / 4
#   over 180 s -- suite2,suite3,suite4 with T_SUITE=180 ran all but 17, named in the logs);
#   (padrows, session 46's PAD_Y_ROWS: measured
#   in session 47 and removed);
#   w8a8's tests include session 41's bounded per-token spec (fp8_ptpc_bounded);
#   tests runs test_formats / test_qweight too (session 41: quantize jitted, 16-bit CT division)
#   and (session 46) test_subnormal_scales (the FP8 kernels apply subnormal float32 scales)
#   OLD=<dir>  an earlier tree (git archive ... | tar -x -C build/old): the act stage times its
#              NVFP4 operand and FP8 codes kernels beside this tree's (the NaN handling's cost)
#   M_LIST, K_LIST, SHAPES: the act / mx stages' sizes; T_*: the boxes (s)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
STAGES=${1:-tests,w8a8,act,mx}
M_LIST=${M_LIST:-1,16,64,256,4096}; K_LIST=${K_LIST:-4096,8192}
SHAPES=${SHAPES:-4096x4096,8192x8192}
# The pytest stages' environment (session 54): the platform allocator hands each test's GPU
# memory back, so the one test that needs ~12+ GB (test_group_a16_mgpu's 24576x7168 rows; it
# once set every worker's share, and an H100 ran 3 workers) no longer caps the workers -- the
# tests' cost is host-side (compiles, numpy references) on 16 cores; one compilation cache for
# them. The whole GPU suite passed so with 6-8 workers on an H100 (suite1 .. suite4 below).
GPU_ENV=(env XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform
         JAX_COMPILATION_CACHE_DIR=/tmp/jqlin-pytest-cache
         JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0.5)
# probe_finish NAME BOX ARGS...: probe_decode_finish.py ARGS into $OUT/NAME.{json,log}, its rows
probe_finish() {
  local name=$1 box=$2; shift 2
  timeout "$box" python3 benchmarks/probe_decode_finish.py "$@" --out "$OUT/$name.json" \
    > "$OUT/$name.log" 2>&1
  echo "probe $name rc=$?"; grep -vE "Warn|warn" "$OUT/$name.log" | grep -E "^[a-z]" | tail -100 \
    | cut -c1-110
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
if [[ $STAGES == *tests* ]]; then
  timeout "${T_TESTS:-360}" "${GPU_ENV[@]}" python3 -m pytest -q -n 4 -rf --durations=5 \
    tests/kernels/test_act_quant.py tests/test_numerics.py tests/test_nonfinite_activations.py \
    tests/test_transforms.py tests/test_dispatch.py tests/test_formats.py tests/test_qweight.py \
    tests/test_closed_over_weights.py tests/test_subnormal_scales.py \
    > "$OUT/pytest_act.log" 2>&1; echo "pytest act rc=$?"
  tail -15 "$OUT/pytest_act.log" | cut -c1-300
fi
if [[ $STAGES == *w8a8* ]]; then
  timeout "${T_W8A8:-150}" "${GPU_ENV[@]}" python3 -m pytest -q -m gpu -n 6 -rf \
    tests/kernels/test_pallas_fp8.py \
    -k "(gpu_matches_reference or batch_invariant) and (ptpc or block or per_tensor) and not a16" \
    > "$OUT/pytest_w8a8.log" 2>&1; echo "pytest w8a8 rc=$?"
  tail -10 "$OUT/pytest_w8a8.log" | cut -c1-300
fi
if [[ $STAGES == *act* ]]; then
  if [[ -n ${OLD:-} ]]; then
    (cd "$OLD" && timeout "${T_ACT:-60}" python3 benchmarks/probe_act_quant.py \
      --formats nvfp4,fp8_ptpc --codes pallas --m "$M_LIST" --k "$K_LIST" \
      --out "$OUT/act_pallas_old.json" \
      > "$OUT/act_old.log" 2>&1); echo "act old rc=$?"
  fi
  for codes in xla pallas; do
    timeout "${T_ACT:-80}" python3 benchmarks/probe_act_quant.py \
      --formats nvfp4,fp8_ptpc,mxfp4,mxfp8 \
      --codes "$codes" --m "$M_LIST" --k "$K_LIST" --out "$OUT/act_$codes.json" \
      > "$OUT/act_$codes.log" 2>&1; echo "act $codes rc=$?"
    grep -vE "Warn|warn" "$OUT/act_$codes.log" | tail -8
  done
fi
if [[ $STAGES == *mx* ]]; then
  for act in auto pallas; do
    timeout "${T_MX:-90}" python3 benchmarks/decode_breakdown.py --shapes "$SHAPES" --m 1,16,4096 \
      --ops bf16,mxfp4,mxfp8 --act "$act" --out "$OUT/mx_breakdown_$act.json" \
      > "$OUT/mx_breakdown_$act.log" 2>&1; echo "mx breakdown $act rc=$?"
    grep -vE "Warn|warn" "$OUT/mx_breakdown_$act.log" | tail -12 | cut -c1-200
  done
fi
if [[ $STAGES == *outdtype* ]]; then  # (session 36's out_dtype, session 38's stacked parts)
  timeout "${T_ODT_TESTS:-300}" "${GPU_ENV[@]}" python3 -m pytest -v -n 4 --tb=short \
    -p no:cacheprovider tests/test_out_dtype.py > "$OUT/pytest_out_dtype.log" 2>&1
  echo "pytest out_dtype rc=$?"; grep -E "FAILED|[0-9]+ (passed|failed)" "$OUT/pytest_out_dtype.log"
  timeout "${T_ODT:-200}" python3 benchmarks/bench_out_dtype.py --reps 3 \
    --formats nvfp4_a16,mxfp4_a16,mxfp8_a16,fp8_per_channel_a16,fp8_block_a16,nvfp4 \
    --variants "${ODT_VARIANTS:-bf16_out,f32_out,f32_x,f16_x}" --shapes 8192x8192 \
    --m 1,16,256,4096 --out "$OUT/out_dtype.json" > "$OUT/out_dtype.log" 2>&1
  echo "bench out_dtype rc=$?"; grep -E "^probe" "$OUT/out_dtype.log" | cut -c1-200
fi
if [[ $STAGES == *kgpu* ]]; then  # every GPU test of the FP8 and 4-bit kernels (> 230 s)
  timeout "${T_KTESTS:-500}" "${GPU_ENV[@]}" python3 -m pytest -v -n 4 --tb=short -m gpu \
    -p no:cacheprovider tests/kernels/test_pallas_fp8.py tests/kernels/test_pallas_fp4_gpu.py \
    > "$OUT/pytest_kernels.log" 2>&1
  echo "pytest kernels rc=$?"; grep -E "FAILED|[0-9]+ (passed|failed)" "$OUT/pytest_kernels.log"
fi
if [[ $STAGES == *krest* ]]; then  # the other kernels' GPU tests and the GPU dispatch / numerics
  # tests (H100, -n 4 at 0.15: 363 tests, > 560 s; KREST_K: a -k filter)
  timeout "${T_KREST:-560}" "${GPU_ENV[@]}" python3 -m pytest -v -n 4 --tb=short \
    -m gpu -p no:cacheprovider ${KREST_K:+-k "$KREST_K"} tests/kernels/test_act_quant.py \
    tests/kernels/test_fp8_a16_decode_mgpu.py tests/kernels/test_fp8_block_a16_mgpu.py \
    tests/kernels/test_fp8_block_mgpu.py tests/kernels/test_fp8_widen.py \
    tests/kernels/test_group_a16_decode_mgpu.py tests/kernels/test_group_a16_mgpu.py \
    tests/kernels/test_group_dequant.py tests/test_dispatch.py tests/test_numerics.py \
    > "$OUT/pytest_krest.log" 2>&1
  echo "pytest krest rc=$?"; grep -E "FAILED|[0-9]+ (passed|failed)" "$OUT/pytest_krest.log"
fi
if [[ $STAGES == *ue8m0* ]]; then  # DeepSeek-V3.1 ue8m0 activations on the FP8 block kernel
  timeout "${T_UE8M0_TESTS:-240}" "${GPU_ENV[@]}" python3 -m pytest -v -n 4 \
    --tb=short -p no:cacheprovider tests/kernels/test_act_quant.py tests/kernels/test_pallas_fp8.py \
    tests/test_numerics.py tests/checkpoint/test_handbuilt.py -k "deepseek or ue8m0" \
    > "$OUT/pytest_ue8m0.log" 2>&1
  echo "pytest ue8m0 rc=$?"; grep -E "FAILED|[0-9]+ (passed|failed)" "$OUT/pytest_ue8m0.log"
  # its time beside fp8_block's (the spec has no registered name: registered here, for the run)
  timeout "${T_UE8M0:-240}" python3 benchmarks/bench_ue8m0.py --reps 3 --xla-ref-max-m 0 \
    --modes default --formats fp8_block,fp8_block_ue8m0 --shapes deepseek-v3 \
    --m "${M_UE8M0:-1,16,256,4096}" --out "$OUT/ue8m0" > "$OUT/ue8m0.log" 2>&1
  echo "bench ue8m0 rc=$?"; tail -3 "$OUT/ue8m0.log" | cut -c1-200
fi
if [[ $STAGES == *group* ]]; then  # session 40's e4m3_group_codes: GPU tests, then its A/B
  timeout "${T_GROUP_TESTS:-200}" "${GPU_ENV[@]}" python3 -m pytest -v -n 4 \
    --tb=short -p no:cacheprovider -m gpu tests/kernels/test_act_quant.py -k codes \
    > "$OUT/pytest_group.log" 2>&1
  echo "pytest group rc=$?"; grep -E "FAILED|[0-9]+ (passed|failed)" "$OUT/pytest_group.log"
  for codes in pallas pallas_group; do
    timeout 80 python3 benchmarks/probe_act_quant.py --formats fp8_block --codes "$codes" \
      --m 1,16,256,4096 --k 7168,18432 --out "$OUT/group_codes_$codes.json" \
      > "$OUT/group_codes_$codes.log" 2>&1; echo "codes $codes rc=$?"
    grep -vE "Warn|warn" "$OUT/group_codes_$codes.log" | tail -8
  done
  for act in pallas group; do
    timeout 150 python3 benchmarks/bench_ue8m0.py --script decode_breakdown.py --act "$act" \
      --ops fp8_block,fp8_block_ue8m0 --shapes 18432x7168,7168x24576 --m 1,16,256,4096 \
      --reps 10 --out "$OUT/group_breakdown_$act.json" > "$OUT/group_breakdown_$act.log" 2>&1
    echo "breakdown $act rc=$?"; grep -vE "Warn|warn" "$OUT/group_breakdown_$act.log" | cut -c1-160
  done
fi
if [[ $STAGES == *amax_ab* ]]; then  # abs_max as one integer max (4d54cad) vs OLD (3e3c60c)
  for t in old new; do
    d=.; [[ $t == old ]] && d=${OLD:?amax_ab needs OLD=<a tree of 3e3c60c>}
    (cd "$d" && timeout "${T_AMAX:-240}" python3 benchmarks/bench_matmul.py --reps 3 \
      --xla-ref-max-m 0 --modes default --formats fp8_block,fp8_ptpc \
      --shapes 18432x7168,4096x4096 --m 1,16,256,4096 --out "$OUT/amax_ab_$t" \
      > "$OUT/amax_ab_$t.log" 2>&1); echo "amax_ab $t rc=$?"; tail -2 "$OUT/amax_ab_$t.log" | cut -c1-200
  done
fi
if [[ $STAGES == *rows8* ]]; then  # the README's W8A8 rows (they predate session 31's codes;
  # H100, session 47: 70-146 s of compiles a shape -- ROWS8_SHAPES=llama3-8b, ... one a call)
  timeout "${T_ROWS8:-300}" python3 benchmarks/bench_matmul.py --reps 3 --xla-ref-max-m 0 \
    --modes "${ROWS8_MODES:-default}" --formats "${ROWS8_FORMATS:-fp8_ptpc,fp8_block,fp8_per_tensor}" \
    --shapes "${ROWS8_SHAPES:-all}" \
    --m "${M_ROWS8:-1,16,256,1024,4096}" --out "$OUT/rows8" > "$OUT/rows8.log" 2>&1
  echo "rows8 rc=$?"; tail -3 "$OUT/rows8.log" | cut -c1-200
fi
if [[ $STAGES == *rows4* ]]; then  # W+A 4-bit / MX rows at decode (the activation kernels)
  timeout "${T_ROWS4:-200}" python3 benchmarks/bench_matmul.py --reps 3 --xla-ref-max-m 0 \
    --modes default --formats nvfp4,mxfp4,mxfp8 --shapes all --m 1,16 --out "$OUT/rows4" \
    > "$OUT/rows4.log" 2>&1; echo "rows4 rc=$?"; tail -3 "$OUT/rows4.log" | cut -c1-200
fi
if [[ $STAGES == *finish* ]]; then  # session 42's in-kernel finish of the decode kernels
  timeout "${T_FIN_TESTS:-300}" "${GPU_ENV[@]}" python3 -m pytest -v -n 4 --tb=short \
    -p no:cacheprovider -m gpu tests/kernels/test_fp8_a16_decode_mgpu.py \
    tests/kernels/test_group_a16_decode_mgpu.py > "$OUT/pytest_finish.log" 2>&1
  echo "pytest finish rc=$?"; grep -E "FAILED|[0-9]+ (passed|failed)" "$OUT/pytest_finish.log"
  probe_finish finish "${T_FIN:-240}" --m 1,16 --shapes "${FIN_SHAPES:-all}" \
    --formats "${FIN_FORMATS:-fp8_per_channel_a16,fp8_block_a16,nvfp4_a16}"
fi
if [[ $STAGES == *blockdet* ]]; then  # session 48: deterministic block W8A8 on Mosaic at every M?
  timeout "${T_BLOCKDET:-300}" python3 benchmarks/probe_det_w8a8_mgpu.py \
    --shapes "${BLOCKDET_SHAPES:-all}" --m "${BLOCKDET_M:-1,16,256}" --out "$OUT/det_w8a8.json" \
    > "$OUT/det_w8a8.log" 2>&1
  echo "det_w8a8 rc=$?"; grep -E "^bitwise|fp8_block" "$OUT/det_w8a8.log" | cut -c1-118 | tail -60
fi
if [[ $STAGES == *detspread* ]]; then  # session 48: deterministic W8A8's parts spread by M
  timeout "${T_SPREAD:-400}" python3 benchmarks/probe_det_w8a8_mgpu.py --spread \
    --formats "${SPREAD_FORMATS:-fp8_block,fp8_ptpc}" --shapes "${SPREAD_SHAPES:-all}" \
    --m "${SPREAD_M:-1,64,256,1024}" --out "$OUT/det_spread.json" > "$OUT/det_spread.log" 2>&1
  echo "det_spread rc=$?"; grep -E "fp8_" "$OUT/det_spread.log" | cut -c1-118 | tail -200
fi
SUITE_SPLIT=(tests/kernels/test_group_a16_mgpu.py
             "tests/kernels/test_fp8_block_a16_mgpu.py tests/kernels/test_fp8_a16_decode_mgpu.py"
             "tests/kernels/test_pallas_fp8.py tests/kernels/test_pallas_fp4_gpu.py
              tests/kernels/test_group_a16_decode_mgpu.py")
for part in 1 2 3 4; do
  [[ $STAGES == *suite$part* ]] || continue
  if (( part < 4 )); then files=(${SUITE_SPLIT[part - 1]}); else
    files=(tests)
    for f in ${SUITE_SPLIT[@]}; do files+=(--ignore "$f"); done
  fi
  # -v names each test that passed and SIGINT at the box still prints the summary, so a part
  # cut short says what is left (session 54)
  timeout -s INT -k 20 "${T_SUITE:-560}" "${GPU_ENV[@]}" \
    python3 -m pytest -v -rf -n "${SUITE_WORKERS:-6}" \
    --tb=short -m gpu -p no:cacheprovider --durations=15 "${files[@]}" \
    > "$OUT/pytest_suite$part.log" 2>&1
  echo "pytest suite$part rc=$?"
  grep -E "^FAILED|^ERROR|[0-9]+ (passed|failed)" "$OUT/pytest_suite$part.log"
done
if [[ $STAGES == *wgdet* ]]; then  # session 49: fp8_block_det -- its GPU tests, then its launches
  timeout "${T_WGDET_TESTS:-240}" python3 -m pytest -q -p no:cacheprovider -m gpu --tb=short \
    tests/kernels/test_fp8_block_det.py > "$OUT/pytest_wgdet.log" 2>&1
  echo "pytest wgdet rc=$?"; grep -E "FAILED|[0-9]+ (passed|failed)" "$OUT/pytest_wgdet.log"
  BITWISE=(); [[ -v WGDET_BITWISE ]] && BITWISE=(--bitwise-shapes "$WGDET_BITWISE")
  timeout "${T_WGDET:-340}" python3 benchmarks/probe_det_block_mgpu.py \
    --shapes "${WGDET_SHAPES:-4096x4096,7168x36864,14336x4096}" \
    --m "${WGDET_M:-1,16,32,64,128,256,1024,4096}" \
    "${BITWISE[@]}" --out "$OUT/det_block${WGDET_RUN:-}.json" \
    > "$OUT/det_block${WGDET_RUN:-}.log" 2>&1
  echo "det_block rc=$?"; grep -E "^\{|fp8_block" "$OUT/det_block${WGDET_RUN:-}.log" | cut -c1-118 | tail -150
fi
if [[ $STAGES == *finrows* ]]; then  # session 43: the FP8 decode kernel's finish from N = 8192
  timeout "${T_FR_TESTS:-200}" "${GPU_ENV[@]}" python3 -m pytest -v -n 4 --tb=short \
    -p no:cacheprovider -m gpu tests/kernels/test_fp8_a16_decode_mgpu.py \
    -k "in_kernel_finish or matches_float64" > "$OUT/pytest_finrows.log" 2>&1
  echo "pytest finrows rc=$?"; grep -E "FAILED|[0-9]+ (passed|failed)" "$OUT/pytest_finrows.log"
  if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    timeout "${T_ROWS:-240}" python3 benchmarks/bench_matmul.py --reps 3 --xla-ref-max-m 0 \
      --modes default --formats fp8_per_tensor_a16,fp8_per_channel_a16,fp8_block_a16 \
      --shapes all --m 1,16 --out "$OUT/rows_fp8a16" > "$OUT/rows_fp8a16.log" 2>&1
    echo "rows fp8a16 rc=$?"; tail -3 "$OUT/rows_fp8a16.log" | cut -c1-200
  else echo "finrows: README rows need an H200"; fi
fi
if [[ $STAGES == *divide* ]]; then  # session 44: the finishes divide as XLA:GPU does
  timeout "${T_DIV:-90}" python3 -m pytest -q -s -p no:cacheprovider -m gpu \
    tests/kernels/test_mgpu_divide.py > "$OUT/pytest_divide.log" 2>&1
  echo "pytest divide rc=$?"; grep -E "not IEEE|[0-9]+ (passed|failed)" "$OUT/pytest_divide.log"
  timeout "${T_DIV_FIN:-150}" "${GPU_ENV[@]}" python3 -m pytest -q -n 4 \
    --tb=short -p no:cacheprovider -m gpu tests/kernels/test_group_a16_decode_mgpu.py \
    -k "${DIV_FIN_K:-in_kernel_finish}" > "$OUT/pytest_div_finish.log" 2>&1
  echo "pytest div finish rc=$?"; grep -E "Mismatch|M=|FAILED|[0-9]+ (passed|failed)" \
    "$OUT/pytest_div_finish.log" | head -20
  timeout "${T_DIV_GROUP:-300}" "${GPU_ENV[@]}" python3 -m pytest -v -n 4 \
    --tb=short -p no:cacheprovider -m gpu tests/kernels/test_group_a16_decode_mgpu.py \
    tests/kernels/test_group_a16_mgpu.py tests/kernels/test_pallas_fp4_gpu.py \
    -k "${DIV_K:-(nvfp4 or deterministic) and not in_kernel_finish}" \
    > "$OUT/pytest_group_div.log" 2>&1
  echo "pytest group div rc=$?"; grep -E "FAILED|[0-9]+ (passed|failed)" "$OUT/pytest_group_div.log"
fi
if [[ $STAGES == *divtime* ]]; then  # session 44: div_full's finishes against 9ae5105's time
  for t in old new; do
    d=.; [[ $t == old ]] && d=${OLD_DIV:?divtime needs OLD_DIV=<a tree of 9ae5105>}
    (cd "$d" && timeout "${T_DIVTIME:-70}" python3 benchmarks/probe_decode_finish.py \
      --formats nvfp4_a16 --shapes 4096x4096,8192x8192,4096x28672 --m 1,16 --reps 3 \
      --out "$OUT/divtime_$t.json" > "$OUT/divtime_$t.log" 2>&1); echo "divtime $t rc=$?"
    grep -E "nvfp4|bf16" "$OUT/divtime_$t.log" | grep -v Warn | sort -u | cut -c1-100
  done
fi
if [[ $STAGES == *detfin* ]]; then  # session 45: deterministic mode's in-kernel finish
  timeout "${T_DF_TESTS:-240}" "${GPU_ENV[@]}" python3 -m pytest -v -n 4 \
    --tb=short -p no:cacheprovider -m gpu tests/kernels/test_fp8_a16_decode_mgpu.py \
    tests/kernels/test_group_a16_decode_mgpu.py -k deterministic_in_kernel_finish \
    > "$OUT/pytest_detfin.log" 2>&1
  echo "pytest detfin rc=$?"; grep -E "Mismatch|M=|FAILED|[0-9]+ (passed|failed)" \
    "$OUT/pytest_detfin.log" | head -30
  probe_finish detfin "${T_DF:-240}" --det --m 1,8,16 \
    --formats "${DF_FORMATS:-fp8_per_channel_a16,fp8_block_a16,nvfp4_a16}" \
    --shapes "${DF_SHAPES:-4096x4096,4096x6144,4096x28672,14336x4096}"
fi
if [[ $STAGES == *closed* ]]; then  # session 45: a closed-over weight's bits are a passed one's
  timeout "${T_CLOSED:-150}" "${GPU_ENV[@]}" python3 -m pytest -v -n 4 --tb=short \
    -p no:cacheprovider -m gpu tests/test_closed_over_weights.py > "$OUT/pytest_closed.log" 2>&1
  echo "pytest closed rc=$?"; grep -E "Mismatch|M=|FAILED|[0-9]+ (passed|failed)" \
    "$OUT/pytest_closed.log" | head -30
fi
if [[ $STAGES == *fold* ]]; then  # session 46: deterministic mode's folded decode launch
  timeout "${T_FOLD_TESTS:-200}" "${GPU_ENV[@]}" python3 -m pytest -v -n 4 \
    --tb=short -p no:cacheprovider -m gpu tests/kernels/test_fp8_a16_decode_mgpu.py \
    -k "folded or deterministic_order or deterministic_in_kernel" > "$OUT/pytest_fold.log" 2>&1
  echo "pytest fold rc=$?"; grep -E "Mismatch|M=|FAILED|[0-9]+ (passed|failed)" \
    "$OUT/pytest_fold.log" | head -30
  probe_finish fold "${T_FOLD:-160}" --det --m 1,8,16 \
    --formats "${FOLD_FORMATS:-fp8_per_channel_a16}" \
    --shapes "${FOLD_SHAPES:-4096x28672,8192x8192,7168x24576}"
fi
if [[ $STAGES == *smallm* ]]; then  # session 46: FP8 weight-only M = 2-8, dense vs the decode
  # kernel (its in-kernel finish from N = 8192 beat the dense GEMM at M = 8 on 3 shapes, H100)
  probe_finish smallm "${T_SMALLM:-300}" --m 2,4,8 \
    --formats "${SM_FORMATS:-fp8_per_channel_a16}" --shapes "${SM_SHAPES:-all}"
fi
if [[ $STAGES == *subnormal* ]]; then  # session 47: which paths flush subnormal float32 scales
  timeout "${T_SUB:-220}" python3 benchmarks/probe_subnormal.py --m "${SUB_M:-1,64,300}" \
    --exps="${SUB_EXPS:--126,-135}" --out "$OUT/subnormal.json" > "$OUT/subnormal.log" 2>&1
  echo "probe subnormal rc=$?"; grep -vE "Warn|warn" "$OUT/subnormal.log" | cut -c1-230
  for c in ${SUB_CASES:-fp8_per_tensor:64 fp8_per_tensor_a16:300 fp8_block_a16:300 fp8_block:300}; do
    d="$OUT/dump_${c/:/_}"; mkdir -p "$d"
    MOSAIC_GPU_DUMP_PTX=1 MOSAIC_GPU_DUMP_TO="$d" XLA_FLAGS="--xla_dump_to=$d/xla --xla_dump_hlo_as_text" \
      timeout 90 python3 benchmarks/probe_subnormal.py --case "$c" > "$d.log" 2>&1
    echo "case $c rc=$?"; grep -E "^\{" "$d.log" | cut -c1-300
    python3 benchmarks/probe_subnormal.py --summarize "$d" | grep -E "ftz|alpha|gemm|custom" | head -12
    tar czf "$d.tgz" -C "$d" . && rm -rf "$d"
  done
fi
if [[ $STAGES == *splits* ]]; then  # session 44: the FP8 decode's K ranges x finish at N = 4096
  probe_finish splits "${T_SPLITS:-150}" --m 1,16 \
    --formats "${SPL_FORMATS:-fp8_per_channel_a16}" --splits "${SPL_SPLITS:-1,2,4}" \
    --shapes "${SPL_SHAPES:-4096x4096,14336x4096}"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
