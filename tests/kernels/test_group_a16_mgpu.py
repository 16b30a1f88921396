"""The Mosaic GPU weight-only kernel for group-scaled formats (pallas_kernels.group_a16_mgpu:
NVFP4, MXFP4, MXFP8): its decode's arithmetic (exhaustively, in numpy), the kernel in Mosaic
GPU's interpreter against a float64 reference, its lowering for CUDA on CPU (the inline PTX
decode is built there), and on the GPU at real sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pallas_kernels.fp8_block_a16_mgpu import launch_params
from pallas_kernels.group_a16_mgpu import (group_a16_matmul_mgpu, group_launch_params,
                                           nvfp4_a16_matmul_mgpu)
from pallas_kernels.mx_dense import dequantize_bf16
from pallas_kernels.mgpu_group_decode import (E2M1_VALUES, FORMATS, decode_jnp, nibble_patterns,
                                              predecode_weights, register_map, scale_splat_values,
                                              word_patterns, word_register_map)

NVFP4 = FORMATS["nvfp4"]
POST_FACTOR = NVFP4.post_factor

E4M3 = ml_dtypes.float8_e4m3fn
FINITE_E4M3 = np.array([b for b in range(256) if b & 0x7F != 0x7F], np.uint8)  # not NaN


def _bf16_pair(word: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo = (word & 0xFFFF).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    hi = (word >> 16).astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    return lo, hi


def test_nibble_patterns_are_e2m1_times_2_pow_minus_126_for_every_byte():
    b = np.arange(256, dtype=np.uint32)
    lo, hi = _bf16_pair(nibble_patterns(b))
    np.testing.assert_array_equal(lo, E2M1_VALUES[b & 15].astype(np.float64) * 2.0 ** -126)
    np.testing.assert_array_equal(hi, E2M1_VALUES[b >> 4].astype(np.float64) * 2.0 ** -126)
    assert np.array_equal(np.signbit(lo), (b & 8) > 0)  # -0 keeps its sign


def test_decoded_weight_is_exact_for_every_code_and_scale():
    """The pattern times bf16(s * 2**118), rounded to bf16 (mul.rn.bf16x2), is e2m1 * s * 2**-8
    exactly, for all 16 codes and all finite e4m3 scales (subnormals included)."""
    s2 = scale_splat_values(FINITE_E4M3, NVFP4).astype(np.float64)
    s = FINITE_E4M3.view(E4M3).astype(np.float64)
    np.testing.assert_array_equal(s2, s * 2.0 ** 118)  # the scale step is exact
    pat = _bf16_pair(nibble_patterns(np.arange(16, dtype=np.uint32)))[0]
    prod = (pat[:, None] * s2[None, :]).astype(np.float32).astype(ml_dtypes.bfloat16)
    want = E2M1_VALUES.astype(np.float64)[:, None] * s[None, :] * 2.0 ** -8
    np.testing.assert_array_equal(prod.astype(np.float64), want)


def test_e8m0_splat_is_the_scale_for_every_byte_and_mx_products_are_exact():
    """MX: bf16 bits u << 7 (0: the subnormal 2**-127, 255: NaN) are 2**(u - 127); e2m1
    patterns times 2**126 are the codes, and times the scale exact where bf16 holds them."""
    u = np.arange(256)
    got = scale_splat_values(u, FORMATS["mxfp4"]).astype(np.float64)
    np.testing.assert_array_equal(got[:255], 2.0 ** (u[:255] - 127.0))
    assert np.isnan(got[255])
    pat = _bf16_pair(nibble_patterns(np.arange(16, dtype=np.uint32)))[0]
    codes = (pat * 2.0 ** 126).astype(np.float32).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(codes.astype(np.float64), E2M1_VALUES)
    mid = got[100:150]  # weights' scales in practice; the products are bf16 numbers
    prod = (codes.astype(np.float32)[:, None] * mid[None, :]).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(prod.astype(np.float64), E2M1_VALUES[:, None] * mid[None, :])


@pytest.mark.parametrize("group", [16, 32])
def test_register_map_is_rows_base_and_base_plus_8_by_groups(group):
    offset, grp = register_map(group)
    assert len(offset) == 32 and set(offset) == {0, 8}
    # 2 rows x (group / 8) column pairs a group
    assert list(grp) == [i // (group // 4) for i in range(32)]


def test_decode_jnp_is_the_float64_dequantization(rng):
    codes = rng.integers(0, 16, (64, 128)).astype(np.int8)
    scales = rng.choice(FINITE_E4M3, (64, 8))
    got = decode_jnp(jnp.asarray(np.where(codes > 7, codes - 16, codes)).astype(jnp.int4),
                     jnp.asarray(scales), NVFP4)
    want = (E2M1_VALUES[codes].astype(np.float64)
            * np.repeat(scales.view(E4M3).astype(np.float64), 16, axis=1) / POST_FACTOR)
    np.testing.assert_array_equal(np.asarray(got, np.float64), want)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
def test_predecode_weights_are_decode_jnp_for_every_code_and_scale(rng, fmt):
    """The predecode pass (group_dequant's Pallas pass, in the interpreter, and XLA's float4
    conversion, where the pass does not fit) gives decode_jnp's bits (what the GPU decode is
    tested against) for every code and every scale byte, the packed nibble order included."""
    f = FORMATS[fmt]
    n, k = 256, 512
    scale_bytes = (np.tile(FINITE_E4M3, -(-n * k // f.group // FINITE_E4M3.size))
                   if f.scale == "e4m3" else np.tile(np.arange(256, dtype=np.uint8),
                                                     -(-n * k // f.group // 256)))
    scales = rng.permutation(scale_bytes[:n * k // f.group]).reshape(n, k // f.group)
    if f.elem == "e2m1":
        w = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        codes = jax.lax.bitcast_convert_type(jnp.asarray(w), jnp.int4).reshape(n, k)
    else:
        w = rng.choice(FINITE_E4M3, (n, k)).view(E4M3)
        codes = jnp.asarray(w)
    want = np.asarray(decode_jnp(codes, jnp.asarray(scales), f)).view(np.uint16)
    got = predecode_weights(jnp.asarray(w), jnp.asarray(scales), f, interpret=True)
    assert "dequantize_" in str(jax.make_jaxpr(
        lambda a, b: predecode_weights(a, b, f, interpret=True))(w, scales))
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), want)
    xla = dequantize_bf16(jnp.asarray(w), jnp.asarray(scales), elem=f.elem, scale=f.scale,
                          group=f.group, factor=1.0 / f.post_factor)
    np.testing.assert_array_equal(np.asarray(xla).view(np.uint16), want)


def _operands(rng, m, n, k):
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    # scales of realistic size (weights ~ 0.01-1): e4m3 of 2**-9 .. 2**2
    scale = (2.0 ** rng.uniform(-9, 2, (n, k // 16))).astype(E4M3)
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    col = rng.uniform(0.5, 4.0, n).astype(np.float32)
    return x, packed, scale, col


def _reference(x, packed, scale, col, post, dtype=np.float64):
    """dtype float32 for real sizes (the products are exact in it; the sums' rounding is far
    below the bf16 output's)."""
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    w = E2M1_VALUES[codes].astype(dtype) * np.repeat(scale.astype(dtype), 16, axis=1)
    y = (x.astype(dtype) @ w.T).astype(np.float64)
    return y / col if post == "div" else y * col


def _check(got, want):
    got = np.asarray(got, np.float64)
    assert np.all(np.isfinite(got))
    # bf16 output: one rounding of a float32 sum of exact products
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=2 ** -7 * np.abs(want).max())


