"""One Triton-backend Pallas kernel body for every fp8 matmul this package runs.

    y[m, n] = sum_k  x[m, k] * q[n, k]  (times the scales of the operands)

x is either floating point (W8A16: the e4m3 weight tile is converted to x's dtype, exactly) or
e4m3 codes (W8A8: an fp8 x fp8 MMA). Both products are exact in float32 and are accumulated in
float32 -- except that an fp8 MMA with `promote_k` set accumulates that many K elements inside
the tensor core (~14-bit) before each float32 add (see fp8_dot; measured 1.3e-4 normwise at
promote_k=128 on the H200). Scales enter in one of two places:
  * whole-K scales (per-tensor / per-channel weight, per-tensor / per-token activation) scale
    the finished float32 accumulator once;
  * per-K-block scales (128x128 weight blocks, 1x128 activation groups) scale each K-step's
    partial product before it is added, so a K-step never straddles a 128-column block.

The weight is stored (N, K) row-major, i.e. K-major: the layout fp8 tensor-core MMAs want for
their B operand, so no transpose is ever materialised.

Partial tiles: the Triton backend does not mask block reads, so every tile is read with an
explicit mask when the static shapes say the tile can run off the edge (M, N or K not a multiple
of the tile); out-of-range rows/cols read zeros and are never stored.

Reduction order: within a program the K-steps run in order, each step's dot is one MMA chain
over block_k; with split_k > 1 each split covers a contiguous K range and the float32 partials
are summed afterwards left to right, then scaled by the whole-K scales (per-tensor / row /
channel; block scales apply per K-block inside). k_parts > 1 computes the same part sums inside
one program. So the order is a function of the config alone, and a config that does not depend
on M gives batch-invariant rows.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .common import MatmulConfig, cdiv
from .fp8_block_det import det_launch as det_w8a8_launch, fp8_block_det_mgpu
from .fp8_block_mgpu import fp8_block_matmul_mgpu
from .fp8_block_mgpu import launch_params as _w8a8_launch
from .fp8_a16_decode_mgpu import fp8_a16_decode_mgpu
from .fp8_block_a16_mgpu import fp8_block_a16_matmul_mgpu
from .fp8_block_a16_mgpu import launch_params as _w8a16_launch
from .fp8_dense import fp8_dense_matmul
from .launch import launch_split_k, writes_partials
from .tiles import load2, mask2, row_tile_coords, store_tile, tile_coords
from .fp8_convert import e4m3_to_bf16
from .fp8_dot import fp8_dot

__all__ = ["fp8_matmul", "SCALE_BLOCK", "X_SCALE_KINDS", "W_SCALE_KINDS"]

E4M3 = jnp.float8_e4m3fn
F32 = jnp.float32
SCALE_BLOCK = 128  # K (and N) extent of one weight block / activation group
X_SCALE_KINDS = ("none", "tensor", "row", "group")
W_SCALE_KINDS = ("tensor", "channel", "block")


@dataclasses.dataclass(frozen=True)
class _Static:
    m: int
    n: int
    k: int
    cfg: MatmulConfig
    x_kind: str
    w_kind: str
    dot_dtype: object  # dtype both MMA operands are in
    steps_per_split: int
    out_dtype: object
    interpret: bool = False

    @property
    def per_block(self) -> bool:
        return self.w_kind == "block" or self.x_kind == "group"


def _load_col(ref, r0, nr, col, mask):
    """(nr,) float32 values ref[r0:r0+nr, col]."""
    view = ref.at[pl.ds(r0, nr), jnp.asarray(col, jnp.int32)]
    if mask is None:
        v = view[...]
    else:
        v = pltriton.load(view, mask=mask, other=jnp.zeros((), view.dtype))
    return v.astype(F32)


def _scales(p: _Static, xs_ref, ws_ref, m0, n0, rm, rn, kb):
    """(row scale over M or None, col scale over N or None) for K-block kb (None = whole K)."""
    cfg = p.cfg
    m_lim = p.m if p.m % cfg.block_m else None
    n_lim = p.n if p.n % cfg.block_n else None
    rs = cs = None
    want_block = kb is not None
    if p.x_kind == "tensor" and not want_block:
        rs = xs_ref[0, 0].astype(F32)
    elif p.x_kind == "row" and not want_block:
        rs = _load_col(xs_ref, m0, cfg.block_m, 0, None if m_lim is None else rm < m_lim)
    elif p.x_kind == "group" and want_block:
        rs = _load_col(xs_ref, m0, cfg.block_m, kb, None if m_lim is None else rm < m_lim)
    if p.w_kind == "tensor" and not want_block:
        cs = ws_ref[0, 0].astype(F32)
    elif p.w_kind == "channel" and not want_block:
        cs = _load_col(ws_ref, n0, cfg.block_n, 0, None if n_lim is None else rn < n_lim)
    elif p.w_kind == "block" and want_block:
        # block_n divides 128 and tiles start at multiples of block_n: one block row per tile.
        cs = ws_ref[lax.div(n0, SCALE_BLOCK), kb].astype(F32)
    return rs, cs


def _apply(acc, rs, cs, swap: bool):
    """acc * rs[m] * cs[n]; acc is (bm, bn), or (bn, bm) for the swapped variant."""
    def vec(v, m_axis: bool):
        if v is None or v.ndim == 0:
            return v
        along_rows = m_axis != swap  # which acc axis carries this operand's index
        return v[:, None] if along_rows else v[None, :]
    for v in (vec(rs, True), vec(cs, False)):
        if v is not None:
            acc = acc * v
    return acc


def _sub_steps(p: _Static) -> tuple[int, int]:
    """(sub-steps per K-step, their width): block_k > 128 with block scales runs 128-wide."""
    if p.per_block and p.cfg.block_k > SCALE_BLOCK:
        return p.cfg.block_k // SCALE_BLOCK, SCALE_BLOCK
    return 1, p.cfg.block_k


def _mma_body(*refs, p: _Static):
    it = iter(refs)
    x_ref = next(it)
    xs_ref = next(it) if p.x_kind != "none" else None
    w_ref, ws_ref = next(it), next(it)
    o_ref = next(it)
    cfg = p.cfg
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    swap = cfg.variant == "swap"
    t = tile_coords(p.m, p.n, bm, bn, cfg.group_m, cfg.split_k, p.steps_per_split)
    m0, n0, rm, rn, m_lim, n_lim, step0 = t
    k_lim = p.k if p.k % (bk * cfg.k_unroll) else None  # some K-step runs past K
    precision = lax.Precision.HIGHEST if p.dot_dtype == F32 else None
    dims = (((1,), (1,)), ((), ()))

    sub, sbk = _sub_steps(p)
    mma_dtype = jnp.bfloat16 if (p.dot_dtype == E4M3 and not cfg.fp8_mma) else p.dot_dtype

    def step(i, acc):
        # All loads of this iteration first (k_unroll K-steps, each in `sub` 128-wide parts
        # when block scales cut it): more bytes in flight before the first MMA waits.
        tiles = []
        for j in range(cfg.k_unroll * sub):
            k0 = (step0 + i) * (bk * cfg.k_unroll) + j * sbk
            rk = k0 + jnp.arange(sbk, dtype=jnp.int32)
            x = load2(x_ref, m0, bm, k0, sbk, mask2(rm, m_lim, rk, k_lim))
            w = load2(w_ref, n0, bn, k0, sbk, mask2(rn, n_lim, rk, k_lim))
            tiles.append((k0, x, w))
        for k0, x, w in tiles:
            if cfg.fast_convert and mma_dtype == jnp.bfloat16:
                w = e4m3_to_bf16(w, interpret=p.interpret)
                if x.dtype == E4M3:
                    x = e4m3_to_bf16(x, interpret=p.interpret)
            x, w = x.astype(mma_dtype), w.astype(mma_dtype)
            a, b = (w, x) if swap else (x, w)
            if mma_dtype == E4M3:
                part = fp8_dot(a, b, promote_k=cfg.promote_k)
            else:
                part = lax.dot_general(a, b, dims, precision=precision,
                                       preferred_element_type=F32)
            if p.per_block:
                kb = lax.div(k0, SCALE_BLOCK)
                rs, cs = _scales(p, xs_ref, ws_ref, m0, n0, rm, rn, kb)
                part = _apply(part, rs, cs, swap)
            acc = acc + part
        return acc

    acc_shape = (bn, bm) if swap else (bm, bn)
    zero = jnp.zeros(acc_shape, F32)
    if cfg.k_parts == 1:
        acc = lax.fori_loop(0, p.steps_per_split, step, zero)
    else:
        # One loop (one software pipeline); at the end of each part its sum joins the total
        # and the accumulator restarts from zero: exactly the partials split_k=k_parts programs
        # would store and the launch would add. (No scale between: a multiply feeding the add
        # would be contracted into an FMA, which the launch's separate add is not.) A branch,
        # not a select: selects on the two accumulators every K-step cost ~20% at M=4096
        # (session 4, H200).
        per_part = p.steps_per_split // cfg.k_parts

        def part_step(i, carry):
            acc, total = carry
            acc = step(i, acc)
            end = lax.rem(i + 1, jnp.int32(per_part)) == 0
            return lax.cond(end, lambda a, t: (zero, t + a), lambda a, t: (a, t), acc, total)

        _, acc = lax.fori_loop(0, p.steps_per_split, part_step, (zero, zero))
    if not writes_partials(cfg.split_k):  # else the launch scales the summed partials
        rs, cs = _scales(p, xs_ref, ws_ref, m0, n0, rm, rn, None)
        acc = _apply(acc, rs, cs, swap)
    if swap:
        acc = acc.T
    store_tile(o_ref, t, acc, p.m, cfg.split_k)


def _gemv_body(*refs, p: _Static):
    """No MMA, for M <= 4 rows: each row keeps a (block_n, block_k) float32 accumulator that
    every K-step adds its elementwise products to; the K reduction across the tile runs once,
    at the end. (v1 reduced each step's products across K at once: a cross-lane reduction per
    row and step, which measured 51-148 us at M=1 8192^2 against 39.5 for the MMA tile.)

    Order: per (n, k mod block_k) lane the K-steps add in order; then the lanes reduce in
    Triton's fixed tree; then split-K partials left to right. A function of the config only."""
    it = iter(refs)
    x_ref = next(it)
    next(it) if p.x_kind != "none" else None  # validate_config: weight-only activations
    w_ref, ws_ref = next(it), next(it)
    o_ref = next(it)
    cfg = p.cfg
    bn, bk = cfg.block_n, cfg.block_k
    t = row_tile_coords(p.n, bn, cfg.split_k, p.steps_per_split)
    n0, rn, n_lim, step0 = t.n0, t.rn, t.n_lim, t.step0
    k_lim = p.k if p.k % (bk * cfg.k_unroll) else None  # some K-step runs past K
    sub, sbk = _sub_steps(p)

    def step(i, accs):
        loads = []
        for j in range(cfg.k_unroll * sub):  # weight loads first, as in _mma_body
            k0 = (step0 + i) * (bk * cfg.k_unroll) + j * sbk
            rk = k0 + jnp.arange(sbk, dtype=jnp.int32)
            loads.append((k0, rk, load2(w_ref, n0, bn, k0, sbk, mask2(rn, n_lim, rk, k_lim))))
        for k0, rk, w in loads:
            if cfg.fast_convert:
                w = e4m3_to_bf16(w, interpret=p.interpret)
            w = w.astype(F32)
            cs = None
            if p.per_block:  # block_n divides 128: one scale for the whole tile
                _, cs = _scales(p, None, ws_ref, 0, n0, None, rn, lax.div(k0, SCALE_BLOCK))
            kmask = None if k_lim is None else (rk < k_lim)[None, :]
            new = []
            for r in range(p.m):
                xr = load2(x_ref, r, 1, k0, sbk, kmask).astype(F32)
                if cs is not None:
                    xr = xr * cs  # (1, bk) products instead of (bn, bk)
                new.append(accs[r] + w * xr)
            accs = tuple(new)
        return accs

    zero = jnp.zeros((bn, sbk), F32)
    accs = lax.fori_loop(0, p.steps_per_split, step, tuple(zero for _ in range(p.m)))
    _, cs = _scales(p, None, ws_ref, 0, n0, None, rn, None)
    if writes_partials(cfg.split_k):  # the launch scales the summed partials
        cs = None
    for r in range(p.m):
        acc = jnp.sum(accs[r], axis=1)
        acc = acc if cs is None else acc * cs
        store_tile(o_ref, t._replace(m0=r), acc[None, :], p.m, cfg.split_k)


