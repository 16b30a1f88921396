"""Activation quantization by one Pallas (Triton) pass, elementwise over (M, K) tiles:
  e4m3_codes     FP8 codes q = e4m3(clip(x / s, +-448)), the scales s already computed by the
                 caller's producer rule (session 31);
  e4m3_group_codes  the same codes of the dynamic 1 x 128 group rules with their amax and
                 scales computed in the pass too (session 40);
  nvfp4_operand  the whole NVFP4 dynamic rule (amax per 16, e4m3 block scale, e2m1 codes) and
                 the W4A4 operand code * block scale, exact in bf16 (session 32);
  mx_operand     the whole MX dynamic rule (amax per 32, e8m0 exponent, e2m1 / e4m3 codes) and
                 the operand code * 2**k (session 32; routed since session 35).

Why kernels of our own: the quotients must be the correctly rounded ones (the producers divide
in IEEE float32), and XLA's GPU division is not (div.full.f32); jqlin's exact XLA division
corrects it with integer arithmetic, which made the quantization ALU-bound at prefill sizes
(H200, 4096 x 8192 bf16: FP8 codes 173 us, NVFP4 operand 175 us, against 50 / 57 us here) and
at decode sizes two or three XLA launches (NVFP4: 3.0 us against 1.1; MX divides by nothing,
but is two or three launches too). Here the quotient is the hardware's own IEEE division
(`div.rn.f32`) and the roundings are the compiler's RTNE e4m3 conversion (FP8 codes) or exact
integer / power-of-two arithmetic -- the same bits as jqlin.numerics (tests: bitwise on the
GPU, every rule, MX since session 35; e4m3_group_codes in interpret mode so far).

NaN: a group (a row, the tensor) holding a NaN gets a NaN scale in jqlin.numerics, so its values
and its rows' outputs are NaN. Here the GPU's float min / max ignore NaN (Pallas' Triton
lowering is maxnumf / minnumf: max(NaN, 1) = 1), so a group's amax is taken on the magnitudes'
bits (as integers a NaN pattern exceeds inf), NaN groups get their NaN scale explicitly, and
clips keep NaN; interpret mode computes min / max the GPU's way (`_fmax`, `_fmin`), so the CPU
tests see what the H200 would.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .mx_decode import e8m0_to_f32, expand_groups

__all__ = ["e4m3_codes", "e4m3_group_codes", "nvfp4_operand", "mx_operand", "FP8_GROUP_RULES",
           "NVFP4_RULES", "MX_RULES", "serves", "tile"]

ROWS = 16  # activation rows per program, at most
COLS = 512  # K columns per program, at most (128 the least: a multiple of every group size)
# Programs a launch should have at least (4 an SM of the H200's 132): at decode sizes a
# (16, 512) tile left 8-16 programs doing every division serially -- 4.4 us at M = 16,
# K = 4096, slower than XLA's two fusions (session 32)
_MIN_PROGRAMS = 528
_WARPS = 4
_E4M3_MAX = 448.0
_E2M1_MAX = 6.0
_E4M3_EPS = 0.125  # compressed-tensors' replacement for a zero block scale
# FP8 dynamic groups (e4m3_group_codes): the rules' constants as jqlin.numerics has them
FP8_GROUP_RULES = ("compressed-tensors", "modelopt", "vllm", "deepseek")
_F32_EPS = 2.0 ** -23  # CT / ModelOpt's replacement for a zero scale (float32 eps)
_VLLM_MIN_SCALE = 1.0 / (_E4M3_MAX * 512.0)  # vLLM's per-token / group scale floor
_DEEPSEEK_AMAX_FLOOR = 1e-4
_INV_E4M3_MAX = 1.0 / 448.0  # (DeepSeek multiplies by f32(1/448))
NVFP4_RULES = ("compressed-tensors", "modelopt")  # activation global scale: divisor / multiplier
MX_RULES = ("compressed-tensors", "modelopt")  # e8m0 exponent: rounded amax / ceil(log2(amax/max))
_MX_EMAX = {"e4m3": 8, "e2m1": 2}  # the element's largest exponent (compressed-tensors' rule)
_MX_ELEM_MAX = {"e4m3": 448.0, "e2m1": 6.0}
# ModelOpt's e2m1 cast: exclusive thresholds, so a tie keeps the lower magnitude
_E2M1_TOWARD_ZERO = ((0.25, 0.5), (0.75, 1.0), (1.25, 1.5), (1.75, 2.0), (2.5, 3.0), (3.5, 4.0),
                     (5.0, 6.0))


def div_rn(a: jax.Array, b: jax.Array, *, interpret: bool) -> jax.Array:
    """float32 a / b correctly rounded: PTX div.rn.f32, spelled out (a plain `/` is not
    promised IEEE on the GPU: XLA's is div.full.f32). Interpret mode: the CPU's IEEE division,
    its divisor behind a barrier (XLA would make a division by a broadcast a reciprocal
    multiply)."""
    if interpret:
        return a / jax.lax.optimization_barrier(jnp.broadcast_to(b, a.shape))
    [q] = pltriton.elementwise_inline_asm(
        "div.rn.f32 $0, $1, $2;", args=[a, b], constraints="=r,r,r", pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(a.shape, jnp.float32)])
    return q


def _fmax(a, b, *, interpret: bool) -> jax.Array:
    """max(a, b) as the GPU kernel computes it: a NaN operand yields the other (maxnumf);
    interpret mode models that (XLA's max would return the NaN)."""
    return jnp.fmax(a, b) if interpret else jnp.maximum(a, b)


def _fmin(a, b, *, interpret: bool) -> jax.Array:
    """min(a, b) as the GPU kernel computes it (minnumf; see _fmax)."""
    return jnp.fmin(a, b) if interpret else jnp.minimum(a, b)


def _clip(v: jax.Array, bound: float, *, interpret: bool) -> jax.Array:
    """v clipped to +-bound as the GPU computes it: a NaN becomes -bound."""
    return _fmin(_fmax(v, -bound, interpret=interpret), bound, interpret=interpret)


def _clip_keeping_nan(v: jax.Array, bound: float, *, interpret: bool) -> jax.Array:
    """v clipped to +-bound, NaN kept NaN."""
    return jnp.where(v != v, v, _clip(v, bound, interpret=interpret))


def _group_amax(x: jax.Array, group: int) -> jax.Array:
    """(rows, K / group) largest |x| of each group along K, NaN where the group holds a NaN:
    the maximum of the magnitudes' bit patterns as integers (which order like the values, a
    NaN above inf), since the GPU's float maximum passes over NaN."""
    bits = jax.lax.bitcast_convert_type(x, jnp.int32) & 0x7FFFFFFF
    amax = jnp.max(bits.reshape(x.shape[0], x.shape[1] // group, group), axis=-1)
    return jax.lax.bitcast_convert_type(amax, jnp.float32)


def serves(m: int, k: int, min_m: int | None, *, interpret: bool = False) -> bool:
    """Whether these kernels take an (M, K) activation rather than XLA's rule: on the GPU (not
    in interpret mode, which divides with the backend's division), K a multiple of 128 (every
    kernel's least tile), M >= min_m (None: not routed). The callers' routing rules."""
    return (min_m is not None and not interpret and _on_gpu() and m >= min_m
            and k % 128 == 0)


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def tile(m: int, k: int) -> tuple[int, int]:
    """(rows, cols) of a program's tile: (16, 512) where the launch has programs enough, else
    fewer rows (down to 1), then 128 columns; cols 128 where K is not a multiple of 512."""
    rows, cols = min(ROWS, pl.next_power_of_2(m)), COLS if k % COLS == 0 else 128
    while rows > 1 and pl.cdiv(m, rows) * (k // cols) < _MIN_PROGRAMS:
        rows //= 2
    if pl.cdiv(m, rows) * (k // cols) < _MIN_PROGRAMS:
        cols = 128
    return rows, cols


def _x_shape(x: jax.Array, who: str) -> tuple[int, int]:
    if x.ndim != 2 or x.shape[1] % 128:
        raise ValueError(f"{who}: x must be (M, K) with K a multiple of 128, got {x.shape}")
    return x.shape


def _load_rows(x_ref, m: int, rows: int):
    """The program's x tile in float32, its live rows (rows, 1) and their mask over the tile.
    Pallas' Triton lowering masks nothing by itself: the last row block, where M is not a
    multiple of `rows`, loads and stores under this mask (unmasked, its stores overwrote the
    next buffer on the H200)."""
    live = pl.program_id(0) * rows + jax.lax.broadcasted_iota(jnp.int32, (rows, 1), 0) < m
    mask = jnp.broadcast_to(live, (rows, x_ref.shape[1]))
    return pltriton.load(x_ref, mask=mask, other=0).astype(jnp.float32), live, mask


def _launch(kernel, x: jax.Array, *inputs, in_specs=(), out_dtype, tiles: tuple[int, int],
            name: str, interpret: bool) -> jax.Array:
    """kernel over (rows, cols) tiles of x (M, K) and an output like x in out_dtype."""
    (m, k), (rows, cols) = x.shape, tiles
    block = pl.BlockSpec((rows, cols), lambda i, j: (i, j))
    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((m, k), out_dtype),
        grid=(pl.cdiv(m, rows), k // cols), in_specs=[block, *in_specs], out_specs=block,
        compiler_params=pltriton.CompilerParams(num_warps=_WARPS, num_stages=1),
        interpret=interpret, name=name)(x, *inputs)


def _kernel(x_ref, s_ref, q_ref, *, m: int, rows: int, per: int | None, interpret: bool):
    # per: K columns a scale covers (a group), 1 a row's, None the tensor's
    x, live, mask = _load_rows(x_ref, m, rows)
    if per is None:
        s = jnp.broadcast_to(s_ref[...], x.shape)
    else:
        s = pltriton.load(s_ref, mask=jnp.broadcast_to(live, s_ref.shape), other=1.0)
        s = expand_groups(s, per) if per > 1 else jnp.broadcast_to(s, x.shape)
    q = _clip_keeping_nan(div_rn(x, s, interpret=interpret), _E4M3_MAX, interpret=interpret)
    pltriton.store(q_ref, q.astype(q_ref.dtype), mask=mask)


def e4m3_codes(x: jax.Array, scale: jax.Array, *, interpret: bool = False) -> jax.Array:
    """x (M, K) float (K a multiple of 128), scale float32 (1, 1) per tensor, (M, 1) per row or
    (M, K / g) per group of g (a divisor of 128) along K -> e4m3 codes (M, K) of
    clip(x / scale, +-448), the quotient correctly rounded, ties to even; NaN stays NaN."""
    m, k = _x_shape(x, "e4m3_codes")
    if scale.dtype != jnp.float32 or scale.ndim != 2 or scale.shape[0] not in (1, m):
        raise ValueError(f"e4m3_codes: scale must be float32 (1, 1), ({m}, 1) or ({m}, K/g), "
                         f"got {scale.dtype} {scale.shape}")
    rows, cols = tile(m, k)
    if scale.shape == (1, 1):
        s_spec, per = pl.BlockSpec((1, 1), lambda i, j: (0, 0)), None
    elif scale.shape[1] == 1:
        s_spec, per = pl.BlockSpec((rows, 1), lambda i, j: (i, 0)), 1
    else:
        group = k // scale.shape[1]
        if group * scale.shape[1] != k or cols % group:
            raise ValueError(f"e4m3_codes: a per-group scale {scale.shape} must divide K = {k} "
                             f"into groups dividing {cols}")
        s_spec, per = pl.BlockSpec((rows, cols // group), lambda i, j: (i, j)), group
    return _launch(functools.partial(_kernel, m=m, rows=rows, per=per, interpret=interpret),
                   x, scale, in_specs=[s_spec], out_dtype=jnp.float8_e4m3fn,
                   tiles=(rows, cols), name="e4m3_codes", interpret=interpret)


def _fp8_group_scales(amax: jax.Array, rule: str, *, interpret: bool) -> jax.Array:
    """float32 scales of jqlin.numerics.fp8_division_scale's dynamic rules (written again: this
    package does not import jqlin) from (rows, groups) amaxes, NaN for a NaN amax: amax / 448
    correctly rounded, 0 -> float32 eps (CT, ModelOpt) or floored at 1 / (448 * 512) (vLLM);
    DeepSeek's 2**ceil(log2(max(amax, 1e-4) * f32(1/448))) off the product's fields, NaN for an
    infinite amax too."""
    nan = amax != amax
    if rule == "deepseek":
        t = _fmax(amax, _DEEPSEEK_AMAX_FLOOR, interpret=interpret) * _INV_E4M3_MAX
        bits = jax.lax.bitcast_convert_type(t, jnp.uint32)
        u = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).astype(jnp.uint32)
        s = jax.lax.bitcast_convert_type(u << 23, jnp.float32)  # (t normal: u in 105..247)
        return jnp.where(nan | (amax == jnp.inf), jnp.nan, s)
    s = div_rn(amax, jnp.full_like(amax, _E4M3_MAX), interpret=interpret)
    if rule == "vllm":
        return jnp.where(nan, s, _fmax(s, _VLLM_MIN_SCALE, interpret=interpret))
    return jnp.where(s == 0, _F32_EPS, s)


def _group_kernel(x_ref, q_ref, s_ref, *, m: int, rows: int, rule: str, interpret: bool):
    # the whole rule a tile at a time: its groups of 128 lie inside one row of the tile
    x, live, mask = _load_rows(x_ref, m, rows)
    s = _fp8_group_scales(_group_amax(x, 128), rule, interpret=interpret)
    q = _clip_keeping_nan(div_rn(x, expand_groups(s, 128), interpret=interpret), _E4M3_MAX,
                          interpret=interpret)
    pltriton.store(q_ref, q.astype(q_ref.dtype), mask=mask)
    pltriton.store(s_ref, s, mask=jnp.broadcast_to(live, s.shape))


def e4m3_group_codes(x: jax.Array, *, rule: str,
                     interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """x (M, K) float, K a multiple of 128 -> (e4m3 codes (M, K), float32 scales (M, K / 128)) of
    the dynamic 1 x 128 group rule `rule` (FP8_GROUP_RULES), amax and scales included, in one
    pass: e4m3(clip(x / s, +-448)), the quotient correctly rounded. Bitwise jqlin.numerics'
    quantize_activation (tests: tests/kernels/test_act_quant.py, interpret mode; written in
    session 40 with no GPU lent, its GPU tests not yet run); a group holding a NaN gets a NaN
    scale and NaN codes."""
    if rule not in FP8_GROUP_RULES:
        raise ValueError(f"e4m3_group_codes: rule must be one of {FP8_GROUP_RULES}, got {rule!r}")
    m, k = _x_shape(x, "e4m3_group_codes")
    rows, cols = tile(m, k)
    block = pl.BlockSpec((rows, cols), lambda i, j: (i, j))
    s_block = pl.BlockSpec((rows, cols // 128), lambda i, j: (i, j))
    return pl.pallas_call(
        functools.partial(_group_kernel, m=m, rows=rows, rule=rule, interpret=interpret),
        out_shape=(jax.ShapeDtypeStruct((m, k), jnp.float8_e4m3fn),
                   jax.ShapeDtypeStruct((m, k // 128), jnp.float32)),
        grid=(pl.cdiv(m, rows), k // cols), in_specs=[block], out_specs=(block, s_block),
        compiler_params=pltriton.CompilerParams(num_warps=_WARPS, num_stages=1),
        interpret=interpret, name="e4m3_group_codes")(x)


def _rni(v: jax.Array, *, interpret: bool) -> jax.Array:
    """float32 v rounded to an integer, ties to even (PTX cvt.rni: Pallas' Triton lowering has
    no round)."""
    if interpret:
        return jnp.round(v)
    [r] = pltriton.elementwise_inline_asm(
        "cvt.rni.f32.f32 $0, $1;", args=[v], constraints="=r,r", pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(v.shape, jnp.float32)])
    return r


def _round_e4m3_positive(v: jax.Array, *, interpret: bool) -> jax.Array:
    """float32 values of e4m3(v) for v >= 0, ties to even, saturating at 448: the significand
    rounded to 4 bits on the bits (normal range) or whole steps of 2**-9 below 2**-6 -- integer
    and exact-float arithmetic only, the same on the GPU and in interpret mode (where XLA may
    delete a narrowing convert pair)."""
    v = _fmin(v, _E4M3_MAX, interpret=interpret)
    bits = jax.lax.bitcast_convert_type(v, jnp.uint32)
    odd = (bits >> 20) & 1
    normal = jax.lax.bitcast_convert_type((bits + 0x7FFFF + odd) & jnp.uint32(0xFFF00000),
                                          jnp.float32)
    sub = _rni(v * 512.0, interpret=interpret) * (1.0 / 512.0)
    return jnp.where(v < 2.0 ** -6, sub, normal)


def _round_e2m1(v: jax.Array, *, interpret: bool) -> jax.Array:
    """float32 values of e2m1(v), ties to even, saturating at +-6: whole steps of 0.5 below 2,
    1 below 4, 2 above (scaling by the step is exact: powers of two)."""
    c = _clip(v, _E2M1_MAX, interpret=interpret)
    mag = jnp.abs(c)
    step = jnp.where(mag < 2.0, 0.5, jnp.where(mag < 4.0, 1.0, 2.0))
    inv = jnp.where(mag < 2.0, 2.0, jnp.where(mag < 4.0, 1.0, 0.5))
    return _rni(c * inv, interpret=interpret) * step


def _nvfp4_kernel(x_ref, g_ref, o_ref, *, m: int, rows: int, rule: str, interpret: bool):
    # the whole rule a tile at a time: its groups of 16 lie inside one row of the tile
    x, _, mask = _load_rows(x_ref, m, rows)
    g = g_ref[...]
    amax = _group_amax(x, 16)
    div = functools.partial(div_rn, interpret=interpret)
    if rule == "compressed-tensors":  # global scale divides: s = e4m3(g * amax / 6), t = s / g
        s = _round_e4m3_positive(div(g * amax, jnp.full_like(amax, _E2M1_MAX)),
                                 interpret=interpret)
        s = jnp.where(s == 0, _E4M3_EPS, s)
        t = div(s, jnp.broadcast_to(g, s.shape))
    else:  # ModelOpt, global scale multiplies: b = e4m3(clip(amax / (6 g))), t = b * g
        b = div(amax, jnp.broadcast_to(_E2M1_MAX * g, amax.shape))
        b = jnp.where(b == 0, 1.0, b)
        s = _round_e4m3_positive(_fmax(b, 2.0 ** -9, interpret=interpret), interpret=interpret)
        t = s * g
    s = jnp.where(amax != amax, jnp.nan, s)  # a NaN group's scale (its codes: any)
    q = _round_e2m1(div(x, expand_groups(t, 16)), interpret=interpret)
    pltriton.store(o_ref, (q * expand_groups(s, 16)).astype(o_ref.dtype), mask=mask)


def nvfp4_operand(x: jax.Array, global_scale: jax.Array, *, rule: str,
                  interpret: bool = False) -> jax.Array:
    """x (M, K) float, K a multiple of 128 -> bf16 (M, K): e2m1 code * e4m3 block scale of the
    NVFP4 dynamic activation rule (groups of 16 along K, the static activation global scale
    `global_scale`, a divisor under compressed-tensors, a multiplier under ModelOpt), in one
    pass. The global factor is the caller's to apply to the float32 accumulator; code * e4m3
    has <= 6 significant bits, so the bf16 product is exact. Bitwise jqlin.numerics'
    quantize_activation (tests: tests/kernels/test_act_quant.py); a group holding a NaN is NaN
    throughout, as its NaN scale makes it there."""
    if rule not in NVFP4_RULES:
        raise ValueError(f"nvfp4_operand: rule must be one of {NVFP4_RULES}, got {rule!r}")
    m, k = _x_shape(x, "nvfp4_operand")
    g = jnp.asarray(global_scale)
    if g.dtype != jnp.float32 or g.size != 1:
        raise ValueError(f"nvfp4_operand: global_scale must be one float32, got {g.dtype} "
                         f"{g.shape}")
    rows, cols = tile(m, k)
    return _launch(functools.partial(_nvfp4_kernel, m=m, rows=rows, rule=rule,
                                     interpret=interpret),
                   x, g.reshape(1, 1), in_specs=[pl.BlockSpec((1, 1), lambda i, j: (0, 0))],
                   out_dtype=jnp.bfloat16, tiles=(rows, cols), name="nvfp4_operand",
                   interpret=interpret)


def _with_sign_of(mag: jax.Array, x: jax.Array) -> jax.Array:
    """mag (>= 0) with x's sign bit, -0 included (what a signed cast gives)."""
    sign = jax.lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0x80000000)
    return jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(mag, jnp.uint32) | sign,
                                        jnp.float32)


def _mx_exponent(amax: jax.Array, elem: str, rule: str, *, interpret: bool) -> jax.Array:
    """The biased e8m0 exponent u (int32, 0..254; 255 for a NaN amax) of jqlin.numerics.e8m0's
    producer rules (written again: this package does not import jqlin), on the bits:
    compressed-tensors' exponent_ct (amax's mantissa rounded to a power of two, less the
    element's largest exponent) or ModelOpt's exponent_modelopt (ceil(log2(amax / max)) from
    the quotient's fields; 127 for an infinite one)."""
    if rule == "compressed-tensors":
        bits = jax.lax.bitcast_convert_type(amax, jnp.uint32)
        field = (((bits + (1 << 21)) >> 23) & 0xFF).astype(jnp.int32)
        u = jnp.clip(jnp.where(amax > 0, field - _MX_EMAX[elem], 0), 0, 254)
        return jnp.where(amax != amax, 255, u)
    v = div_rn(amax, jnp.full_like(amax, _MX_ELEM_MAX[elem]), interpret=interpret)
    bits = jax.lax.bitcast_convert_type(v, jnp.uint32)
    biased = ((bits >> 23) & 0xFF).astype(jnp.int32)
    frac = bits & 0x7FFFFF
    e = biased - 126 - (frac == 0).astype(jnp.int32)  # a power of two is its own ceil
    e = jnp.where(biased == 0, jnp.where(frac > (1 << 22), -126, -127), e)  # subnormal v
    e = jnp.where((biased == 0) & (frac == 0), 0, e)
    e = jnp.where(biased == 255, 127, e)  # an infinite quotient: ceil(log2(inf)) clamps to 127
    return jnp.where(amax != amax, 255, jnp.clip(jnp.where(amax > 0, e, -127), -127, 127) + 127)


def _mx_kernel(x_ref, o_ref, *, m: int, rows: int, elem: str, rule: str, interpret: bool):
    # the whole rule a tile at a time: its groups of 32 lie inside one row of the tile
    x, _, mask = _load_rows(x_ref, m, rows)
    amax = _group_amax(x, 32)
    u = _mx_exponent(amax, elem, rule, interpret=interpret)
    # dividing by 2**(u-127) is multiplying by 2**(127-u): exact, and a normal number for
    # u <= 253 (every finite amax); u = 254 (ModelOpt, inf) takes 2**-126 then 1/2, as
    # jqlin.numerics.divide_by_e8m0 (2**-127 is subnormal: flushed, inf * 0 = NaN); a NaN
    # group's u = 255 makes its operand NaN whatever its codes
    half = jnp.where(u == 254, 0.5, 1.0)  # (per group; a multiply by 1 is exact)
    scaled = x * expand_groups(e8m0_to_f32(254 - jnp.minimum(u, 253)), 32) * expand_groups(half, 32)
    if elem == "e4m3":  # ties to even, saturating (both rules)
        q = _with_sign_of(_round_e4m3_positive(jnp.abs(scaled), interpret=interpret), scaled)
    elif rule == "compressed-tensors":  # ties to even
        q = _round_e2m1(scaled, interpret=interpret)
    else:  # ModelOpt: ties toward zero
        mag, val = jnp.abs(scaled), jnp.zeros_like(scaled)
        for bound, value in _E2M1_TOWARD_ZERO:
            val = jnp.where(mag > bound, value, val)
        q = _with_sign_of(val, scaled)
    pltriton.store(o_ref, (q * expand_groups(e8m0_to_f32(u), 32)).astype(o_ref.dtype), mask=mask)


def mx_operand(x: jax.Array, *, elem: str, rule: str, interpret: bool = False) -> jax.Array:
    """x (M, K) float, K a multiple of 128 -> bf16 (M, K): code * 2**(u - 127) of the MX
    dynamic activation rule (groups of 32 along K, e8m0 scales by `rule`'s exponent, `elem`
    "e4m3" (MXFP8) or "e2m1" (MXFP4) codes: ties to even, or toward zero for ModelOpt's e2m1),
    in one pass; exact in bf16 (<= 4 significant bits). Bitwise jqlin.numerics'
    quantize_activation (tests: tests/kernels/test_act_quant.py, interpret mode; a group holding
    a NaN is NaN throughout, its scale NaN) on every input but groups whose amax is below
    2**-100 (subnormal scales and quotients, which XLA's GPU code flushes to zero); on the GPU
    bitwise too (tests/kernels/test_act_quant.py, H200, session 35)."""
    if elem not in _MX_EMAX or rule not in MX_RULES:
        raise ValueError(f"mx_operand: elem must be one of {tuple(_MX_EMAX)} and rule one of "
                         f"{MX_RULES}, got {elem!r}, {rule!r}")
    m, k = _x_shape(x, "mx_operand")
    rows, cols = tile(m, k)
    return _launch(functools.partial(_mx_kernel, m=m, rows=rows, elem=elem, rule=rule,
                                     interpret=interpret),
                   x, out_dtype=jnp.bfloat16, tiles=(rows, cols), name="mx_operand",
                   interpret=interpret)