@pytest.mark.parametrize("m,post,launch", [
    (1, "div", {}),  # launch_params' decode launch (stream-K over 2 tiles)
    (3, "mul", dict(block_m=16, k_splits=2)),  # K ranges
    (5, "div", dict(block_m=16, blocks_per_step=1)),  # a scale tile serves two steps
    (2, "mul", dict(block_m=16, k_parts=2, parts_sum="store")),
    (20, "div", dict(block_m=32, k_parts=2)),  # in-CTA parts, a partial x tile
    (4, "mul", dict(block_m=8, blocks_per_step=4, programs=4)),  # 4 K-blocks a step, streamed
])
def test_interpreter_matches_the_float64_reference(rng, m, post, launch):
    n, k = 256, 1024 if launch.get("blocks_per_step") == 4 else 512
    x, packed, scale, col = _operands(rng, m, n, k)
    got = nvfp4_a16_matmul_mgpu(jnp.asarray(x), jnp.asarray(packed), jnp.asarray(scale),
                                jnp.asarray(col), post=post, interpret=True,
                                **{"block_m": 16, **launch} if launch else {})
    assert got.shape == (m, n) and got.dtype == jnp.bfloat16
    _check(got, _reference(x, packed, scale, col, post))


@pytest.mark.parametrize("m,post,launch", [
    (3, "div", dict(block_m=16)),  # one launch, one K range: y written by the CTAs (out_t)
    (20, "mul", dict(block_m=32, k_parts=2)),  # in-CTA parts, a partial x tile
    (5, "div", dict(block_m=32, k_parts=4, k_groups=2, predecode=True,
                    groups_sum="reload")),  # the first group's sum reloaded, then finished
])
def test_interpreter_row_finish_in_the_cta_gives_xlas_bits(rng, m, post, launch, monkeypatch):
    """NVFP4's finish (post factor, then the global scale per column) applied by the CTAs that
    round their own bf16 output is bitwise XLA's finish of the same launch's float32 sums,
    rounded after -- and the bf16 launches do not call XLA's (RowFinish.xla)."""
    from pallas_kernels.mgpu_common import RowFinish
    n, k = 256, 1024
    x, packed, scale, col = (jnp.asarray(a) for a in _operands(rng, m, n, k))
    run = lambda dtype: nvfp4_a16_matmul_mgpu(  # noqa: E731
        x, packed, scale, col, post=post, interpret=True, out_dtype=dtype, **launch)
    f32 = run(jnp.float32)  # the kernel writes float32 sums: XLA finishes them
    called = []
    monkeypatch.setattr(RowFinish, "xla", lambda self, yt: called.append(yt) or yt)
    bf16 = run(jnp.bfloat16)
    assert not called, "the bf16 launch left its finish to XLA"
    assert bf16.dtype == jnp.bfloat16 and bf16.shape == (m, n)
    np.testing.assert_array_equal(np.asarray(bf16).view(np.uint16),
                                  np.asarray(f32.astype(jnp.bfloat16)).view(np.uint16))
    _check(bf16, _reference(np.asarray(x), np.asarray(packed), np.asarray(scale),
                            np.asarray(col), post))


def test_interpreter_deterministic_rows_do_not_depend_on_m(rng):
    n, k = 256, 512
    x, packed, scale, col = _operands(rng, 7, n, k)
    args = (jnp.asarray(packed), jnp.asarray(scale), jnp.asarray(col))
    full = nvfp4_a16_matmul_mgpu(jnp.asarray(x), *args, post="div", deterministic=True,
                                 interpret=True)
    one = nvfp4_a16_matmul_mgpu(jnp.asarray(x[3:4]), *args, post="div", deterministic=True,
                                interpret=True)
    np.testing.assert_array_equal(np.asarray(full[3:4]), np.asarray(one))


@pytest.mark.parametrize("a_load", ["wgmma", "words"])
@pytest.mark.parametrize("k,programs,parts_sum", [
    (2048, 4, "cond"),  # parts of 4 K-blocks
    (1536, 2, "cond"),  # parts of 3: they end inside steps of 2 and of 4, at every block
    (1536, 2, "store")])
def test_interpreter_deterministic_sums_do_not_depend_on_blocks_a_step(rng, a_load, k,
                                                                       programs, parts_sum):
    """Deterministic mode's streamed K parts (folded by a tile's first CTA, or stored) with
    1, 2 or 4 K-blocks a step, parts that end inside a step too: the same sums, bitwise --
    what lets its launch take 2 or 4 blocks a step."""
    n = 256
    x, packed, scale, col = _operands(rng, 5, n, k)
    args = (jnp.asarray(x), jnp.asarray(packed), jnp.asarray(scale), jnp.asarray(col))
    outs = [np.asarray(nvfp4_a16_matmul_mgpu(*args, post="div", interpret=True, block_m=16,
                                             k_parts=4, programs=programs, parts_sum=parts_sum,
                                             blocks_per_step=b, a_load=a_load))
            for b in (1, 2, 4)]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])
    _check(outs[0], _reference(x, packed, scale, col, "div"))


