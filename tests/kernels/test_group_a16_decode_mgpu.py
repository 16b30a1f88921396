"""The plain-pipeline group decode kernel (pallas_kernels.group_a16_decode_mgpu: NVFP4, MXFP4,
MXFP8 weight-only at M <= 16): in Mosaic GPU's interpreter (every buffer starts as NaN) within
the float64 bound for both code loads, one and several K ranges, M=1..16; its lowering for CUDA
on CPU (the inline PTX decode is built there); its launch rule, argument checks and the
dispatcher's choice of it; on the GPU (marked) the same at real sizes, through the dispatcher
too."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from float64_bound import assert_within_bound
from jqlin import bench, dispatch, formats, qweight
from jqlin.kernels.pallas_fp4 import apply, describe_config, nvfp4_post_scale
from jqlin.spec import GlobalScale, QuantSpec, ScaleRule
from pallas_kernels.group_a16_decode_mgpu import (DECODE_MAX_M, MAX_SPLITS, MIN_CTAS_PER_SM,
                                                  MIN_SPLITS, STAGES, group_a16_decode_mgpu,
                                                  group_decode_fits, group_decode_params,
                                                  step_blocks)
from pallas_kernels.group_a16_mgpu import reads_words

# float32 sums of exact bf16 products (wgmma), then the post factor / global scale
ACC_RTOL = 1e-5
BENCH_SHAPES = [kn for shapes in bench.SHAPES.values() for kn in shapes]  # (K, N)
FMT_OF = {"nvfp4_a16": "nvfp4", "mxfp4_a16": "mxfp4", "mxfp8_a16": "mxfp8"}


def _spec(name: str, modelopt: bool = False) -> QuantSpec:
    spec = formats.get(name)
    if not modelopt:
        return spec
    wk = dataclasses.replace(spec.weight, rule=ScaleRule.MODELOPT,
                             global_scale=GlobalScale.MULTIPLIER)
    return QuantSpec(wk, None)


def _make(rng, name, m, n, k, *, modelopt=False):
    w = rng.standard_normal((n, k)) * np.exp(0.5 * rng.standard_normal((n, 1))) * 0.05
    w[rng.integers(n), rng.integers(k)] *= 20  # an outlier
    x = rng.standard_normal((m, k)) * np.exp(0.5 * rng.standard_normal((m, 1)))
    qw = qweight.quantize(jnp.asarray(w, jnp.float32), _spec(name, modelopt))
    return jnp.asarray(x, jnp.bfloat16), qw


def _run(x, qw, **kw):
    spec = qw.spec
    fmt = FMT_OF["nvfp4_a16" if spec.weight.scale_dtype == "float8_e4m3fn" else
                 "mxfp4_a16" if spec.weight.is_fp4 else "mxfp8_a16"]
    col, post = nvfp4_post_scale(qw, spec) if fmt == "nvfp4" else (None, "none")
    return group_a16_decode_mgpu(fmt, x, qw.data, qw.scale, col, post=post, **kw)


def _check(y, x, qw):
    xd = np.asarray(x.astype(jnp.float32), np.float64)
    wd = np.asarray(qw.dequantize(), np.float64)
    assert y.shape == (x.shape[0], wd.shape[0]) and y.dtype == x.dtype
    assert_within_bound(y, xd @ wd.T, np.abs(xd) @ np.abs(wd).T, ACC_RTOL, x.dtype)


@pytest.mark.parametrize("name,modelopt,m,n,k,splits,load", [
    ("nvfp4_a16", False, 1, 128, 1024, 2, "bytes"),  # K ranges added by XLA; CT's divisor
    ("nvfp4_a16", True, 3, 64, 512, 1, "words"),  # ModelOpt's multiplier; codes as words
    ("nvfp4_a16", False, 16, 192, 512, 2, "words"),  # a full 16-row x tile
    ("mxfp4_a16", False, 1, 64, 1024, 2, "words"),
    ("mxfp4_a16", False, 9, 128, 512, 1, "bytes"),  # x padded to 16 rows
    ("mxfp8_a16", False, 11, 64, 1024, 2, "bytes"),  # e4m3 codes
])
def test_interpreter_matches_float64(rng, name, modelopt, m, n, k, splits, load):
    x, qw = _make(rng, name, m, n, k, modelopt=modelopt)
    y = _run(x, qw, splits=splits, stages=2, load=load, interpret=True)
    _check(y, x, qw)


def test_interpreter_launch_rule_and_float32_output(rng):
    """group_decode_params' own launch (None: the rule's), a float32 output."""
    x, qw = _make(rng, "mxfp4_a16", 2, 128, 2048)
    y = _run(x, qw, out_dtype=jnp.float32, interpret=True)
    assert y.dtype == jnp.float32
    xd = np.asarray(x.astype(jnp.float32), np.float64)
    wd = np.asarray(qw.dequantize(), np.float64)
    assert_within_bound(y, xd @ wd.T, np.abs(xd) @ np.abs(wd).T, ACC_RTOL, jnp.float32)


@pytest.mark.parametrize("name,load", [("nvfp4_a16", "bytes"), ("nvfp4_a16", "words"),
                                       ("mxfp4_a16", "words"), ("mxfp8_a16", "bytes"),
                                       ("nvfp4_a16", "det"), ("mxfp4_a16", "det"),
                                       ("nvfp4_a16", "det7168")])
def test_lowers_for_cuda_on_cpu(rng, name, load):
    x, qw = _make(rng, name, 16, 256, 7168 if load == "det7168" else 4096)
    launch = (dict(deterministic=True) if load in ("det", "det7168") else  # (7168: 2 parts a range)
              dict(splits=2, load=load))
    f = jax.jit(lambda x: _run(x, qw, **launch))
    assert "mosaic_gpu" in f.trace(x).lower(lowering_platforms=("cuda",)).as_text()


def test_decode_params_rule_on_the_benchmark_shapes():
    """On 132 SMs: the fewest K ranges (a power of two dividing the steps, two steps each at
    least, MIN_SPLITS at least) with MIN_CTAS_PER_SM CTAs an SM, else the most K allows; two
    stages; words where group_a16_mgpu reads words. The launches session 28 measured best or
    within 4% at M=1 (NOTES.md) are the ones chosen."""
    sms = 132
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        unit = 128 * step_blocks(fmt)
        for k, n in BENCH_SHAPES:
            splits, stages, load = group_decode_params(fmt, n, k, sms)
            steps, tiles = k // unit, n // 64
            assert steps % splits == 0 and (splits == 1 or steps // splits >= 2), (fmt, k, n)
            allowed = [s for s in (1, 2, 4, 8, 16) if steps % s == 0
                       and (s == 1 or steps // s >= 2)]
            fewer = [s for s in allowed if MIN_SPLITS <= s < splits
                     and tiles * s >= MIN_CTAS_PER_SM * sms]
            assert not fewer, (fmt, k, n, splits)
            assert (tiles * splits >= MIN_CTAS_PER_SM * sms and splits >= MIN_SPLITS
                    or splits == max(allowed)), (fmt, k, n, splits)
            assert stages == STAGES and splits <= MAX_SPLITS
            assert load == ("words" if fmt != "mxfp8" and reads_words(fmt, n, k) else "bytes")
    picks = {(k, n): group_decode_params("nvfp4", n, k, sms).splits for k, n in BENCH_SHAPES}
    assert picks[4096, 4096] == 8 and picks[8192, 8192] == 4 and picks[8192, 57344] == 2
    assert picks[7168, 24576] == 2 and picks[18432, 7168] == 8
    assert group_decode_params("mxfp4", 7168, 18432, sms).splits == 4  # 36 steps: 8 can't cut
    assert group_decode_params("nvfp4", 64, 512, sms).splits == 1  # two steps: one range


def test_decode_fits():
    assert group_decode_fits("nvfp4", 1, 64, 256) and group_decode_fits("mxfp4", 16, 4160, 512)
    assert not group_decode_fits("nvfp4", DECODE_MAX_M + 1, 4096, 4096)
    assert not group_decode_fits("nvfp4", 0, 4096, 4096)
    assert not group_decode_fits("nvfp4", 1, 96, 4096)  # N not of 64
    assert not group_decode_fits("mxfp4", 1, 4096, 256)  # K not of MX's 512
    assert not group_decode_fits("fp8", 1, 4096, 4096)


def test_rejects_bad_arguments(rng):
    x, qw = _make(rng, "nvfp4_a16", 2, 128, 512)
    col, post = nvfp4_post_scale(qw, qw.spec)

    def call(**kw):
        args = dict(fmt="nvfp4", x=x, w=qw.data, w_scale=qw.scale, col_scale=col, post=post,
                    interpret=True)
        args.update(kw)
        return group_a16_decode_mgpu(args.pop("fmt"), args.pop("x"), args.pop("w"),
                                     args.pop("w_scale"), args.pop("col_scale"), **args)
    with pytest.raises(ValueError, match="fmt must be one of"):
        call(fmt="nvfp8")
    with pytest.raises(ValueError, match=r"x must be bfloat16, got float32"):
        call(x=x.astype(jnp.float32))
    with pytest.raises(ValueError, match=r"w must be uint8 \(128, 256\) \(packed e2m1\)"):
        call(w=qw.data[:, :128])
    with pytest.raises(ValueError, match=r"w_scale must be float8_e4m3fn \(N, K/16\)"):
        call(w_scale=qw.scale.astype(jnp.float32))
    with pytest.raises(ValueError, match="post must be 'div'"):
        call(post="none")
    with pytest.raises(ValueError, match=r"needs 1 <= M <= 16.*got M=17"):
        call(x=jnp.ones((17, 512), jnp.bfloat16))
    with pytest.raises(ValueError, match="K=512 is not 4 ranges"):
        call(splits=4)
    with pytest.raises(ValueError, match="load must be one of"):
        call(load="dwords")
    xm, qm = _make(rng, "mxfp8_a16", 1, 64, 512)
    with pytest.raises(ValueError, match=r"'words': e2m1 codes only\), got 'words' for mxfp8"):
        group_a16_decode_mgpu("mxfp8", xm, qm.data, qm.scale, load="words", interpret=True)


def test_dispatcher_takes_it_at_decode_sizes(monkeypatch):
    """On sm_90 (faked: wgmma available, 132 SMs): NVFP4 and MXFP4 at M <= 16 with one bf16
    part and N, K it takes -> 'decode', in deterministic mode too (K=7168: two 7-block parts a
    range); M=17, MXFP8, float32 parts, N not of 64 -> not; an explicit path wins, and refuses
    what it cannot run."""
    from pallas_kernels import fp8_block_a16_mgpu, fp8_paths, group_a16_decode_mgpu as gd
    from pallas_kernels.fp4_matmul import mgpu_path
    monkeypatch.setattr(fp8_paths, "mosaic_wgmma_ok", lambda interpret: True)
    monkeypatch.setattr(fp8_block_a16_mgpu, "num_sms", lambda: 132)
    monkeypatch.setattr(gd, "num_sms", lambda: 132)

    def path(fmt, m, n=4096, k=4096, parts=1, dtype=jnp.bfloat16, det=False, **kw):
        return mgpu_path(fmt, m, n, k, parts, dtype, deterministic=det, config=None,
                         interpret=kw.pop("interpret", False), path=kw.pop("path", None))
    for fmt in ("nvfp4", "mxfp4"):
        assert path(fmt, 1) == path(fmt, 16) == path(fmt, 7, n=4160) == "decode"
        assert path(fmt, 17) == "mgpu" and path(fmt, 17, det=True) == "mgpu"
        assert path(fmt, 1, det=True) == path(fmt, 16, det=True) == "decode"
        assert path(fmt, 1, k=7168, det=True) == path(fmt, 1, k=7168) == "decode"
        assert path(fmt, 1, parts=3, dtype=jnp.float32) == "pallas"
        assert path(fmt, 1, n=4136) == "pallas"  # N % 64: neither Mosaic kernel
        assert path(fmt, 1, interpret=True) == "pallas"  # CI keeps Triton unless asked
        assert path(fmt, 1, det=True, path="decode") == "decode"
        with pytest.raises(ValueError, match="path='decode' cannot run.*M <= 16.*M=17"):
            path(fmt, 17, path="decode")
    assert path("mxfp8", 1) == "mgpu"  # (measured slower on this kernel)


@pytest.mark.parametrize("name,m", [("nvfp4_a16", 1), ("mxfp4_a16", 11)])
def test_apply_runs_it_and_describes_it(rng, monkeypatch, name, m):
    """The format's kernel with path='decode' (interpreted) agrees with the XLA reference of
    the spec; describe_config names the decode launch where the dispatcher would take it."""
    from pallas_kernels import fp8_paths
    x, qw = _make(rng, name, m, 128, 1024)
    y = apply(x, qw, qw.spec, path="decode", interpret=True)
    ref = dispatch.matmul(x, qw, kernel="xla")
    assert y.shape == ref.shape and y.dtype == x.dtype
    err = np.linalg.norm(np.asarray(y, np.float64) - np.asarray(ref, np.float64))
    assert err <= 2.0 ** -8 * np.linalg.norm(np.asarray(ref, np.float64))
    monkeypatch.setattr(fp8_paths, "mosaic_wgmma_ok", lambda interpret: True)
    kernel = "pallas_nvfp4" if name.startswith("nv") else "pallas_mxfp4"
    got = describe_config(kernel, m, qw, qw.spec, x.dtype, False)
    assert got["path"].startswith("decode (Mosaic GPU plain-pipeline") and got["splits"] >= 1
    det = describe_config(kernel, m, qw, qw.spec, x.dtype, True)["path"]
    assert det.startswith("decode (") and "deterministic order: K in 8 parts" in det, det


def _det_pair(x, qw, range_parts=None, **kw):
    """(group_a16_mgpu's deterministic result, this kernel's deterministic result), float32."""
    from pallas_kernels.group_a16_mgpu import group_a16_matmul_mgpu
    fmt = FMT_OF["nvfp4_a16" if qw.spec.weight.scale_dtype == "float8_e4m3fn" else
                 "mxfp4_a16"]
    col, post = nvfp4_post_scale(qw, qw.spec) if fmt == "nvfp4" else (None, "none")
    args = (fmt, x, qw.data, qw.scale, col)
    common = dict(post=post, out_dtype=jnp.float32, deterministic=True, **kw)
    return (group_a16_matmul_mgpu(*args, **common),
            group_a16_decode_mgpu(*args, range_parts=range_parts, **common))


@pytest.mark.parametrize("name,m,n,k,words", [
    ("nvfp4_a16", 11, 128, 2048, False),  # 8 parts of 2 K-blocks (a step each), 2 groups
    ("nvfp4_a16", 16, 128, 4096, True),  # codes read as words (x permuted) in both
    ("mxfp4_a16", 9, 256, 4096, False),  # 8 parts of 4 K-blocks (one MX step each)
    ("nvfp4_a16", 9, 128, 1024, False),  # 8 parts of 1 K-block: 2 a range (mid-step ends)
    ("mxfp4_a16", 16, 128, 1536, False),  # 4 parts of 3 K-blocks: one range of 3 steps
])
def test_deterministic_order_is_group_a16_mgpus_bitwise(rng, monkeypatch, name, m, n, k, words):
    """deterministic=True: the Mosaic kernel's deterministic sums to the last bit (float32
    output, interpreter). M 9-16: both kernels' x tiles are 16 rows here (the interpreter's
    narrowest deterministic tile is 16, the GPU's 8: the interpreter's dot bits follow the
    tile's width, the GPU's wgmma's do not -- test_gpu_x_tile_width_does_not_change_a_row)."""
    from pallas_kernels import group_a16_decode_mgpu as gd, group_a16_mgpu as ga
    if words:
        monkeypatch.setattr(ga, "reads_words", lambda *a: True)
        monkeypatch.setattr(gd, "reads_words", lambda *a: True)
    x, qw = _make(rng, name, m, n, k)
    want, got = _det_pair(x, qw, interpret=True)
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    _check(got.astype(jnp.bfloat16), x, qw)