def _scale_sum(y: jax.Array, x_scale, w_scale, x_kind: str, w_kind: str) -> jax.Array:
    """The whole-K scales of `_apply` (x per-tensor / per-row, w per-tensor / per-channel) on
    the summed float32 split partials, in the same order (x's, then w's)."""
    if x_kind == "tensor":
        y = y * x_scale[0, 0]
    elif x_kind == "row":
        y = y * x_scale
    if w_kind == "tensor":
        y = y * w_scale[0, 0]
    elif w_kind == "channel":
        y = y * w_scale[:, 0][None, :]
    return y


def _check(name, arr, shape, dtypes):
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(arr.shape)}, expected {tuple(shape)}")
    if dtypes is not None and arr.dtype not in [jnp.dtype(d) for d in dtypes]:
        raise ValueError(f"{name} has dtype {arr.dtype}, expected one of {list(dtypes)}")


def validate_config(cfg: MatmulConfig, *, k: int, per_block: bool, m: int,
                    x_fp8: bool = False) -> int:
    """Checks a config against the problem; returns K-steps per split."""
    if per_block and (SCALE_BLOCK % cfg.block_k and cfg.block_k % SCALE_BLOCK):
        raise ValueError(f"block-scaled operands need block_k dividing or a multiple of "
                         f"{SCALE_BLOCK}, got block_k={cfg.block_k}")
    if per_block and SCALE_BLOCK % cfg.block_n:
        raise ValueError(f"128x128 weight blocks need block_n dividing {SCALE_BLOCK}, "
                         f"got block_n={cfg.block_n}")
    if cfg.variant == "gemv" and m > 4:
        raise ValueError(f"the gemv variant serves M <= 4 rows, got M={m}")
    if cfg.variant == "gemv" and x_fp8:
        raise ValueError("the gemv variant serves floating-point (weight-only) activations")
    if per_block and k % (cfg.block_k * cfg.k_unroll):
        raise ValueError(f"block-scaled operands need K={k} to be a multiple of block_k * "
                         f"k_unroll = {cfg.block_k * cfg.k_unroll}")
    steps = cdiv(k, cfg.block_k * cfg.k_unroll)
    if steps % (cfg.split_k * cfg.k_parts):
        raise ValueError(f"split_k={cfg.split_k} x k_parts={cfg.k_parts} must divide the {steps} "
                         f"K-steps (K={k}, block_k={cfg.block_k}, k_unroll={cfg.k_unroll})")
    return steps // cfg.split_k


