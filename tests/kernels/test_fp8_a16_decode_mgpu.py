"""The plain-pipeline W8A16 decode kernel (pallas_kernels.fp8_a16_decode_mgpu): in Mosaic GPU's
interpreter (outputs start as NaN) within the float64 bound at M=1..16 with one K range or
several added by XLA, for per-channel, per-tensor and (session 28, path='decode' only) 128x128
block scales; it lowers for CUDA on CPU (with session 42's in-kernel finish too);
its launch rule and its argument checks; on the GPU (marked) the same at real sizes, and the
in-kernel finish bitwise XLA's finish of the slabs; deterministic mode's parts folded in the CTA
(session 46) bitwise their slabs' fold, in the interpreter (one range) and on the GPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from float64_bound import assert_within_bound
from jqlin import bench
from pallas_kernels.fp8_a16_decode_mgpu import (DECODE_MAX_M, FEW_CTAS, FILL_MIN,
                                                FINISH_IN_KERNEL_MIN_N, MAX_CLUSTER,
                                                MAX_STAGES, RESIDENT_CTAS, _fill, decode_fits,
                                                decode_params, det_order, finish_note,
                                                det_decode_launch, det_fold_parts,
                                                finishes_in_kernel,
                                                folds_parts, fp8_a16_decode_mgpu, plain_slabs,
                                                KernelFinish, takes_kernel_finish, writes_y_rows)
from pallas_kernels.launch import fold_parts
from pallas_kernels.mgpu_common import BLOCK, WG_ROWS, RowFinish

# float32 sums of exact bf16 x bf16(e4m3) products (wgmma), one scale multiply
ACC_RTOL = 1e-5
BENCH_SHAPES = [kn for shapes in bench.SHAPES.values() for kn in shapes]  # (K, N)


def _operands(rng, m, n, k, dtype, kind):
    x = jnp.asarray(rng.standard_normal((m, k)) * rng.uniform(0.1, 3, (m, 1)), dtype)
    w = jnp.asarray(rng.standard_normal((n, k)) * 4, jnp.float8_e4m3fn)
    shape = {"channel": (n, 1), "tensor": (1, 1), "block": (-(-n // 128), k // 128)}[kind]
    ws = jnp.asarray(rng.uniform(0.01, 2, shape), jnp.float32)
    return x, w, ws


def _check(y, x, w, ws):
    n, k = w.shape
    s = np.asarray(ws, np.float64)
    if s.shape[1] > 1:  # 128x128 blocks
        s = np.repeat(np.repeat(s, 128, axis=0)[:n], 128, axis=1)
    wd = np.asarray(w.astype(jnp.float32), np.float64) * np.broadcast_to(s, (n, k))
    xd = np.asarray(x.astype(jnp.float32), np.float64)
    assert y.shape == (x.shape[0], n) and y.dtype == x.dtype
    assert_within_bound(y, xd @ wd.T, np.abs(xd) @ np.abs(wd).T, ACC_RTOL, x.dtype)


@pytest.mark.parametrize("m,n,k,splits,kind,dtype", [
    (1, 192, 512, 1, "channel", jnp.bfloat16),  # one K range
    (1, 128, 512, 2, "tensor", jnp.bfloat16),  # K ranges, added by XLA
    (3, 128, 384, 1, "tensor", jnp.float16),  # three K-blocks, a per-tensor scale broadcast
    (9, 64, 1024, 4, "channel", jnp.bfloat16),  # x padded to 16 rows
    (16, 192, 256, 2, "channel", jnp.float16),
    (1, 192, 512, 2, "block", jnp.bfloat16),  # block scales: a partial 128-row block
    (7, 128, 384, 1, "block", jnp.float16),  # three K-blocks: the scale row padded to four
    (12, 256, 1024, 4, "block", jnp.bfloat16),
])
def test_interpreter_matches_float64(rng, m, n, k, splits, kind, dtype):
    x, w, ws = _operands(rng, m, n, k, dtype, kind)
    y = jax.jit(lambda *a: fp8_a16_decode_mgpu(*a, scale_kind=kind, splits=splits, stages=2,
                                               interpret=True))(x, w, ws)
    _check(y, x, w, ws)


def test_block_scales_run_when_the_decode_path_is_asked_for(rng):
    """fp8_w8a16 with 128x128 block scales and path='decode' runs this kernel, within the
    float64 bound; the auto rule takes it too at M=5 (block scales at M=2-8 since session 30),
    the Mosaic kernel beyond DECODE_BLOCK_MAX_K."""
    from pallas_kernels.fp8_paths import DECODE_BLOCK_MAX_K, fp8_path
    from pallas_kernels.fp8_w8a16 import w8a16_matmul
    x, w, ws = _operands(rng, 5, 256, 768, jnp.bfloat16, "block")
    _check(w8a16_matmul(x, w, ws, scale_kind="block", path="decode", interpret=True), x, w, ws)
    rule = dict(x_scale_kind="none", w_scale_kind="block", deterministic=False, interpret=True,
                n=256, x_dtype=x.dtype)
    assert fp8_path(5, k=768, **rule) == "decode"
    assert fp8_path(5, k=DECODE_BLOCK_MAX_K + 128, **rule) == "mgpu"


def _det_pair(x, w, ws, kind, interpret, range_parts=None):
    """(fp8_block_a16_mgpu's deterministic result, this kernel's), float32."""
    from pallas_kernels.fp8_block_a16_mgpu import fp8_block_a16_matmul_mgpu
    from pallas_kernels.fp8_core import mgpu_launch_params
    m, k = x.shape
    launch = mgpu_launch_params(True, m, w.shape[0], k, interpret, True)
    want = fp8_block_a16_matmul_mgpu(x, w, ws, scale_kind=kind, out_dtype=jnp.float32,
                                     interpret=interpret, **launch)
    got = fp8_a16_decode_mgpu(x, w, ws, scale_kind=kind, deterministic=True,
                              out_dtype=jnp.float32, range_parts=range_parts,
                              interpret=interpret)
    return want, got


@pytest.mark.parametrize("kind,m,n,k,range_parts", [
    ("channel", 11, 128, 2048, None),  # 8 parts, two groups
    ("tensor", 16, 256, 1024, None),
    ("block", 9, 256, 2048, None),
    ("channel", 12, 128, 896, None),  # 7 K-blocks: one part
    ("channel", 13, 128, 2048, 2),  # two parts a K range, each its own slab
    ("block", 10, 256, 3072, 4),  # four parts of 3 K-blocks a range
])
def test_deterministic_order_is_the_mosaic_kernels_bitwise(rng, kind, m, n, k, range_parts):
    """deterministic=True: fp8_block_a16_mgpu's deterministic sums to the last bit (float32
    output, interpreter; M 9-16, where both kernels' x tiles are 16 rows -- the interpreter's
    dot bits follow the tile width, the GPU's wgmma's do not), where default mode's differ;
    whatever number of parts a K range holds."""
    x, w, ws = _operands(rng, m, n, k, jnp.bfloat16, kind)
    want, got = _det_pair(x, w, ws, kind, True, range_parts)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    default = fp8_a16_decode_mgpu(x, w, ws, scale_kind=kind, out_dtype=jnp.float32,
                                  interpret=True)
    assert (np.asarray(default) != np.asarray(want)).any()  # (the check can tell orders apart)
    _check(got.astype(x.dtype), x, w, ws)


def test_deterministic_rows_keep_their_bits_across_m(rng):
    x, w, ws = _operands(rng, 6, 192, 1024, jnp.bfloat16, "channel")
    run = lambda x: fp8_a16_decode_mgpu(x, w, ws, scale_kind="channel", deterministic=True,
                                        out_dtype=jnp.float32, interpret=True)
    np.testing.assert_array_equal(np.asarray(run(x[4:5]))[0], np.asarray(run(x))[4])
    with pytest.raises(ValueError, match="leave splits unset"):
        fp8_a16_decode_mgpu(x, w, ws, scale_kind="channel", deterministic=True, splits=2,
                            interpret=True)
    with pytest.raises(ValueError, match="range_parts must divide this device's 8 K parts"):
        fp8_a16_decode_mgpu(x, w, ws, scale_kind="channel", deterministic=True, range_parts=3,
                            interpret=True)
    with pytest.raises(ValueError, match="range_parts is deterministic mode's"):
        fp8_a16_decode_mgpu(x, w, ws, scale_kind="channel", range_parts=2, interpret=True)
    # the fp8 kernel's path='decode' in deterministic mode is this order (asked for only)
    from pallas_kernels.fp8_w8a16 import w8a16_matmul
    got = w8a16_matmul(x, w, ws, scale_kind="channel", path="decode", deterministic=True,
                       interpret=True)
    want = fp8_a16_decode_mgpu(x, w, ws, scale_kind="channel", deterministic=True,
                               interpret=True)
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)),
                                  np.asarray(want.astype(jnp.float32)))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["channel", "tensor", "block"])
@pytest.mark.parametrize("k,n", [(4096, 4096), (7168, 24576), (8192, 8192)])
def test_gpu_deterministic_order_is_the_mosaic_kernels_bitwise(rng, kind, k, n):
    """On the H200 the deterministic order gives fp8_block_a16_mgpu's deterministic bits at
    M=1, 8, 9 and 16 -- what the dispatcher needs before it may run this kernel at M <= 16
    and that one above in deterministic mode (session 28: prepared, unrun)."""
    for m in (1, 8, 9, 16):
        x, w, ws = _operands(rng, m, n, k, jnp.bfloat16, kind)
        want, got = jax.jit(lambda *a: _det_pair(*a, kind, False))(x, w, ws)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"M={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["channel", "block"])
def test_gpu_deterministic_range_parts_keep_the_bits(rng, kind):
    """On the H200, 2, 4 and 8 of the parts a K range: fp8_block_a16_mgpu's deterministic bits
    still (each part's total its own slab), at M=1 and 16."""
    k, n = 8192, 8192
    for m in (1, 16):
        x, w, ws = _operands(rng, m, n, k, jnp.bfloat16, kind)
        for rp in (2, 4, 8):
            want, got = jax.jit(lambda *a, rp=rp: _det_pair(*a, kind, False, rp))(x, w, ws)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want),
                                          err_msg=f"M={m} range_parts={rp}")