def test_deterministic_rows_keep_their_bits_across_m(rng):
    """M <= 8 (8-row x tiles): rows alone equal the same rows among others, bitwise; within the
    float64 bound."""
    x, qw = _make(rng, "nvfp4_a16", 7, 128, 2048)
    many = _run(x, qw, deterministic=True, out_dtype=jnp.float32, interpret=True)
    one = _run(x[2:3], qw, deterministic=True, out_dtype=jnp.float32, interpret=True)
    np.testing.assert_array_equal(np.asarray(one)[0], np.asarray(many)[2])
    _check(many.astype(jnp.bfloat16), x, qw)


def test_deterministic_ranges_hold_whole_steps(rng):
    """det_range_parts: the fewest of deterministic mode's parts a K range holds for whole
    pipeline steps (2 K-blocks NVFP4, 4 MX), this device's under k_shards; deterministic mode's
    launch is fixed, and an explicit path still refuses what the kernel cannot take."""
    from pallas_kernels.group_a16_decode_mgpu import det_order, det_range_parts
    assert det_order(4096, 4096) == (8, 2, 8)
    assert det_order(57344, 8192) == (8, 1, 8)  # past DET_GROUPS_MAX_N: one group
    assert det_range_parts("nvfp4", 4096, 4096) == det_range_parts("mxfp4", 4096, 4096) == 1
    assert det_range_parts("nvfp4", 24576, 7168) == 2  # 7 K-blocks a part
    assert det_range_parts("mxfp4", 4096, 14336) == det_range_parts("mxfp4", 7168, 18432) == 2
    assert det_range_parts("mxfp4", 128, 1536) == 4  # 4 parts of 3 K-blocks: one range
    from pallas_kernels import k_shards
    with k_shards("tp", 2):  # a device's K=3584 of 7168: 4 of the 8 parts, 7 K-blocks each
        assert det_order(4096, 3584) == (8, 2, 4) and det_range_parts("nvfp4", 4096, 3584) == 2
    x, qw = _make(rng, "nvfp4_a16", 1, 128, 512)
    with pytest.raises(ValueError, match="leave splits and load unset"):
        _run(x, qw, deterministic=True, splits=2, interpret=True)
    with pytest.raises(ValueError, match="range_parts is deterministic mode's"):
        _run(x, qw, range_parts=2, interpret=True)
    from pallas_kernels.fp4_matmul import mgpu_path
    with pytest.raises(ValueError, match="path='decode' cannot run.*M <= 16"):
        mgpu_path("nvfp4", 17, 4096, 7168, 1, jnp.bfloat16, deterministic=True, config=None,
                  path="decode", interpret=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name,k,n", [("nvfp4_a16", 4096, 4096), ("nvfp4_a16", 8192, 8192),
                                      ("mxfp4_a16", 4096, 6144), ("nvfp4_a16", 18432, 7168),
                                      ("nvfp4_a16", 7168, 4096), ("mxfp4_a16", 14336, 2048)])