def mgpu_launch_params(weight_only: bool, m: int, n: int, k: int, interpret: bool,
                       deterministic: bool = False, out_dtype=jnp.bfloat16) -> dict:
    """The launch settings of the 'mgpu' path's kernel for this problem (fp8_block_a16_mgpu for
    weight-only, else fp8_block_mgpu; deterministic W8A8: fp8_block_det's DetLaunch): what
    fp8_matmul runs and describe_config reports."""
    if not weight_only:
        if deterministic:
            return det_w8a8_launch(m, n, k, out_dtype=out_dtype, interpret=interpret)._asdict()
        return _w8a8_launch(k)
    return _w8a16_launch(m, n, k, interpret, deterministic)


def fp8_matmul(x: jax.Array, x_scale: jax.Array | None, w: jax.Array, w_scale: jax.Array, *,
               x_scale_kind: str, w_scale_kind: str, config: MatmulConfig | None,
               out_dtype=None, interpret: bool = False, name: str = "fp8_matmul",
               poison_output: bool = False, path: str = "pallas",
               deterministic: bool = False) -> jax.Array:
    """y (M, N) = x (M, K) @ w (N, K)^T with the operands' scales; see the module docstring.

    x: float (bf16/f16/f32; weight-only) or e4m3 codes. x_scale: None ("none"), (1,1) "tensor",
    (M,1) "row", (M, K/128) "group". w: e4m3 (N, K). w_scale f32: (1,1) "tensor", (N,1)
    "channel", (N/128, K/128) "block". out_dtype defaults to x's dtype (bf16 for e4m3 x).
    poison_output: test hook -- the kernel writes into a NaN-filled buffer passed in (aliased),
    so any element it fails to write stays NaN.
    path: "pallas" (this kernel), "dense" (fp8_dense: one XLA GEMM of the stored codes, whole-K
    scales only), "mgpu" (Mosaic GPU wgmma: fp8_block_mgpu for block / group scales,
    fp8_block_a16_mgpu for weight-only with 16-bit x and N, K multiples of 128) or "decode"
    (fp8_a16_decode_mgpu: weight-only, M <= 16; with deterministic=True the 'mgpu' kernel's
    deterministic order, the same bits; fp8_paths says where the dispatcher takes it); the
    last three
    are not batch-invariant (fp8_paths) except 'mgpu' with deterministic=True.
    config: the 'pallas' path's tiles (None for the other paths).
    deterministic: the 'mgpu' kernels' M-free schedules (weight-only: fp8_block_a16_mgpu's;
    block W8A8: fp8_block_det's; the 'pallas' path's order is its config's).
    """
    if x_scale_kind not in X_SCALE_KINDS:
        raise ValueError(f"x_scale_kind must be one of {X_SCALE_KINDS}, got {x_scale_kind!r}")
    if w_scale_kind not in W_SCALE_KINDS:
        raise ValueError(f"w_scale_kind must be one of {W_SCALE_KINDS}, got {w_scale_kind!r}")
    if x.ndim != 2 or w.ndim != 2:
        raise ValueError(f"x and w must be 2-D, got x{tuple(x.shape)} w{tuple(w.shape)}")
    m, k = x.shape
    n = w.shape[0]
    _check("w", w, (n, k), [E4M3])
    fp8_x = x.dtype == jnp.dtype(E4M3)
    if fp8_x == (x_scale_kind == "none"):
        raise ValueError("e4m3 activations need an x_scale and float activations take none; "
                         f"got x dtype {x.dtype} with x_scale_kind={x_scale_kind!r}")
    if not fp8_x and x.dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16),
                                     jnp.dtype(F32)):
        raise ValueError(f"x must be bf16, f16, f32 or e4m3, got {x.dtype}")
    per_block = w_scale_kind == "block" or x_scale_kind == "group"
    if per_block and k % SCALE_BLOCK:
        raise ValueError(f"block-scaled operands need K padded to a multiple of {SCALE_BLOCK}, "
                         f"got K={k}")
    xs_shape = {"tensor": (1, 1), "row": (m, 1), "group": (m, cdiv(k, SCALE_BLOCK))}
    if x_scale_kind != "none":
        _check("x_scale", x_scale, xs_shape[x_scale_kind], [F32])
    ws_shape = {"tensor": (1, 1), "channel": (n, 1),
                "block": (cdiv(n, SCALE_BLOCK), cdiv(k, SCALE_BLOCK))}[w_scale_kind]
    _check("w_scale", w_scale, ws_shape, [F32])
    if w_scale_kind == "block" and n % SCALE_BLOCK:
        raise ValueError(f"block-scaled weights need N padded to a multiple of {SCALE_BLOCK}, "
                         f"got N={n}")
    out_dtype = jnp.dtype(out_dtype or (jnp.bfloat16 if fp8_x else x.dtype))
    if path == "dense":
        return fp8_dense_matmul(x, x_scale, w, w_scale, x_scale_kind=x_scale_kind,
                                w_scale_kind=w_scale_kind, out_dtype=out_dtype,
                                interpret=bool(interpret))
    if path == "decode":
        if x_scale_kind != "none":
            raise ValueError("the decode path runs weight-only: it needs x_scale_kind 'none', "
                             f"got {x_scale_kind!r}")
        return fp8_a16_decode_mgpu(x, w, w_scale, scale_kind=w_scale_kind, out_dtype=out_dtype,
                                   deterministic=deterministic, interpret=interpret)
    if path == "mgpu":
        if x_scale_kind == "none":
            return fp8_block_a16_matmul_mgpu(x, w, w_scale, scale_kind=w_scale_kind,
                                             out_dtype=out_dtype, interpret=interpret,
                                             **mgpu_launch_params(True, m, n, k, interpret,
                                                                  deterministic))
        if (x_scale_kind, w_scale_kind) != ("group", "block"):
            raise ValueError("the mgpu path runs block-scaled W8A8 or weight-only: it needs "
                             f"x_scale_kind 'group' with w_scale_kind 'block', or 'none'; got "
                             f"{x_scale_kind!r} and {w_scale_kind!r}")
        if deterministic:  # (its launch by M: det_launch)
            return fp8_block_det_mgpu(x, x_scale, w, w_scale, out_dtype=out_dtype,
                                      interpret=interpret)
        return fp8_block_matmul_mgpu(x, x_scale, w, w_scale, out_dtype=out_dtype,
                                     interpret=interpret,
                                     **mgpu_launch_params(False, m, n, k, interpret))
    if path != "pallas":
        raise ValueError(f"path must be 'pallas', 'dense', 'mgpu' or 'decode', got {path!r}")
    if not isinstance(config, MatmulConfig):
        raise ValueError(f"the 'pallas' path needs a MatmulConfig, got config={config!r}")
    sps = validate_config(config, k=k, per_block=per_block, m=m, x_fp8=fp8_x)
    dot_dtype = E4M3 if fp8_x else x.dtype
    p = _Static(m, n, k, config, x_scale_kind, w_scale_kind, dot_dtype, sps, out_dtype,
                interpret=interpret)

    cfg = config
    if cfg.variant == "gemv":
        body, tiles = _gemv_body, cdiv(n, cfg.block_n)
    else:
        body, tiles = _mma_body, cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
    operands = [x] + ([x_scale] if x_scale_kind != "none" else []) + [w, w_scale]
    return launch_split_k(functools.partial(body, p=p), operands, m=m, n=n, tiles=tiles,
                          split_k=cfg.split_k, num_warps=cfg.num_warps,
                          num_stages=cfg.num_stages, out_dtype=out_dtype,
                          poison=poison_output, interpret=interpret, name=name,
                          finish=lambda y: _scale_sum(y, x_scale, w_scale, x_scale_kind,
                                                      w_scale_kind))