def test_interpreter_launch_rule_matches_float64(rng):
    """decode_params' own launch (None: the rule's splits and stages) at M=1."""
    x, w, ws = _operands(rng, 1, 256, 512, jnp.bfloat16, "channel")
    _check(fp8_a16_decode_mgpu(x, w, ws, scale_kind="channel", interpret=True), x, w, ws)


@pytest.mark.parametrize("m,splits,kind", [(1, 1, "channel"), (1, 4, "channel"),
                                           (16, 1, "channel"), (11, 2, "channel"),
                                           (1, 2, "block"), (16, 4, "block"),
                                           (1, "det", "channel"), (16, "det", "tensor"),
                                           (9, "det", "block")])
def test_lowers_for_cuda_on_cpu(m, splits, kind):
    x = jnp.ones((m, 4096), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((4096, 4096), jnp.float8_e4m3fn)
    ws = jax.ShapeDtypeStruct({"channel": (4096, 1), "tensor": (1, 1), "block": (32, 32)}[kind],
                              jnp.float32)
    launch = dict(deterministic=True) if splits == "det" else dict(splits=splits)
    f = jax.jit(lambda *a: fp8_a16_decode_mgpu(*a, scale_kind=kind, **launch))
    assert "mosaic_gpu" in f.trace(x, w, ws).lower(lowering_platforms=("cuda",)).as_text()


def test_decode_params_fill_the_sms_with_the_fewest_ranges():
    """On 132 SMs, for the benchmark's shapes: the K ranges are the fewest (a power of two, two
    K-blocks each at least) that launch more CTAs than SMs and fill FILL_MIN of the last
    round; four stages where fewer than FEW_CTAS CTAs share an SM, else two."""
    sms = 132
    for k, n in BENCH_SHAPES:
        splits, stages = decode_params(n, k, sms)
        tiles, blocks = n // WG_ROWS, k // BLOCK
        ctas = tiles * splits
        assert blocks % splits == 0 and (splits == 1 or blocks // splits >= 2)
        assert ctas > sms and _fill(ctas, sms) >= FILL_MIN, (k, n, splits)
        fewer = [s for s in (1, 2, 4, 8, 16, 32) if s < splits]
        assert not [s for s in fewer if tiles * s > sms and _fill(tiles * s, sms) >= FILL_MIN]
        per_sm = min(ctas / sms, RESIDENT_CTAS)
        assert stages == (MAX_STAGES if per_sm < FEW_CTAS else 2), (k, n)
    # the last round: an SM's CTAs up to RESIDENT_CTAS each, then the resident slots'
    assert _fill(448, sms) == 448 / (4 * sms)  # 3.4 an SM, one round
    assert _fill(896, sms) == 896 / (2 * RESIDENT_CTAS * sms)  # two rounds of the slots
    # too few blocks for the SMs: the fullest launch
    assert decode_params(256, 512, sms) == (2, MAX_STAGES)
    assert decode_params(128, 128, sms) == (1, MAX_STAGES)


def test_decode_fits():
    assert decode_fits(1, 64, 128) and decode_fits(DECODE_MAX_M, 4096, 4096)
    assert not decode_fits(DECODE_MAX_M + 1, 4096, 4096)
    assert not decode_fits(1, 96, 4096) and not decode_fits(1, 4096, 200)
    assert not decode_fits(0, 4096, 4096)


def test_rejects_bad_arguments(rng):
    x, w, ws = _operands(rng, 2, 128, 512, jnp.bfloat16, "channel")
    call = lambda **kw: fp8_a16_decode_mgpu(**{**dict(x=x, w=w, w_scale=ws,
                                                      scale_kind="channel"), **kw})
    with pytest.raises(ValueError, match="scale_kind must be one of"):
        call(scale_kind="row")
    with pytest.raises(ValueError, match=r"w_scale must be float32 \(1, 4\) for scale_kind "
                                         r"'block', got float32\(128, 1\)"):
        call(scale_kind="block")
    with pytest.raises(ValueError, match="x must be bf16 or f16, got float32"):
        call(x=x.astype(jnp.float32))
    with pytest.raises(ValueError, match=r"w must be \(128, 512\) float8_e4m3fn, got bfloat16"):
        call(w=w.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match=r"w_scale must be float32 \(1, 1\) for scale_kind "
                                         r"'tensor', got float32\(128, 1\)"):
        call(scale_kind="tensor")
    with pytest.raises(ValueError, match=r"needs 1 <= M <= 16.*got M=17"):
        call(x=jnp.ones((17, 512), jnp.bfloat16))
    with pytest.raises(ValueError, match=r"needs .*N a multiple of 64.*N=96"):
        call(w=w[:96], w_scale=ws[:96])
    with pytest.raises(ValueError, match="K=512 is not 3 ranges"):
        call(splits=3)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["channel", "tensor", "block"])
@pytest.mark.parametrize("k,n", [(4096, 4096), (7168, 24576), (18432, 7168), (8192, 10240)])
def test_gpu_matches_float64(rng, kind, k, n):
    """decode_params' launch (one range on 7168 x 24576, else two to four), and one and eight
    ranges forced, at M=1, 9 (x padded) and 16, within the float64 bound."""
    for m in (1, 9, 16):
        x, w, ws = _operands(rng, m, n, k, jnp.bfloat16, kind)
        for splits in (None, 1, 8):
            y = jax.jit(lambda *a, s=splits: fp8_a16_decode_mgpu(*a, scale_kind=kind,
                                                                 splits=s))(x, w, ws)
            _check(y, x, w, ws)


def test_finish_in_kernel_rule():
    """The in-kernel finish (clusters, st.async, stmatrix .trans) runs on a GPU with a 16-bit
    output, at most MAX_CLUSTER ranges -- of one part each, or one range, or one range a group
    of parts (folds_parts) -- and M <= 8 or a multiple of 8; asked=None takes it in default mode
    (deterministic mode's launch asks for it itself: det_fold_parts)."""
    ok = dict(deterministic=False, interpret=False)
    assert finishes_in_kernel(1, 4, jnp.bfloat16, **ok)
    assert finishes_in_kernel(16, MAX_CLUSTER, jnp.float16, **ok)
    assert finishes_in_kernel(8, 1, jnp.bfloat16, **ok)
    assert not finishes_in_kernel(9, 1, jnp.bfloat16, **ok)  # y's rows: TMA tiles of 8
    assert not finishes_in_kernel(1, 2 * MAX_CLUSTER, jnp.bfloat16, **ok)
    assert not finishes_in_kernel(1, 4, jnp.float32, **ok)
    assert finishes_in_kernel(1, 8, jnp.bfloat16, deterministic=True, interpret=False)
    assert not finishes_in_kernel(1, 4, jnp.bfloat16, deterministic=True, interpret=False,
                                  range_parts=2)  # (ranges would split a run: slabs of their own)
    for splits, held, groups, want in ((1, 8, 1, True), (1, 8, 2, True), (2, 4, 2, True),
                                       (4, 2, 2, False), (2, 4, 1, False), (1, 3, 2, False)):
        assert folds_parts(splits, held, groups) is want, (splits, held, groups)
        assert finishes_in_kernel(1, splits, jnp.bfloat16, deterministic=True, interpret=False,
                                  range_parts=held, groups=groups) is want
    assert not finishes_in_kernel(1, 4, jnp.bfloat16, deterministic=False, interpret=True)
    det = dict(deterministic=True, interpret=False)
    least = FINISH_IN_KERNEL_MIN_N["fp8_a16_decode_mgpu"]
    assert takes_kernel_finish("fp8_a16_decode_mgpu", 1, least, 8, jnp.bfloat16, **det,
                               asked=None) is False
    assert takes_kernel_finish("fp8_a16_decode_mgpu", 1, 4096, 8, jnp.bfloat16, **det,
                               asked=True) is True
    # in_kernel_finish: True where it can run, False never, None from the kernel's least N on
    least = FINISH_IN_KERNEL_MIN_N["fp8_a16_decode_mgpu"]
    for asked, n, want in ((True, 4096, True), (False, 28672, False), (None, least, True),
                           (None, least - 64, False)):
        assert takes_kernel_finish("fp8_a16_decode_mgpu", 1, n, 4, jnp.bfloat16, **ok,
                                   asked=asked) is want
    assert takes_kernel_finish("fp8_a16_decode_mgpu", 9, least, 4, jnp.bfloat16, **ok,
                               asked=None) is False
    # (the 4-bit / MX kernel's finish was slower on every shape measured: asked for only)
    assert "group_a16_decode_mgpu" not in FINISH_IN_KERNEL_MIN_N
    assert takes_kernel_finish("group_a16_decode_mgpu", 1, 57344, 4, jnp.bfloat16, **ok,
                               asked=None) is False


def test_explain_says_who_finishes_a_decode_launch(monkeypatch):
    """finish_note follows the rule: the cluster where it is taken and can run, else XLA."""
    ok = dict(deterministic=False, interpret=False)
    fp8 = "fp8_a16_decode_mgpu"
    assert "4 K ranges one cluster" in finish_note(fp8, 1, 8192, 4, jnp.bfloat16, **ok)
    assert finish_note(fp8, 1, 4096, 4, jnp.bfloat16, **ok) == ", ranges added by XLA"
    assert finish_note(fp8, 1, 8192, 4, jnp.float32, **ok) == ", ranges added by XLA"
    assert finish_note(fp8, 9, 8192, 1, jnp.bfloat16, **ok) == ""
    assert finish_note("group_a16_decode_mgpu", 1, 8192, 4, jnp.bfloat16,
                       **ok) == ", ranges added by XLA"
    monkeypatch.setitem(FINISH_IN_KERNEL_MIN_N, "group_a16_decode_mgpu", 64)
    assert "one K range" in finish_note("group_a16_decode_mgpu", 16, 64, 1, jnp.bfloat16, **ok)


@pytest.mark.parametrize("m,splits,kind", [(1, 1, "channel"), (1, 4, "tensor"),
                                           (16, 8, "block"), (8, 2, "channel")])
def test_in_kernel_finish_lowers_for_cuda_on_cpu(m, splits, kind):
    """The cluster launch (st.async to range 0, stmatrix .trans, TMA dropping y's rows past M)
    through Mosaic GPU's lowering, as the GPU would run it: one custom call, no XLA finish."""
    x = jnp.ones((m, 4096), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((4096, 4096), jnp.float8_e4m3fn)
    ws = jax.ShapeDtypeStruct({"channel": (4096, 1), "tensor": (1, 1), "block": (32, 32)}[kind],
                              jnp.float32)
    f = jax.jit(lambda *a: fp8_a16_decode_mgpu(*a, scale_kind=kind, splits=splits,
                                               in_kernel_finish=True))
    lowered = f.trace(x, w, ws).lower(lowering_platforms=("cuda",))
    assert lowered.out_info.shape == (m, 4096) and lowered.out_info.dtype == jnp.bfloat16
    text = lowered.as_text()
    assert text.count("stablehlo.custom_call") == 1 and "mosaic_gpu" in text
    assert "stablehlo.add" not in text and "stablehlo.transpose" not in text


@pytest.mark.parametrize("splits", [4, 6, 8])
def test_in_kernel_finish_waits_for_the_arrivals_its_senders_make(monkeypatch, splits):
    """Range 0's receive barrier completes on one arrival per thread of each sending range
    (st.async's expect_tx: the 128 threads of splits - 1 warpgroups). Session 42 asked
    128 x (splits - 1) warpgroup arrivals -- Mosaic's warpgroup semantics counts a Barrier's
    arrivals in warpgroups -- and every cluster launch hung on the H200 (session 43). Read from
    Mosaic GPU's lowering of the barrier inits, on CPU."""
    from jax.experimental.mosaic.gpu import dialect_lowering
    name = "mosaic_gpu.initialize_barrier"
    rule, threads = dialect_lowering._lowerings[name], []

    def recording(ctx, op):
        threads.append(op.arrival_count.value * (1 if op.orders_tensor_core.value else 128))
        return rule(ctx, op)
    monkeypatch.setitem(dialect_lowering._lowerings, name, recording)
    x = jnp.ones((1, 128 * 8 * splits), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((256, x.shape[1]), jnp.float8_e4m3fn)
    ws = jax.ShapeDtypeStruct((256, 1), jnp.float32)
    jax.jit(lambda *a: fp8_a16_decode_mgpu(*a, scale_kind="channel", splits=splits,
                                           in_kernel_finish=True)).trace(x, w, ws).lower(
        lowering_platforms=("cuda",))
    # (the pipeline's stage barriers: a warpgroup's arrival per operand, w and x)
    assert sorted(threads) == [256, 128 * (splits - 1)], threads


def test_in_kernel_finish_where_it_cannot_run_is_an_error(rng):
    x, w, ws = _operands(rng, 1, 256, 512, jnp.bfloat16, "channel")
    with pytest.raises(ValueError, match="in_kernel_finish=True needs a GPU launch"):
        fp8_a16_decode_mgpu(x, w, ws, scale_kind="channel", in_kernel_finish=True,
                            interpret=True)
    x = jnp.ones((1, 4096), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((1088, 4096), jnp.float8_e4m3fn)
    ws = jax.ShapeDtypeStruct((1088, 1), jnp.float32)
    with pytest.raises(ValueError, match="range_parts=2"):  # (deterministic: 8 parts, 4 ranges)
        jax.jit(lambda *a: fp8_a16_decode_mgpu(*a, scale_kind="channel", deterministic=True,
                                               range_parts=2, in_kernel_finish=True)).trace(
            x, w, ws).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("m,n,kind", [(1, 1088, "channel"), (8, 4096, "block"),
                                      (16, 28672, "tensor")])
def test_deterministic_in_kernel_finish_lowers_for_cuda_on_cpu(m, n, kind):
    """Deterministic mode's launch (det_order's 8 parts as 8 K ranges: two groups of 4 below
    N = 16384, one above) as one cluster finishing y itself: one custom call, no XLA sum,
    transpose or rounding after it."""
    k = 4096
    assert det_order(n, k)[:2] == (8, 2 if n <= 16384 else 1)
    x = jnp.ones((m, k), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((n, k), jnp.float8_e4m3fn)
    ws = jax.ShapeDtypeStruct({"channel": (n, 1), "tensor": (1, 1),
                               "block": (-(-n // 128), k // 128)}[kind], jnp.float32)
    lowered = jax.jit(lambda *a: fp8_a16_decode_mgpu(
        *a, scale_kind=kind, deterministic=True, in_kernel_finish=True)).trace(
        x, w, ws).lower(lowering_platforms=("cuda",))
    assert lowered.out_info.shape == (m, n) and lowered.out_info.dtype == jnp.bfloat16
    text = lowered.as_text()
    assert text.count("stablehlo.custom_call") == 1 and "mosaic_gpu" in text
    assert "stablehlo.add" not in text and "stablehlo.transpose" not in text


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["channel", "tensor", "block"])
@pytest.mark.parametrize("k,n", [(4096, 1088), (4096, 28672)])
def test_gpu_deterministic_in_kernel_finish_is_the_slabs_bitwise(rng, kind, k, n):
    """Deterministic mode's cluster finish (session 45, prepared on CPU): range 0 adds the 8
    parts by det_groups' groups (two of 4 at N = 1088, one at 28672) as XLA adds the slabs, so
    y is the slab path's bit for bit, and row 0 is the same alone and inside M = 7, 8, 16."""
    x_all, w, ws = _operands(rng, 16, n, k, jnp.bfloat16, kind)
    alone = None
    for m in (1, 7, 8, 16):
        x = x_all[:m]
        run = {fin: jax.jit(lambda *a, f=fin: fp8_a16_decode_mgpu(
            *a, scale_kind=kind, deterministic=True, in_kernel_finish=f))(x, w, ws)
            for fin in (False, True)}
        got = np.asarray(run[True].astype(jnp.float32))
        np.testing.assert_array_equal(got, np.asarray(run[False].astype(jnp.float32)),
                                      err_msg=f"M={m}")
        alone = got[0] if alone is None else alone
        np.testing.assert_array_equal(got[0], alone, err_msg=f"row 0 inside M={m}")
        _check(run[True], x, w, ws)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["channel", "tensor", "block"])
@pytest.mark.parametrize("k,n", [(4096, 4096), (8192, 1088), (2048, 28672)])
def test_gpu_in_kernel_finish_is_xlas_finish_bitwise(rng, kind, k, n):
    """The cluster's K-order sum, the scale and the rounding in the kernel give XLA's finish of
    the slabs bit for bit: every K-range count a cluster takes (1-8), M = 1, 7, 8, 16 (y's rows
    past M dropped by TMA), bf16 and f16. Fresh random operands; the slab path is itself held
    to float64 (test_gpu_matches_float64)."""
    for m, dtype in ((1, jnp.bfloat16), (7, jnp.float16), (8, jnp.bfloat16), (16, jnp.bfloat16)):
        x, w, ws = _operands(rng, m, n, k, dtype, kind)
        for splits in (1, 2, 4, 8):
            run = {fin: jax.jit(lambda *a, s=splits, f=fin: fp8_a16_decode_mgpu(
                *a, scale_kind=kind, splits=s, in_kernel_finish=f))(x, w, ws)
                for fin in (False, True)}
            assert run[True].shape == (m, n) and run[True].dtype == dtype
            np.testing.assert_array_equal(np.asarray(run[True].astype(jnp.float32)),
                                          np.asarray(run[False].astype(jnp.float32)),
                                          err_msg=f"M={m} splits={splits}")
            _check(run[True], x, w, ws)


def _slab_operands(rng, m, n=128, k=1024):
    """plain_slabs' operands: bf16 x rows of varied range, e4m3 codes, per-row float32 scales."""
    x = jnp.asarray(rng.standard_normal((m, k)) * rng.uniform(0.1, 3, (m, 1)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((n, k)) * 4, jnp.float8_e4m3fn)
    return x, w, jnp.asarray(rng.uniform(0.01, 2, (n,)), jnp.float32)


def _bf16_tile(w_ref, _):
    return w_ref[...].astype(jnp.float32).astype(jnp.bfloat16)


@pytest.mark.parametrize("m,blocks,held,groups", [(1, 1, 8, 1), (8, 1, 4, 2), (5, 2, 8, 1),
                                                  (16, 2, 8, 2), (3, 4, 2, 2)])
def test_folded_parts_are_the_slabs_fold_in_the_interpreter(rng, m, blocks, held, groups):
    """One K range folding its `held` parts in the CTA (det_fold_parts' launch, session 46)
    gives y as fold_parts of the same launch's per-part slabs does, bit for bit -- parts ending
    inside a pipeline step (blocks 2 / 4 with one or two K-blocks a part) and two groups' runs
    included. (The interpreter has no clusters: one range only; the GPU test covers two.)"""
    x, w, scales = _slab_operands(rng, m)
    n = w.shape[0]
    launch = dict(splits=1, stages=2, blocks=blocks, chains="block", chain_scales=scales,
                  range_parts=held, interpret=True, a_tile=_bf16_tile)
    slabs = plain_slabs(x, w, **launch)
    assert slabs.shape[0] == held
    want = fold_parts(lambda p: slabs[p], held, groups)[:, :m].T.astype(jnp.bfloat16)
    got = plain_slabs(x, w, **launch, finish=KernelFinish(jnp.bfloat16, m, RowFinish(
        None, 1.0, "mul"), groups))
    assert got.shape == (m, n) and got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)),
                                  np.asarray(want.astype(jnp.float32)))
    wd = np.asarray(w.astype(jnp.float32), np.float64) * np.asarray(scales, np.float64)[:, None]
    xd = np.asarray(x.astype(jnp.float32), np.float64)
    assert_within_bound(got, xd @ wd.T, np.abs(xd) @ np.abs(wd).T, ACC_RTOL, jnp.bfloat16)


def test_deterministic_fold_rule():
    """Deterministic mode folds where default mode's K ranges (decode_params) are one, or one a
    det_groups group, and the in-kernel finish runs; else its parts stay 8 K ranges of slabs."""
    bf16 = jnp.bfloat16
    fold = "fp8_a16_decode_mgpu"
    for (n, k), held in (((28672, 4096), 8), ((24576, 7168), 8), ((8192, 8192), 4),
                         ((7168, 18432), 4), ((4096, 4096), None), ((6144, 4096), None)):
        if decode_params(n, k).splits in (1, det_order(n, k)[1]):
            assert held
        assert det_fold_parts(fold, 1, n, k, bf16, interpret=False) == held, (n, k)
    assert det_fold_parts(fold, 16, 28672, 4096, jnp.float16, interpret=False) == 8
    assert det_fold_parts(fold, 12, 28672, 4096, bf16, interpret=False) is None  # (y's tiles)
    assert det_fold_parts(fold, 1, 28672, 4096, jnp.float32, interpret=False) is None
    assert det_fold_parts(fold, 1, 28672, 4096, bf16, interpret=True) is None
    assert det_fold_parts("group_a16_decode_mgpu", 1, 28672, 4096, bf16, interpret=False) is None


@pytest.mark.parametrize("m,n,k,kind", [(1, 28672, 4096, "channel"), (16, 24576, 7168, "block"),
                                        (8, 8192, 8192, "tensor")])
def test_deterministic_fold_lowers_for_cuda_on_cpu(m, n, k, kind):
    """Deterministic mode's default launch where det_fold_parts takes it: one custom call writing
    y, no XLA sum after it; explain() names the fold."""
    x = jnp.ones((m, k), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((n, k), jnp.float8_e4m3fn)
    ws = jax.ShapeDtypeStruct({"channel": (n, 1), "tensor": (1, 1),
                               "block": (-(-n // 128), k // 128)}[kind], jnp.float32)
    lowered = jax.jit(lambda *a: fp8_a16_decode_mgpu(*a, scale_kind=kind, deterministic=True)
                      ).trace(x, w, ws).lower(lowering_platforms=("cuda",))
    assert lowered.out_info.shape == (m, n) and lowered.out_info.dtype == jnp.bfloat16
    text = lowered.as_text()
    assert text.count("stablehlo.custom_call") == 1 and "mosaic_gpu" in text
    assert "stablehlo.add" not in text and "stablehlo.transpose" not in text
    groups, splits, held, asked = det_decode_launch(m, n, k, jnp.bfloat16, interpret=False)
    assert asked and held == det_fold_parts("fp8_a16_decode_mgpu", m, n, k, jnp.bfloat16,
                                            interpret=False) > 1
    note = finish_note("fp8_a16_decode_mgpu", m, n, splits, jnp.bfloat16, deterministic=True,
                       interpret=False, range_parts=held, groups=groups, asked=asked)
    assert f"each CTA folding its {held} K parts" in note


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["channel", "tensor", "block"])
@pytest.mark.parametrize("k,n,held", [(4096, 28672, 8), (8192, 8192, 4), (4096, 1088, 8),
                                      (4096, 1088, 4)])
def test_gpu_deterministic_folded_parts_are_the_slabs_bitwise(rng, kind, k, n, held):
    """Each CTA folding its parts (session 46): one range of 8 (one run at N = 28672, two runs
    at 1088) or two ranges of one group each, a cluster adding the runs (8192, 1088) -- y is
    the slab path's bit for bit, the dispatcher's default det launch is too, and row 0 is the
    same alone and inside M = 7, 8, 16."""
    x_all, w, ws = _operands(rng, 16, n, k, jnp.bfloat16, kind)
    alone = None
    for m in (1, 7, 8, 16):
        x = x_all[:m]
        run = {f: jax.jit(lambda *a, f=f: fp8_a16_decode_mgpu(
            *a, scale_kind=kind, deterministic=True, in_kernel_finish=f,
            range_parts=None if f is None else held if f else 1))(x, w, ws)
            for f in (False, True, None)}
        slabs = np.asarray(run[False].astype(jnp.float32))
        for f in (True, None):
            np.testing.assert_array_equal(np.asarray(run[f].astype(jnp.float32)), slabs,
                                          err_msg=f"M={m} in_kernel_finish={f}")
        alone = slabs[0] if alone is None else alone
        np.testing.assert_array_equal(slabs[0], alone, err_msg=f"row 0 inside M={m}")
        _check(run[True], x, w, ws)


def test_rows_the_in_kernel_finish_writes():
    """The in-kernel finish writes y's rows in TMA's tiles of 8: M <= 8 or a multiple of 8.
    M = 9-15 keep the slabs (deterministic mode's fold too: test_deterministic_fold_rule).
    Session 47 removed PAD_Y_ROWS (16 rows written, XLA keeping M: bitwise, but no faster
    than the dispatcher's launch on an H100)."""
    assert [writes_y_rows(m) for m in (1, 8, 9, 12, 15, 16)] == [True, True, False, False,
                                                                  False, True]
    assert not finishes_in_kernel(12, 2, jnp.bfloat16, deterministic=False, interpret=False)
    assert finishes_in_kernel(16, 2, jnp.bfloat16, deterministic=False, interpret=False)


@pytest.mark.parametrize("m,held", [(9, 1), (12, 8), (15, 4)])
def test_plain_slabs_refuses_a_finish_of_9_to_15_rows(rng, m, held):
    """A y of M = 9-15 rows cannot be finished in the kernel: plain_slabs says so, one chain or
    folded parts."""
    x, w, scales = _slab_operands(rng, m)
    launch = dict(splits=1, stages=2, interpret=True, range_parts=held, a_tile=_bf16_tile,
                  **(dict(chains="block", chain_scales=scales) if held > 1 else {}))
    finish = KernelFinish(jnp.bfloat16, m, RowFinish(None if held > 1 else scales, 1.0, "mul"))
    with pytest.raises(ValueError, match="M <= 8 or a multiple of 8"):
        plain_slabs(x, w, **launch, finish=finish)