def test_gpu_deterministic_order_is_group_a16_mgpus_bitwise(rng, name, k, n):
    """On the H200 the deterministic decode gives group_a16_mgpu's deterministic bits at M=1,
    8, 9 and 16 (8192x8192: codes as words; K=7168 and MX K=14336: two parts a K range) --
    what lets the dispatcher run this kernel at M <= 16 and that one above in deterministic
    mode."""
    for m in (1, 8, 9, 16):
        x, qw = _make(rng, name, m, n, k)
        want, got = jax.jit(lambda x: _det_pair(x, qw))(x)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"M={m}")


@pytest.mark.gpu
def test_gpu_deterministic_range_parts_keep_the_bits(rng):
    """On the H200, NVFP4 at 2, 4 and 8 parts a K range: group_a16_mgpu's deterministic bits
    still, at M=1 and 16."""
    for m in (1, 16):
        x, qw = _make(rng, "nvfp4_a16", m, 8192, 8192)
        for rp in (2, 4, 8):
            want, got = jax.jit(lambda x, rp=rp: _det_pair(x, qw, range_parts=rp))(x)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want),
                                          err_msg=f"M={m} range_parts={rp}")


@pytest.mark.parametrize("modelopt", [False, True])
def test_in_kernel_finish_divides_as_xla_where_it_divides(rng, modelopt):
    """NVFP4's in-kernel finish: compressed-tensors' global scale divides by PTX div.full.f32
    (mgpu_common.div_full: XLA:GPU's division, as in XLA's finish; no arith.divf -- Mosaic's
    IEEE `/`, with which 2 of 33280 outputs were not XLA's finish's bits on an H100, session
    44); ModelOpt's multiplies (neither)."""
    x, qw = _make(rng, "nvfp4_a16", 1, 256, 4096, modelopt=modelopt)
    f = jax.jit(lambda x: _run(x, qw, splits=8, load="bytes", in_kernel_finish=True))
    text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert ("div.full.f32" in text) == (not modelopt) and "arith.divf" not in text