def test_bad_operands_name_what_is_wrong(rng):
    x, packed, scale, col = (jnp.asarray(a) for a in _operands(rng, 1, 256, 512))
    with pytest.raises(ValueError, match="post must be"):
        nvfp4_a16_matmul_mgpu(x, packed, scale, col, post="add", interpret=True)
    with pytest.raises(ValueError, match="K % 256"):
        nvfp4_a16_matmul_mgpu(x[:, :384], packed[:, :192], scale[:, :24], col, post="div",
                              interpret=True)
    with pytest.raises(ValueError, match="one bf16 activation"):
        nvfp4_a16_matmul_mgpu(x.astype(jnp.float32), packed, scale, col, post="div",
                              interpret=True)
    with pytest.raises(ValueError, match="w_scale must be float8_e4m3fn"):
        nvfp4_a16_matmul_mgpu(x, packed, scale.astype(jnp.float32), col, post="div",
                              interpret=True)
    with pytest.raises(ValueError, match="blocks_per_step must be 1, or 2 or 4 where a K part holds a multiple"):
        nvfp4_a16_matmul_mgpu(x, packed, scale, col, post="div", interpret=True,
                              blocks_per_step=4, k_splits=2)
    with pytest.raises(ValueError, match="programs must be a positive int dividing the 8 pipeline steps"):
        nvfp4_a16_matmul_mgpu(x, packed, scale, col, post="div", interpret=True, programs=3)
    with pytest.raises(ValueError, match="w must be uint8"):
        nvfp4_a16_matmul_mgpu(x, packed[:, :128], scale, col, post="div", interpret=True)


