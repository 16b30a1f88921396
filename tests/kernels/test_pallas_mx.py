"""The group-scaled launch functions directly (CPU interpret mode): explicit tile configs, both
e2m1 layouts, split-K, both MXFP8 variants, poisoned outputs, argument errors.

The reference is float64: the stored weight dequantized by jqlin (exact in float32) times the
activation parts summed in float64. The kernels' products are exact, so only float32
accumulation order separates them (relative Frobenius error ~1e-7).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jqlin import formats, qweight
from jqlin.kernels.pallas_fp4 import nvfp4_post_scale
from jqlin.numerics import quantize_activation, unpack_e2m1
from jqlin.spec import GlobalScale, QuantSpec, ScaleRule
from pallas_kernels.common import MatmulConfig
from pallas_kernels.fp4_matmul import mxfp4_matmul, nvfp4_matmul
from pallas_kernels.mx_core import mx_dequant_matmul, split_activation
from pallas_kernels.mx_fp8 import mxfp8_matmul, mxfp8_w8a8_matmul

C = MatmulConfig
M, N, K = 5, 40, 256  # N: partial tiles for every block_n below
CONFIGS = [
    C(16, 32, 64, split_k=2, variant="swap"),
    C(32, 16, 32, variant="mma"),
    C(16, 64, 128, variant="swap"),
]


def _weight(rng, fmt, n=N, k=K):
    w = rng.standard_normal((n, k)) * np.exp(0.5 * rng.standard_normal((n, 1)))
    return qweight.quantize(jnp.asarray(w, jnp.float32), fmt)


def _reference(parts, qw, post=None, col=None):
    x = sum(np.asarray(p.astype(jnp.float32), np.float64) for p in parts)
    if post is None:
        w = np.asarray(qw.dequantize_storage(), np.float64)
    else:  # NVFP4 codes times e4m3 scales, then the given per-row post scale
        codes = np.asarray(unpack_e2m1(qw.data).astype(jnp.float32), np.float64)
        s = np.repeat(np.asarray(qw.scale.astype(jnp.float32), np.float64), 16, axis=1)
        c = np.asarray(col, np.float64)[:, None]
        w = codes * s / c if post == "div" else codes * s * c
    return x @ w.T


def _rel(y, ref):
    y = np.asarray(y, np.float64)
    assert np.isfinite(y).all(), "unwritten (poisoned) or non-finite output element"
    return np.linalg.norm(y - ref) / np.linalg.norm(ref)


def _check_nvfp4(rng, m, cfg, layout):
    qw = _weight(rng, "nvfp4_a16")
    x = jnp.asarray(rng.standard_normal((m, K)), jnp.float32)
    parts = split_activation(x)
    # A per-row post scale (as after a fuse), applied as a divisor.
    col = jnp.asarray(rng.uniform(0.5, 4.0, (N,)), jnp.float32)
    y = jax.jit(lambda p, c: nvfp4_matmul(p, qw.data, qw.scale, c, post="div",
                                          out_dtype=jnp.float32, config=cfg, fp4_layout=layout,
                                          interpret=True, poison=True))(parts, col)
    assert _rel(y, _reference(parts, qw, "div", col)) < 1e-6


def _check_mx_weight_only(rng, m, cfg):
    x = jnp.asarray(rng.standard_normal((m, K)), jnp.bfloat16)
    for fmt, fn in (("mxfp4_a16", mxfp4_matmul), ("mxfp8_a16", mxfp8_matmul)):
        qw = _weight(rng, fmt)
        y = jax.jit(lambda x: fn([x], qw.data, qw.scale, out_dtype=jnp.float32, config=cfg,
                                 interpret=True, poison=True))(x)
        assert _rel(y, _reference([x], qw)) < 1e-6, fmt


# No-MMA gemv configs (M <= 4): N=40 leaves a partial last tile for both block_n.
GEMV = [(1, C(1, 16, 64, variant="gemv")), (3, C(1, 32, 128, split_k=2, variant="gemv"))]


@pytest.mark.parametrize("m,cfg", [(M, c) for c in CONFIGS] + GEMV,
                         ids=lambda v: v if isinstance(v, int) else
                         f"{v.variant}{v.block_m}x{v.block_n}x{v.block_k}s{v.split_k}")
@pytest.mark.parametrize("layout", ["split", "interleave"])
def test_nvfp4_configs_poisoned(rng, m, cfg, layout):
    _check_nvfp4(rng, m, cfg, layout)


@pytest.mark.parametrize("m,cfg", [(M, CONFIGS[0]), (M, CONFIGS[1])] + GEMV,
                         ids=["swap-split2", "mma", "gemv-M1", "gemv-M3-split2"])
def test_mxfp4_and_mxfp8_weight_only_poisoned(rng, m, cfg):
    _check_mx_weight_only(rng, m, cfg)


def test_gemv_variant_refuses_more_than_4_rows(rng):
    qw = _weight(rng, "mxfp8_a16")
    with pytest.raises(ValueError, match="gemv variant serves M <= 4"):
        mxfp8_matmul([jnp.ones((5, K), jnp.bfloat16)], qw.data, qw.scale,
                     out_dtype=jnp.float32, config=GEMV[0][1], interpret=True)


@pytest.mark.parametrize("variant,cfg", [("bf16", C(16, 32, 64, split_k=2, variant="swap")),
                                         ("fp8mma", C(16, 32, 64, split_k=2)),
                                         ("fp8mma", C(32, 16, 128))])
def test_mxfp8_w8a8_variants_poisoned(rng, variant, cfg):
    qw = _weight(rng, "mxfp8")
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    q, s = quantize_activation(x, formats.get("mxfp8").activation)
    y = jax.jit(lambda q, s: mxfp8_w8a8_matmul(q, s, qw.data, qw.scale, out_dtype=jnp.float32,
                                               variant=variant, config=cfg, interpret=True,
                                               poison=True))(q, s)
    xq = np.asarray(q.astype(jnp.float32), np.float64) * np.repeat(np.asarray(s, np.float64), 32, 1)
    ref = xq @ np.asarray(qw.dequantize_storage(), np.float64).T
    assert _rel(y, ref) < 1e-6


def test_nvfp4_post_scale_directions(rng):
    # The global enters as the checkpoint says: CT divides, ModelOpt multiplies.
    base = formats.get("nvfp4_a16").weight
    for rule, gs, post in ((ScaleRule.CT, GlobalScale.DIVISOR, "div"),
                           (ScaleRule.MODELOPT, GlobalScale.MULTIPLIER, "mul")):
        spec = QuantSpec(dataclasses.replace(base, rule=rule, global_scale=gs))
        qw = qweight.quantize(jnp.asarray(rng.standard_normal((N, K)), jnp.float32), spec)
        col, got = nvfp4_post_scale(qw, spec)
        assert got == post and col.shape == (N,)
        x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
        parts = split_activation(x)
        y = nvfp4_matmul(parts, qw.data, qw.scale, col, post=post, out_dtype=jnp.float32,
                         config=CONFIGS[0], interpret=True)
        ref = sum(np.asarray(p.astype(jnp.float32), np.float64) for p in parts) @ \
            np.asarray(qw.dequantize_storage(), np.float64).T
        assert _rel(y, ref) < 1e-6


def test_argument_errors(rng):
    qw = _weight(rng, "nvfp4_a16")
    x = jnp.zeros((M, K), jnp.bfloat16)
    col = jnp.ones((N,), jnp.float32)
    call = lambda **kw: mx_dequant_matmul(**{  # noqa: E731
        "x_parts": [x], "w": qw.data, "w_scale": qw.scale, "col_scale": col, "elem": "e2m1",
        "scale": "e4m3", "group": 16, "post": "div", "config": CONFIGS[0],
        "out_dtype": jnp.float32, "interpret": True, **kw})
    with pytest.raises(ValueError, match="w has shape"):
        call(w=qw.data[:, :-8])
    with pytest.raises(ValueError, match="w_scale has dtype"):
        call(w_scale=qw.scale.astype(jnp.float32))
    with pytest.raises(ValueError, match=r"x_parts\[0\] has dtype"):
        call(x_parts=[x.astype(jnp.float32)])
    with pytest.raises(ValueError, match="col_scale"):
        call(col_scale=None)
    with pytest.raises(ValueError, match="interpret mode"):
        call(decode="asm")
    with pytest.raises(ValueError, match="split_k=3 must divide the 4 K-steps"):
        call(config=C(16, 32, 64, split_k=3, variant="swap"))
    with pytest.raises(ValueError, match="split e2m1 layout needs block_k >= 32"):
        call(config=C(16, 32, 16, variant="swap"), fp4_layout="split")
    with pytest.raises(ValueError, match="x must be bf16, f16 or f32"):
        split_activation(jnp.zeros((2, 2), jnp.int32))


def test_dense_path_matches(rng):
    # The large-M path (exact bf16 dequantization + one XLA dot) computes the same function.
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    parts = split_activation(x)
    for fmt, fn in (("nvfp4_a16", nvfp4_matmul), ("mxfp4_a16", mxfp4_matmul),
                    ("mxfp8_a16", mxfp8_matmul)):
        qw = _weight(rng, fmt)
        kw = {}
        if fmt == "nvfp4_a16":
            col, post = nvfp4_post_scale(qw, qw.spec)
            y = fn(parts, qw.data, qw.scale, col, post=post, out_dtype=jnp.float32, path="dense",
                   interpret=True)
        else:
            y = fn(parts, qw.data, qw.scale, out_dtype=jnp.float32, path="dense",
                   interpret=True, **kw)
        ref = sum(np.asarray(p.astype(jnp.float32), np.float64) for p in parts) @ \
            np.asarray(qw.dequantize_storage(), np.float64).T
        assert _rel(y, ref) < 1e-6, fmt


@pytest.mark.parametrize("elem_bits,group", [(4, 16), (8, 32)], ids=["e2m1", "e4m3"])
@pytest.mark.parametrize("m", [1, 16, 64, 200, 256, 512, 4096])
@pytest.mark.parametrize("parts", [1, 3], ids=["bf16", "f32-as-3-parts"])
def test_default_configs_fit_shared_memory(elem_bits, group, m, parts):
    """Every resolved default config keeps its pipeline stages inside the shared-memory budget
    (f32 activations triple the activation bytes: the 128-row M=65..256 tile then runs 64 rows),
    and never asks for more stages than its heuristic (the gemv has no pipeline: 1)."""
    from pallas_kernels.fp4_matmul import resolve_dequant_config
    from pallas_kernels.mx_heuristics import SMEM_BUDGET, dequant_heuristic, stage_bytes
    for det in (False, True):
        cfg = resolve_dequant_config("test", m=m, n=8192, k=8192, elem_bits=elem_bits,
                                     group=group, deterministic=det, config=None,
                                     extra=str(parts))
        base = dequant_heuristic(None if det else m, 8192, 8192, elem_bits=elem_bits,
                                 group=group)
        used = stage_bytes(cfg, parts=parts, elem_bits=elem_bits, group=group) * cfg.num_stages
        assert used <= SMEM_BUDGET, (cfg, used)
        assert cfg.num_stages <= base.num_stages and cfg.block_k == base.block_k
        assert cfg.split_k == base.split_k  # the K schedule is the heuristic's
        if not det and parts == 1:
            assert cfg.block_m == base.block_m  # bf16: the measured tile, unshrunk