@pytest.mark.gpu
@pytest.mark.parametrize("name,modelopt", [("nvfp4_a16", False), ("nvfp4_a16", True),
                                           ("mxfp4_a16", False), ("mxfp8_a16", False)])
@pytest.mark.parametrize("k,n", [(4096, 4096), (7168, 2048), (2048, 4160)])
def test_gpu_matches_float64(rng, name, modelopt, k, n):
    """The rule's launch at M=1, 9 (x padded) and 16; at M=1 also one range and the most ranges
    K allows (16 where it can), with both loads for e2m1 codes; within the float64 bound.
    K=7168: 28 (NVFP4) / 14 (MX) steps; N=4160: 65 tiles of 64 rows. (The float64 reference
    keeps the shapes moderate: the benchmark's run the same launches.)"""
    fmt = FMT_OF[name]
    steps = k // (128 * step_blocks(fmt))
    most = max(s for s in (1, 2, 4, 8, 16) if steps % s == 0 and (s == 1 or steps // s >= 2))
    loads = ("bytes", "words") if fmt != "mxfp8" else ("bytes",)
    for m in (1, 9, 16):
        x, qw = _make(rng, name, m, n, k, modelopt=modelopt)
        launches = [(None, None)] + ([(1, loads[-1]), (most, loads[0])] if m == 1 else [])
        for splits, load in launches:
            y = jax.jit(lambda x, s=splits, ld=load: _run(x, qw, splits=s, load=ld))(x)
            _check(y, x, qw)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nvfp4_a16", "mxfp4_a16", "nvfp4"])
def test_gpu_dispatcher_takes_it_and_agrees(rng, name):
    """On the H200 jqlin.matmul at M=1 and 16 runs the decode kernel (describe_config says so;
    W4A4's quantized activation is one bf16 operand too) and agrees with the XLA reference."""
    from jqlin.kernels.pallas_fp4 import describe_config as describe
    spec = formats.get(name)
    k, n = 4096, 6144
    for m in (1, 16):
        w = rng.standard_normal((n, k)) * 0.05
        x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        static = spec.activation is not None
        qw = qweight.quantize(jnp.asarray(w, jnp.float32), spec,
                              calibration=x if static else None)
        kernel = "pallas_mxfp4" if name.startswith("mx") else "pallas_nvfp4"
        assert dispatch.explain(x, qw).chosen == kernel
        assert describe(kernel, m, qw, spec, x.dtype, False)["path"].startswith("decode")
        y, ref = dispatch.matmul(x, qw), dispatch.matmul(x, qw, kernel="xla")
        y64, r64 = (np.asarray(jnp.asarray(a, jnp.float32), np.float64) for a in (y, ref))
        assert np.isfinite(y64).all()
        assert np.linalg.norm(y64 - r64) <= 2.0 ** -8 * np.linalg.norm(r64), (name, m)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nvfp4_a16", "mxfp4_a16", "nvfp4"])
def test_gpu_deterministic_rows_cross_the_decode_kernel(rng, name):
    """Deterministic mode on the H200 with bf16 x: up to 16 rows the decode kernel in
    group_a16_mgpu's order (describe_config says so), above it group_a16_mgpu -- a row computed
    alone (decode) is bitwise that row of 2, 7 (decode), 64 and 300 rows (group_a16_mgpu)."""
    from invariance import assert_rows_batch_invariant
    spec = formats.get(name)
    k, n = 4096, 4096
    w = rng.standard_normal((n, k)) * 0.05
    calib = jnp.asarray(rng.standard_normal((4, k)), jnp.bfloat16)
    qw = qweight.quantize(jnp.asarray(w, jnp.float32), spec,
                          calibration=calib if spec.activation is not None else None)
    kernel = "pallas_mxfp4" if name.startswith("mx") else "pallas_nvfp4"
    paths = {m: describe_config(kernel, m, qw, spec, jnp.bfloat16, True)["path"]
             for m in (1, 16, 17)}
    assert paths[1].startswith("decode") and "deterministic order" in paths[1], paths[1]
    assert paths[16].startswith("decode") and paths[17].startswith("mgpu"), paths
    assert_rows_batch_invariant(qw, k, jnp.bfloat16, rng, (2, 7, 64, 300), name)


def test_describe_config_names_the_deterministic_launch(rng, monkeypatch):
    """explain's account of deterministic mode at K=7168 is the launch the kernel runs: 8 parts
    of 7 K-blocks, two a range (4 ranges), as det_launch_of gives them."""
    from pallas_kernels import fp8_paths
    from pallas_kernels.group_a16_decode_mgpu import det_launch_of
    monkeypatch.setattr(fp8_paths, "mosaic_wgmma_ok", lambda interpret: True)
    _, qw = _make(rng, "nvfp4_a16", 1, 64, 7168)
    assert det_launch_of("nvfp4", 64, 7168) == (2, 4, 2)
    path = describe_config("pallas_nvfp4", 1, qw, qw.spec, jnp.bfloat16, True)["path"]
    assert "splits=4," in path and "K in 8 parts (2 a range)" in path, path


@pytest.mark.parametrize("name,m,splits,load", [("nvfp4_a16", 1, 8, "bytes"),
                                                 ("nvfp4_a16", 16, 2, "words"),
                                                 ("mxfp4_a16", 8, 1, "bytes"),
                                                 ("mxfp8_a16", 1, 4, "bytes")])
def test_in_kernel_finish_lowers_for_cuda_on_cpu(rng, name, m, splits, load):
    """The cluster launch with NVFP4's RowFinish / MX's factor applied by range 0, through Mosaic
    GPU's lowering as the GPU would run it: one custom call, y (M, N) bf16 out."""
    x, qw = _make(rng, name, m, 256, 4096)
    f = jax.jit(lambda x: _run(x, qw, splits=splits, load=load, in_kernel_finish=True))
    lowered = f.trace(x).lower(lowering_platforms=("cuda",))
    assert lowered.out_info.shape == (m, 256) and lowered.out_info.dtype == jnp.bfloat16
    text = lowered.as_text()
    assert text.count("stablehlo.custom_call") == 1 and "stablehlo.transpose" not in text


@pytest.mark.parametrize("name,m", [("nvfp4_a16", 1), ("mxfp4_a16", 8), ("mxfp8_a16", 16)])
def test_deterministic_in_kernel_finish_lowers_for_cuda_on_cpu(rng, name, m):
    """Deterministic mode's launch where each K range is one part (K = 4096: 8 ranges, two
    groups at N = 256) as one cluster: one custom call, y (M, N) bf16 out. Where a range holds
    two parts (MX at K = 2048) asking for it is an error."""
    x, qw = _make(rng, name, m, 256, 4096)
    f = jax.jit(lambda x: _run(x, qw, deterministic=True, in_kernel_finish=True))
    lowered = f.trace(x).lower(lowering_platforms=("cuda",))
    assert lowered.out_info.shape == (m, 256) and lowered.out_info.dtype == jnp.bfloat16
    text = lowered.as_text()
    assert text.count("stablehlo.custom_call") == 1 and "stablehlo.transpose" not in text
    if name != "nvfp4_a16":
        x, qw = _make(rng, name, m, 256, 2048)
        with pytest.raises(ValueError, match="range_parts=2"):
            jax.jit(lambda x: _run(x, qw, deterministic=True, in_kernel_finish=True)).trace(
                x).lower(lowering_platforms=("cuda",))


@pytest.mark.gpu
@pytest.mark.parametrize("name,modelopt", [("nvfp4_a16", False), ("nvfp4_a16", True),
                                           ("mxfp4_a16", False), ("mxfp8_a16", False)])
def test_gpu_deterministic_in_kernel_finish_is_the_slabs_bitwise(rng, name, modelopt):
    """Deterministic mode's cluster finish (session 45, prepared on CPU): range 0 adds the 8
    parts by det_groups' groups, then NVFP4's factor and global scale (or MX's factor), as XLA
    finishes the slabs -- bit for bit, and row 0 is the same alone and inside M = 7, 8, 16.
    N = 4160 (two groups) and 28672 (one)."""
    for n in (4160, 28672):
        x_all, qw = _make(rng, name, 16, n, 4096, modelopt=modelopt)
        alone = None
        for m in (1, 7, 8, 16):
            x = x_all[:m]
            run = {fin: jax.jit(lambda x, f=fin: _run(
                x, qw, deterministic=True, in_kernel_finish=f))(x) for fin in (False, True)}
            got = np.asarray(run[True].astype(jnp.float32))
            np.testing.assert_array_equal(got, np.asarray(run[False].astype(jnp.float32)),
                                          err_msg=f"N={n} M={m}")
            alone = got[0] if alone is None else alone
            np.testing.assert_array_equal(got[0], alone, err_msg=f"N={n}: row 0 inside M={m}")
            _check(run[True], x, qw)


@pytest.mark.gpu
@pytest.mark.parametrize("name,modelopt", [("nvfp4_a16", False), ("nvfp4_a16", True),
                                           ("mxfp4_a16", False), ("mxfp8_a16", False)])
def test_gpu_in_kernel_finish_is_xlas_finish_bitwise(rng, name, modelopt):
    """The in-kernel finish (fp8_a16_decode_mgpu.KernelFinish: the cluster's K-order sum, the
    RowFinish -- NVFP4's factor and global scale, divided or multiplied -- or MX's factor, the
    rounding) gives XLA's finish of the slabs bit for bit: 1-8 K ranges, M = 1, 8, 16, both
    code loads; N = 4160 (65 tiles). Fresh random operands; the slab path is itself held to
    float64 (test_gpu_matches_float64)."""
    fmt = FMT_OF[name]
    k, n = 4096, 4160
    steps = k // (128 * step_blocks(fmt))
    loads = ("bytes", "words") if fmt != "mxfp8" else ("bytes",)
    for m in (1, 8, 16):
        x, qw = _make(rng, name, m, n, k, modelopt=modelopt)
        for splits in (s for s in (1, 2, 4, 8) if steps % s == 0):
            for load in loads:
                run = {fin: jax.jit(lambda x, s=splits, ld=load, f=fin: _run(
                    x, qw, splits=s, load=ld, in_kernel_finish=f))(x) for fin in (False, True)}
                np.testing.assert_array_equal(
                    np.asarray(run[True].astype(jnp.float32)),
                    np.asarray(run[False].astype(jnp.float32)),
                    err_msg=f"M={m} splits={splits} load={load}")
                _check(run[True], x, qw)