def test_word_patterns_pair_codes_j_and_j_plus_4_for_every_code():
    """decode_words' integer step: in every word, pair j's halves are the byte decode's
    patterns of codes j and j + 4 -- each of the 16 codes at each of the 8 places."""
    rng = np.random.default_rng(7)
    q = rng.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    q[:16] = np.uint32(0x11111111) * np.arange(16, dtype=np.uint32)  # every code everywhere
    codes = (q[:, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15
    got = word_patterns(q)
    for j in range(4):
        want = nibble_patterns(codes[:, j] | (codes[:, j + 4] << 4))
        np.testing.assert_array_equal(got[:, j], want)


def test_word_register_map_and_the_halves_permutation():
    """UPCAST_4X gives a thread 8 consecutive codes a register (rows base, base + 8); the
    'halves' pairing is one column permutation, the same as its reshape form; a thread's 8
    codes lie in one NVFP4 / MX group."""
    from pallas_kernels.mgpu_relabel import PAIRINGS, column_permutation, permute_cols, permute_k
    first = word_register_map()
    np.testing.assert_array_equal(first, [0, 0, 32, 32, 64, 64, 96, 96])
    for pairing in PAIRINGS:
        p = column_permutation(pairing)
        assert sorted(p) == list(range(128))
        a = np.arange(2 * 256).reshape(2, 256).astype(np.float32)
        via_index = np.asarray(permute_k(jnp.asarray(a), pairing))
        np.testing.assert_array_equal(via_index[:, :128][:, p], a[:, :128])
        np.testing.assert_array_equal(np.asarray(permute_cols(jnp.asarray(a[:, :128]), pairing)),
                                      via_index[:, :128])
    assert all((c // 16) == (c + 7) // 16 for c in range(0, 128, 8))


@pytest.mark.parametrize("fmt,m,launch", [
    ("nvfp4", 1, {}), ("nvfp4", 5, dict(block_m=16, blocks_per_step=1)),
    ("nvfp4", 4, dict(block_m=8, blocks_per_step=4, programs=4)),
    ("mxfp4", 3, dict(block_m=16, k_splits=2, blocks_per_step=1))])
def test_interpreter_word_loads_match_the_float64_reference(rng, fmt, m, launch):
    """a_load='words': the tile's K columns permuted as decode_words hands them over, x
    permuted alike -- the same products."""
    n, k = 256, 1024
    if fmt == "nvfp4":
        x, packed, scale, col = _operands(rng, m, n, k)
        got = nvfp4_a16_matmul_mgpu(jnp.asarray(x), jnp.asarray(packed), jnp.asarray(scale),
                                    jnp.asarray(col), post="div", interpret=True,
                                    a_load="words", **launch)
        want = _reference(x, packed, scale, col, "div")
    else:
        x, w, scale = _mx_operands(rng, fmt, m, n, k)
        got = group_a16_matmul_mgpu(fmt, jnp.asarray(x), jnp.asarray(w), jnp.asarray(scale),
                                    interpret=True, a_load="words", **launch)
        want = _mx_reference(fmt, x, w, scale)
    assert got.shape == (m, n)
    _check(got, want)


def test_word_loads_refuse_8_bit_codes(rng):
    x, w, scale = (jnp.asarray(a) for a in _mx_operands(rng, "mxfp8", 1, 256, 512))
    with pytest.raises(ValueError, match="'words': e2m1 codes only"):
        group_a16_matmul_mgpu("mxfp8", x, w, scale, interpret=True, a_load="words")
    with pytest.raises(ValueError, match="a_load must be one of"):
        group_a16_matmul_mgpu("mxfp8", x, w, scale, interpret=True, a_load="relabel_4x")


@pytest.mark.parametrize("fmt,m,n,k", [("nvfp4", 1, 4096, 4096), ("nvfp4", 16, 24576, 7168),
                                       ("mxfp4", 1, 8192, 8192)])
def test_word_loads_lower_for_cuda_on_cpu(fmt, m, n, k):
    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((n, k // 2), jnp.uint8)
    if fmt == "nvfp4":
        s = jax.ShapeDtypeStruct((n, k // 16), jnp.float8_e4m3fn)
        c = jax.ShapeDtypeStruct((n,), jnp.float32)
        f = jax.jit(lambda *a: nvfp4_a16_matmul_mgpu(*a, post="div", a_load="words"))
        args = (x, w, s, c)
    else:
        s = jax.ShapeDtypeStruct((n, k // 32), jnp.uint8)
        f = jax.jit(lambda *a: group_a16_matmul_mgpu(fmt, *a, a_load="words"))
        args = (x, w, s)
    text = f.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text and "lop3.b32 a, a, 0x01C001C0, b, 0xEA" in text


@pytest.mark.parametrize("m,n,k,deterministic", [(1, 4096, 4096, False), (16, 14336, 4096, False),
                                                 (64, 8192, 8192, False),
                                                 (1, 24576, 7168, False),
                                                 (1, 24576, 7168, True)])
def test_lowers_for_cuda_on_cpu(m, n, k, deterministic):
    """The GPU route (the inline PTX decode in registers) builds for CUDA on CPU, for the
    dispatcher's decode launches (stream-K, ranges, deterministic parts); where a CTA finishes
    its rows, "div" divides by PTX div.full.f32 (mgpu_common.div_full: XLA:GPU's division, as
    in XLA's finish), never by Mosaic's own (IEEE) arith.divf."""
    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((n, k // 2), jnp.uint8)
    s = jax.ShapeDtypeStruct((n, k // 16), jnp.float8_e4m3fn)
    c = jax.ShapeDtypeStruct((n,), jnp.float32)
    f = jax.jit(lambda *a: nvfp4_a16_matmul_mgpu(*a, post="div", deterministic=deterministic))
    text = f.trace(x, w, s, c).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text and "arith.divf" not in text
    if (m, n) == (16, 14336):  # this launch's CTAs finish their rows
        assert "div.full.f32" in text


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 7, 16, 64, 255])
@pytest.mark.parametrize("n,k", [(4096, 4096), (6144, 4096), (4096, 14336), (2048, 7168)])
def test_gpu_matches_the_reference(rng, m, n, k):
    """Llama-3-8B's o_proj, qkv and down_proj, and K=7168 (K parts of odd block counts); the
    dispatcher's launch for each M, both global-scale conventions."""
    x, packed, scale, col = _operands(rng, m, n, k)
    for post in ("div", "mul"):
        got = nvfp4_a16_matmul_mgpu(jnp.asarray(x), jnp.asarray(packed), jnp.asarray(scale),
                                    jnp.asarray(col), post=post)
        _check(got, _reference(x, packed, scale, col, post, np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize("n,k", [(8192, 8192), (4096, 14336)])
def test_gpu_word_loads_match_the_reference(rng, fmt, m, n, k):
    """a_load='words' with the dispatcher's launch (8192x8192 at M <= 16: 4 K-blocks a step)."""
    if fmt == "nvfp4":
        x, packed, scale, col = _operands(rng, m, n, k)
        got = nvfp4_a16_matmul_mgpu(jnp.asarray(x), jnp.asarray(packed), jnp.asarray(scale),
                                    jnp.asarray(col), post="mul", a_load="words")
        _check(got, _reference(x, packed, scale, col, "mul", np.float32))
    else:
        x, w, scale = _mx_operands(rng, fmt, m, n, k)
        got = group_a16_matmul_mgpu(fmt, jnp.asarray(x), jnp.asarray(w), jnp.asarray(scale),
                                    a_load="words")
        _check(got, _mx_reference(fmt, x, w, scale, np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4_a16", "mxfp4_a16", "mxfp8_a16"])
@pytest.mark.parametrize("n,k", [(8192, 8192), (24576, 7168), (6144, 4096)])
def test_gpu_dispatcher_deterministic_rows_with_bf16_x(rng, fmt, n, k):
    """bf16 activations (one part: the Mosaic kernel at every M in deterministic mode, words
    and 4 K-blocks a step at M <= 16 on 8192x8192 and 24576x7168 -- there in steps across
    the ends of K parts of 7 blocks, one block a step at M=64 and 300; codes predecoded from
    det_predecode_min_m's rows: 2048, or 4096 for NVFP4's words on the first two shapes and
    MXFP4's on the second): rows computed alone equal the same rows inside M in
    {2, 7, 64, 300, 2048, 4096}, bitwise."""
    from invariance import assert_rows_batch_invariant
    from jqlin import formats, qweight
    w = rng.standard_normal((n, k)) * np.exp(0.5 * rng.standard_normal((n, 1))) * 0.05
    qw = qweight.quantize(jnp.asarray(w, jnp.float32), formats.get(fmt))
    assert_rows_batch_invariant(qw, k, jnp.bfloat16, rng, (2, 7, 64, 300, 2048, 4096), fmt)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16])
def test_gpu_deterministic_four_blocks_a_step_keep_the_sums(rng, m):
    """The deterministic launch with 4 K-blocks a step (8192x8192) gives bitwise its partition's
    sums with 2 a step."""
    n = k = 8192
    x, packed, scale, col = _operands(rng, m, n, k)
    args = (jnp.asarray(x), jnp.asarray(packed), jnp.asarray(scale), jnp.asarray(col))
    p = {key: v for key, v in group_launch_params(m, n, k, False, deterministic=True).items()
         if key != "a_in_registers"}
    assert p["blocks_per_step"] == 4
    four = nvfp4_a16_matmul_mgpu(*args, post="div", deterministic=True)
    two = nvfp4_a16_matmul_mgpu(*args, post="div", **{**p, "blocks_per_step": 2})
    np.testing.assert_array_equal(np.asarray(four), np.asarray(two))
    _check(four, _reference(x, packed, scale, col, "div", np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("m,n", [(1, 24576), (16, 36864)])
def test_gpu_deterministic_steps_across_part_ends_keep_the_sums(rng, fmt, m, n):
    """K=7168 (DeepSeek-V3): deterministic mode's streamed parts of 7 K-blocks in steps of 2
    or 4 that straddle the parts' ends give bitwise the same partition at one K-block a step
    (session 13's launch), within the float32 reference's bound."""
    k = 7168
    x, w, scale, kw, want = _format_case(rng, fmt, m, n, k)
    p = {key: v for key, v in group_launch_params(m, n, k, False, deterministic=True,
                                                  fmt=fmt).items() if key != "a_in_registers"}
    assert p["k_parts"] == 8 and "programs" in p and p["blocks_per_step"] > 1, p
    args = (jnp.asarray(x), jnp.asarray(w), jnp.asarray(scale))
    straddling = group_a16_matmul_mgpu(fmt, *args, **kw, deterministic=True)
    one = group_a16_matmul_mgpu(fmt, *args, **kw, **{**p, "blocks_per_step": 1})
    np.testing.assert_array_equal(np.asarray(straddling), np.asarray(one))
    _check(straddling, want)


@pytest.mark.gpu
@pytest.mark.parametrize("launch", [dict(block_m=16, k_splits=4), dict(block_m=8, programs=64),
                                    dict(block_m=16, k_parts=4, programs=32, parts_sum="store"),
                                    dict(block_m=64, k_parts=2),
                                    dict(block_m=8, blocks_per_step=1),
                                    dict(block_m=16, blocks_per_step=4, programs=128)])
@pytest.mark.parametrize("a_load", ["wgmma", "words"])
def test_gpu_launches_match_the_reference(rng, launch, a_load):
    m, n, k = 5, 4096, 4096
    x, packed, scale, col = _operands(rng, m, n, k)
    got = nvfp4_a16_matmul_mgpu(jnp.asarray(x), jnp.asarray(packed), jnp.asarray(scale),
                                jnp.asarray(col), post="div", a_load=a_load, **launch)
    _check(got, _reference(x, packed, scale, col, "div", np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("a_load", ["wgmma", "words"])
@pytest.mark.parametrize("blocks", [1, 2])
def test_gpu_decode_is_exact(rng, blocks, a_load):
    """One-hot activation rows pick single weights: y[i, n] = e2m1 * s (exact in float32) times
    the global, one float32 rounding -- bitwise what numpy gives, for every code of the tile."""
    n, k, m = 256, 512, 64
    _, packed, scale, col = _operands(rng, m, n, k)
    hot = rng.permutation(k)[:m]
    x = np.zeros((m, k), ml_dtypes.bfloat16)
    x[np.arange(m), hot] = 1
    got = nvfp4_a16_matmul_mgpu(jnp.asarray(x), jnp.asarray(packed), jnp.asarray(scale),
                                jnp.asarray(col), post="mul", out_dtype=jnp.float32,
                                block_m=64, blocks_per_step=blocks, a_load=a_load)
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(n, k)
    w = (E2M1_VALUES[codes].astype(np.float64)
         * np.repeat(scale.astype(np.float64), 16, axis=1)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(got), (w[:, hot] * col[:, None]).T)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,load", [("decode", "bytes"), ("decode", "words"),
                                         ("mgpu", "wgmma"), ("mgpu", "words")])
@pytest.mark.parametrize("bytes_", ["normal", "tiny"])
def test_gpu_mx_e2m1_decode_is_exact(rng, kernel, load, bytes_):
    """MXFP4's decode on the H200: one-hot activation rows pick single weights, y = e2m1 *
    2**(u - 127) bitwise, for every code and every e8m0 byte u of the range -- normal: 8-252
    (bf16 normal products), tiny: 0-7 (bf16 subnormal ones, kept by the bf16 multiplies and
    the tensor cores) -- on the decode kernel (both code loads) and group_a16_mgpu (both)."""
    from pallas_kernels.group_a16_decode_mgpu import group_a16_decode_mgpu
    n, k, m = 512, 1024, 16
    lo, hi = (8, 253) if bytes_ == "normal" else (0, 8)
    scale = rng.integers(lo, hi, (n, k // 32))
    hot = rng.permutation(k // 32)[:m] * 32 + rng.integers(0, 32, m)  # one column a group
    scale[:, hot // 32] = lo + rng.permutation(n * m).reshape(n, m) % (hi - lo)
    scale = scale.astype(np.uint8)
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    x = np.zeros((m, k), ml_dtypes.bfloat16)
    x[np.arange(m), hot] = 1
    args = (jnp.asarray(x), jnp.asarray(packed), jnp.asarray(scale))
    if kernel == "decode":
        got = group_a16_decode_mgpu("mxfp4", *args, load=load, out_dtype=jnp.float32)
    else:
        got = group_a16_matmul_mgpu("mxfp4", *args, a_load=load, out_dtype=jnp.float32)
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(n, k)
    w = E2M1_VALUES[codes].astype(np.float64) * 2.0 ** (np.repeat(scale, 32, 1) - 127.0)
    assert set(np.unique(scale[:, hot // 32])) == set(range(lo, hi))
    np.testing.assert_array_equal(np.asarray(got), w[:, hot].T.astype(np.float32))


def test_launch_rule_four_blocks_a_step_from_64_weight_tiles_at_m_le_16():
    nvfp4_launch_params = group_launch_params
    for n, k in ((8192, 8192), (57344, 8192), (24576, 7168)):
        p = nvfp4_launch_params(1, n, k, False)
        assert p["blocks_per_step"] == 4, p
        assert (k // 128 // p.get("k_splits", 1)) % 4 == 0
        if "programs" in p:  # re-shared: whole 4-block steps, >= 8 K-blocks a CTA
            assert (n // 128 * k // 512) % p["programs"] == 0
            assert n // 128 * k // 512 // p["programs"] >= 2
    assert nvfp4_launch_params(1, 4096, 4096, False).get("blocks_per_step", 1) != 4
    assert nvfp4_launch_params(64, 28672, 8192, False).get("blocks_per_step", 1) != 4
    det = nvfp4_launch_params(1, 28672, 8192, False, deterministic=True)
    assert det == {**launch_params(1, 28672, 8192, False, deterministic=True), "a_load": "words",
                   "blocks_per_step": 4}  # its partition (K parts of 8 blocks), 4 a step
    # K=7168: streamed parts of 7 K-blocks end inside steps; a CTA's run of 12 parts (84
    # K-blocks, 24576 rows) holds steps of 4, of 18 parts (126, 36864 rows) of 2
    for n, blocks in ((24576, 4), (36864, 2)):
        p = nvfp4_launch_params(1, n, 7168, False, deterministic=True)
        assert (p["k_parts"], p["programs"], p["blocks_per_step"]) == (8, 128, blocks), p
    # 8-bit codes keep the fp8 kernel's launch
    assert group_launch_params(1, 8192, 8192, False, fmt="mxfp8") == launch_params(
        1, 8192, 8192, False)


def test_launch_rule_words_by_weight_count_alone():
    """a_load='words' from WORDS_MIN_WEIGHTS weights, at every M and in both modes (a function
    of (N, K): deterministic rows keep one K order at every M); never for 8-bit codes."""
    from pallas_kernels.group_a16_mgpu import WORDS_MIN_WEIGHTS
    for fmt, (n, k) in (("nvfp4", (8192, 8192)), ("mxfp4", (24576, 7168))):
        assert n * k >= WORDS_MIN_WEIGHTS[fmt]
        for m in (1, 16, 64, 256, 4096):
            for det in (False, True):
                assert group_launch_params(m, n, k, False, deterministic=det,
                                           fmt=fmt)["a_load"] == "words"
    assert "a_load" not in group_launch_params(1, 4096, 4096, False, fmt="nvfp4")
    assert "a_load" not in group_launch_params(1, 8192, 8192, False, fmt="mxfp4")
    assert "a_load" not in group_launch_params(1, 57344, 8192, False, fmt="mxfp8")


@pytest.mark.parametrize("fmt", ["nvfp4_a16", "nvfp4", "mxfp4_a16", "mxfp4", "mxfp8_a16",
                                 "mxfp8"])
@pytest.mark.parametrize("m", [1, 6])
def test_dispatcher_path_mgpu_matches_the_xla_reference(rng, fmt, m):
    """Weight-only and quantized activations (the reference's, exact in bf16) through the
    format's Pallas kernel with path='mgpu' in the interpreter, against the XLA reference."""
    from jqlin import dispatch, formats, qweight
    from jqlin.kernels.pallas_fp4 import apply
    spec = formats.get(fmt)
    w = rng.standard_normal((256, 512)) * np.exp(0.5 * rng.standard_normal((256, 1)))
    x = jnp.asarray(rng.standard_normal((m, 512)), jnp.bfloat16)
    qw = qweight.quantize(jnp.asarray(w, jnp.float32), spec,
                          calibration=x if spec.activation is not None else None)
    got = apply(x, qw, spec, interpret=True, path="mgpu")
    ref = dispatch.matmul(x, qw, kernel="xla")
    assert got.shape == ref.shape and got.dtype == jnp.bfloat16
    g, r = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(g))
    assert np.linalg.norm(g - r) / np.linalg.norm(r) < 2 ** -8


def test_dispatcher_path_choice_and_refusal():
    from pallas_kernels.fp4_matmul import mgpu_path
    kw = dict(deterministic=False, config=None, path=None)
    assert mgpu_path("nvfp4", 1, 4096, 4096, 1, jnp.bfloat16, interpret=False,
                     **kw) == "pallas"  # no GPU here
    assert mgpu_path("nvfp4", 1, 4096, 4096, 1, jnp.bfloat16, interpret=True, **kw) == "pallas"
    with pytest.raises(ValueError, match="path='mgpu' cannot run.*one bf16 activation part"):
        mgpu_path("nvfp4", 1, 4096, 4096, 3, jnp.bfloat16, interpret=True, deterministic=False,
                  config=None, path="mgpu")
    with pytest.raises(ValueError, match="K % 256"):
        mgpu_path("nvfp4", 1, 4096, 4224, 1, jnp.bfloat16, interpret=True, deterministic=False,
                  config=None, path="mgpu")
    with pytest.raises(ValueError, match="K % 512"):
        mgpu_path("mxfp4", 1, 4096, 4352, 1, jnp.bfloat16, interpret=True, deterministic=False,
                  config=None, path="mgpu")


def test_dispatcher_takes_the_kernel_to_the_dense_m_where_its_waves_fill(monkeypatch):
    """Default mode on sm_90 (faked here: wgmma available, 132 SMs): the Mosaic kernel up to
    MGPU_MAX_M, then up to the dense path's M wherever its launch fills MID_M_MIN_FILL of its
    waves, dense where it would not (N=4096 at M=768: 192 CTAs, 0.73 of two waves) -- never
    the Triton kernel there (session 19: 0.26-0.45x bf16). Deterministic mode: the kernel."""
    from pallas_kernels import fp8_block_a16_mgpu, fp8_paths
    from pallas_kernels.fp4_matmul import MGPU_MAX_M, mgpu_path
    from pallas_kernels.mx_dense import DENSE_MIN_M
    monkeypatch.setattr(fp8_paths, "mosaic_wgmma_ok", lambda interpret: True)
    monkeypatch.setattr(fp8_block_a16_mgpu, "num_sms", lambda: 132)
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        def path(m, n, det=False):
            return mgpu_path(fmt, m, n, 4096, 1, jnp.bfloat16, deterministic=det, config=None,
                             path=None, interpret=False)
        assert path(MGPU_MAX_M[fmt], 4096) == "mgpu"
        assert path(512, 4096) == "mgpu" and path(768, 8192) == "mgpu"
        assert path(768, 4096) == "dense" and path(768, 4096, det=True) == "mgpu"
        assert path(DENSE_MIN_M, 8192) == "dense"


def _mx_operands(rng, fmt, m, n, k):
    if fmt == "mxfp4":
        w = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    else:
        w = rng.standard_normal((n, k)).astype(E4M3)
    scale = rng.integers(118, 132, (n, k // 32)).astype(np.uint8)  # 2**-9 .. 2**4
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    return x, w, scale


def _mx_reference(fmt, x, w, scale, dtype=np.float64):
    if fmt == "mxfp4":
        codes = np.stack([w & 15, w >> 4], axis=-1).reshape(w.shape[0], -1)
        v = E2M1_VALUES[codes].astype(dtype)
    else:
        v = w.astype(dtype)
    s = np.repeat(2.0 ** (scale.astype(np.float64) - 127), 32, axis=1).astype(dtype)
    return (x.astype(dtype) @ (v * s).T).astype(np.float64)


def _format_case(rng, fmt, m, n, k):
    """fmt's operands at (M, N, K), the launch keywords its format takes (NVFP4: the CT global
    scale, divided) and the float32 reference."""
    if fmt == "nvfp4":
        x, w, scale, col = _operands(rng, m, n, k)
        return x, w, scale, dict(col_scale=jnp.asarray(col), post="div"), _reference(
            x, w, scale, col, "div", np.float32)
    x, w, scale = _mx_operands(rng, fmt, m, n, k)
    return x, w, scale, {}, _mx_reference(fmt, x, w, scale, np.float32)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("m,launch", [(1, {}), (3, dict(block_m=16, k_splits=2,
                                                         blocks_per_step=1)),
                                      (9, dict(block_m=16, k_parts=2, blocks_per_step=2))])
def test_interpreter_mx_matches_the_float64_reference(rng, fmt, m, launch):
    """MX scale tiles hold four K-blocks' bytes: steps of one or two K-blocks share them."""
    n, k = 256, 1024
    x, w, scale = _mx_operands(rng, fmt, m, n, k)
    got = group_a16_matmul_mgpu(fmt, jnp.asarray(x), jnp.asarray(w), jnp.asarray(scale),
                                interpret=True, **({"block_m": 16, **launch} if launch else {}))
    assert got.shape == (m, n) and got.dtype == jnp.bfloat16
    _check(got, _mx_reference(fmt, x, w, scale))


@pytest.mark.parametrize("launch", [dict(block_m=32),
                                    dict(block_m=32, k_parts=4, k_groups=2, predecode=True,
                                         groups_sum="reload")])
def test_interpreter_mx_kernel_rounds_its_own_sums(rng, launch):
    """MX formats have no factor to apply after the MMA, so the kernel writes bf16 itself (one
    range; reloaded groups through the aliased staging): bitwise its float32 sums rounded."""
    x, w, scale = (jnp.asarray(a) for a in _mx_operands(rng, "mxfp8", 20, 256, 1024))
    f32 = group_a16_matmul_mgpu("mxfp8", x, w, scale, interpret=True, out_dtype=jnp.float32,
                                **launch)
    got = group_a16_matmul_mgpu("mxfp8", x, w, scale, interpret=True, **launch)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32),
                                  np.asarray(f32.astype(jnp.bfloat16), np.float32))


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("m,n,k,deterministic", [(1, 4096, 4096, False),
                                                 (16, 24576, 7168, False),
                                                 (64, 8192, 8192, True)])
def test_lowers_for_cuda_on_cpu_mx(fmt, m, n, k, deterministic):
    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    w = (jax.ShapeDtypeStruct((n, k // 2), jnp.uint8) if fmt == "mxfp4" else
         jax.ShapeDtypeStruct((n, k), jnp.float8_e4m3fn))
    s = jax.ShapeDtypeStruct((n, k // 32), jnp.uint8)
    f = jax.jit(lambda *a: group_a16_matmul_mgpu(fmt, *a, deterministic=deterministic))
    assert "mosaic_gpu" in f.trace(x, w, s).lower(lowering_platforms=("cuda",)).as_text()


def test_mx_bad_operands_name_what_is_wrong(rng):
    x, w, scale = (jnp.asarray(a) for a in _mx_operands(rng, "mxfp8", 1, 256, 512))
    with pytest.raises(ValueError, match="no global scale"):
        group_a16_matmul_mgpu("mxfp8", x, w, scale, post="div", interpret=True)
    with pytest.raises(ValueError, match=r"w must be float8_e4m3fn \(256, 512\)"):
        group_a16_matmul_mgpu("mxfp8", x, scale, scale, interpret=True)
    with pytest.raises(ValueError, match="fmt must be one of"):
        group_a16_matmul_mgpu("mxfp6", x, w, scale, interpret=True)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("m", [1, 7, 64, 255])
@pytest.mark.parametrize("n,k", [(4096, 4096), (2048, 7168)])
def test_gpu_mx_matches_the_reference(rng, fmt, m, n, k):
    x, w, scale = _mx_operands(rng, fmt, m, n, k)
    for det in (False, True):
        got = group_a16_matmul_mgpu(fmt, jnp.asarray(x), jnp.asarray(w), jnp.asarray(scale),
                                    deterministic=det)
        _check(got, _mx_reference(fmt, x, w, scale, np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,a_load", [("mxfp4", "wgmma"), ("mxfp4", "words"),
                                        ("mxfp8", "wgmma")])
def test_gpu_mx_decode_is_exact(rng, fmt, a_load):
    """One-hot rows pick single weights: code * 2**(u-127), exact in float32, bitwise."""
    n, k, m = 256, 512, 64
    _, w, scale = _mx_operands(rng, fmt, m, n, k)
    hot = rng.permutation(k)[:m]
    x = np.zeros((m, k), ml_dtypes.bfloat16)
    x[np.arange(m), hot] = 1
    got = group_a16_matmul_mgpu(fmt, jnp.asarray(x), jnp.asarray(w), jnp.asarray(scale),
                                out_dtype=jnp.float32, block_m=64, blocks_per_step=1,
                                a_load=a_load)
    if fmt == "mxfp4":
        v = E2M1_VALUES[np.stack([w & 15, w >> 4], axis=-1).reshape(n, k)].astype(np.float64)
    else:
        v = w.astype(np.float64)
    want = (v * np.repeat(2.0 ** (scale.astype(np.float64) - 127), 32, axis=1)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(got), want[:, hot].T)


# --- wgmma_halves for the group decode (session 16: prepared, lowered; not yet run on a GPU)

@pytest.mark.parametrize("group", [16, 32])
def test_half_tile_maps_are_the_first_half_of_the_k_block_maps(group):
    """A half K-block's registers (Layout.WGMMA, and UPCAST_4X words) are the first half of a
    whole K-block's, with the same rows and K groups counted from the half's start; the
    'halves' word pairing keeps a half's columns (it permutes inside 32 columns)."""
    from pallas_kernels.mgpu_relabel import column_permutation, pair_slots
    offset, grp = register_map(group)
    half_offset, half_grp = register_map(group, 64)
    np.testing.assert_array_equal(half_offset, offset[:16])
    np.testing.assert_array_equal(half_grp, grp[:16])
    assert set(grp[16:] - 64 // group) == set(half_grp)
    np.testing.assert_array_equal(word_register_map(64), word_register_map()[:4])
    slots = pair_slots("halves")
    assert pair_slots("halves", 64) == {s: r for s, r in slots.items() if s < 16}
    assert all(r < 16 for s, r in slots.items() if s < 16)
    p = column_permutation("halves")
    assert all(p[c] // 32 == c // 32 for c in range(128))


@pytest.mark.parametrize("fmt,a_load,launch", [
    ("nvfp4", "wgmma", dict(k_parts=8, k_groups=2)), ("nvfp4", "words", dict(k_parts=8)),
    ("mxfp4", "words", dict(k_splits=2, k_parts=4, k_groups=2)), ("mxfp8", "wgmma", {})])
def test_lowers_for_cuda_on_cpu_with_group_wgmma_halves(fmt, a_load, launch):
    """The group decode in halves (codes in swizzle atoms of half a K-block; each half decoded
    with its groups' scales) lowers for CUDA for each code format and load."""
    m, n, k = 256, 512, 2048
    w = (jax.ShapeDtypeStruct((n, k), jnp.float8_e4m3fn) if fmt == "mxfp8" else
         jax.ShapeDtypeStruct((n, k // 2), jnp.uint8))
    group = FORMATS[fmt].group
    ws = jax.ShapeDtypeStruct((n, k // group),
                              jnp.float8_e4m3fn if fmt == "nvfp4" else jnp.uint8)
    extra = (dict(post="mul", col_scale=jnp.ones((n,), jnp.float32)) if fmt == "nvfp4" else {})
    f = jax.jit(lambda x, w, ws: group_a16_matmul_mgpu(
        fmt, x, w, ws, **extra, a_load=a_load, wgmma_halves=True, a_in_registers=True,
        **launch))
    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    assert "mosaic_gpu" in f.trace(x, w, ws).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("kw,match", [
    (dict(blocks_per_step=4), "wgmma_halves splits one K-block a step; got blocks_per_step=4"),
    (dict(predecode=True), "it takes neither a_load='wgmma' nor wgmma_halves=True")])
def test_group_wgmma_halves_are_refused_with_several_k_blocks_a_step_or_predecode(rng, kw,
                                                                                 match):
    x, packed, scale, col = _operands(rng, 8, 256, 2048)
    with pytest.raises(ValueError, match=match):
        nvfp4_a16_matmul_mgpu(jnp.asarray(x), jnp.asarray(packed), jnp.asarray(scale),
                              jnp.asarray(col), post="div", interpret=True,
                              a_in_registers=False, block_m=16, wgmma_halves=True, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,a_load", [("nvfp4", "wgmma"), ("nvfp4", "words"),
                                        ("mxfp4", "wgmma"), ("mxfp4", "words"),
                                        ("mxfp8", "wgmma")])
@pytest.mark.parametrize("m,launch", [(300, dict(k_parts=8, k_groups=2)), (300, dict(k_parts=8)),
                                      (256, dict(k_splits=2, k_parts=4, k_groups=2)),
                                      (5, dict(block_m=16, k_splits=2))])
def test_gpu_group_wgmma_halves_give_the_same_bits(rng, fmt, a_load, m, launch):
    """The gate for taking wgmma_halves in the group kernels: bitwise the whole K-block's
    decode and sums at each launch form, within the float32 reference's bound."""
    _group_option_keeps_the_bits(rng, fmt, m, "wgmma_halves", (False, True),
                                 dict(a_load=a_load, **launch))


def _group_option_keeps_the_bits(rng, fmt, m, option, values, launch, *, n=2560, k=7168):
    """fmt's kernel with `option` set to each of `values` (on top of launch): every result
    bitwise the first, the last within the float32 reference's bound."""
    x, w, scale, kw, want = _format_case(rng, fmt, m, n, k)
    args = (jnp.asarray(x), jnp.asarray(w), jnp.asarray(scale))
    first, *rest = (np.asarray(group_a16_matmul_mgpu(fmt, *args, **kw, **{option: v}, **launch))
                    for v in values)
    for y in rest:
        np.testing.assert_array_equal(y, first)
    _check(rest[-1], want)


# -- predecode (session 17): codes decoded to bf16 by XLA, wgmma's A from shared memory --

@pytest.mark.parametrize("fmt,a_load", [("nvfp4", "wgmma"), ("nvfp4", "words"),
                                        ("mxfp4", "words"), ("mxfp8", "wgmma")])
@pytest.mark.parametrize("m,launch", [(5, dict(block_m=8, k_parts=4, k_groups=2))])
def test_interpreter_predecoded_codes_give_the_same_bits(rng, fmt, a_load, m, launch):
    """decode_jnp's values (K-blocks permuted as the words hand them over, x alike) in the
    decoding kernel's wgmma chain: bitwise its sums, within the float32 reference's bound
    (the parked two-group launch predecode runs in; the GPU test covers the other forms)."""
    _group_option_keeps_the_bits(rng, fmt, m, "predecode", (False, True), dict(
        a_load=a_load, interpret=True, a_in_registers=False, out_dtype=jnp.float32, **launch),
        n=256, k=2048)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,a_load", [("nvfp4", "wgmma"), ("nvfp4", "words"),
                                        ("mxfp4", "words"), ("mxfp8", "wgmma")])
@pytest.mark.parametrize("m,launch", [(1024, dict(k_parts=8, k_groups=2)),
                                      (1024, dict(k_parts=8)), (300, {}),
                                      (5, dict(block_m=16, k_splits=2))])
def test_gpu_predecoded_codes_give_the_same_bits(rng, fmt, a_load, m, launch):
    """The gate for predecode in the group formats: the PTX decode's values and decode_jnp's
    are the same bf16 numbers, and wgmma sums them the same from registers or shared memory."""
    _group_option_keeps_the_bits(rng, fmt, m, "predecode", (False, True),
                                 dict(a_load=a_load, **launch))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,a_load", [("nvfp4", "words"), ("mxfp4", "words"),
                                        ("mxfp8", "wgmma")])
@pytest.mark.parametrize("predecode", [False, True])
def test_gpu_group_stored_groups_give_the_parked_bits(rng, fmt, a_load, predecode):
    """groups_sum="store" (and, predecoded, "reload") in the group formats: bitwise the parked
    launch's sums."""
    _group_option_keeps_the_bits(rng, fmt, 1024, "groups_sum", ("park", "store") + (
        ("reload",) if predecode else ()), dict(a_load=a_load, predecode=predecode, k_parts=8,
                                                k_groups=2))


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,launch", [
    (1024, 24576, 7168, "det"),  # deterministic mode: in-CTA parts, one group (y by the CTAs)
    (4096, 8192, 8192, "det-predecode"),  # predecoded, the first group's sum reloaded
    (300, 4096, 4096, dict(k_parts=8)), (7, 2560, 7168, dict(block_m=16))])
@pytest.mark.parametrize("post", ["div", "mul"])
def test_gpu_row_finish_in_the_cta_gives_xlas_bits(rng, m, n, k, launch, post):
    """On the GPU: NVFP4's finish in the CTAs (bf16 output) is bitwise XLA's finish of the same
    launch's float32 sums, rounded after; within the float32 reference's bound."""
    if isinstance(launch, str):
        launch = {key: v for key, v in group_launch_params(
            m, n, k, False, deterministic=True, fmt="nvfp4",
            predecode=launch.endswith("predecode")).items() if key != "a_in_registers"}
    x, packed, scale, col = _operands(rng, m, n, k)
    args = [jnp.asarray(a) for a in (x, packed, scale, col)]
    run = lambda dtype: np.asarray(nvfp4_a16_matmul_mgpu(  # noqa: E731
        *args, post=post, out_dtype=dtype, **launch).astype(jnp.bfloat16))
    np.testing.assert_array_equal(run(jnp.bfloat16).view(np.uint16),
                                  run(jnp.float32).view(np.uint16))
    _check(run(jnp.bfloat16), _reference(x, packed, scale, col, post, np.float32))


def test_interpreter_group_reloaded_groups_give_the_parked_bits(rng):
    """groups_sum="reload" on predecoded e2m1 words (x's K permuted): the parked launch's
    bits (the group kernels write float32: their finish scales the sums)."""
    _group_option_keeps_the_bits(rng, "mxfp4", 20, "groups_sum", ("park", "reload"), dict(
        a_load="words", predecode=True, interpret=True, a_in_registers=False, block_m=32,
        k_parts=4, k_groups=2, out_dtype=jnp.float32), n=256, k=2048)
