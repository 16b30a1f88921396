"""A benchmark script with DeepSeek-V3.1's block FP8 spec (`scale_fmt: "ue8m0"` checkpoints:
128x128 block weights, activations in e4m3 groups of 128 with power-of-two e8m0 scales by
ScaleRule.DEEPSEEK) registered as the format `fp8_block_ue8m0` for the run, so it can be timed
beside `fp8_block` (float32 activation scales) in one run. jqlin registers no name for it:
checkpoints load it as `fp8/block_ue8m0`.

    PYTHONPATH=. python3 benchmarks/bench_ue8m0.py --formats fp8_block,fp8_block_ue8m0 \\
        --shapes deepseek-v3 --m 1,16,256,4096 --modes default --out $OUT/ue8m0
    PYTHONPATH=. python3 benchmarks/bench_ue8m0.py --script decode_breakdown.py \\
        --ops fp8_block,fp8_block_ue8m0 --shapes 18432x7168 --m 256,4096
(--script: the benchmark to run, default bench_matmul.py; every other argument is that
script's. --exponent bits: the scale exponent read off t's float32 fields instead of frexp,
an A/B of session 40.)
"""

from __future__ import annotations

import dataclasses
import pathlib
import runpy
import sys

import jax.numpy as jnp

from jqlin import formats
from jqlin.checkpoint.hf_fp8 import ue8m0_activation
from jqlin.numerics import activations

NAME = "fp8_block_ue8m0"


def _exponent_bits(amax):
    a = jnp.maximum(amax.astype(jnp.float32), jnp.float32(1e-4))
    t = a * jnp.float32(1.0 / 448.0)
    bits = jnp.asarray(t).view(jnp.uint32)
    u = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).astype(jnp.uint32)
    return jnp.where(jnp.isfinite(t), u, 255).astype(jnp.uint8)


def _scale_variant(variant: str):
    """pallas_fp8's fp8_division_scale with the DEEPSEEK scales computed another way (A/B)."""
    import jax
    from jqlin.kernels import pallas_fp8
    from jqlin.numerics.e8m0 import e8m0_to_f32, exponent_deepseek
    from jqlin.numerics.tiling import tile_amax
    from jqlin.spec import ScaleRule
    lib = pallas_fp8.fp8_division_scale

    def direct(amax):  # float32 from t's fields, no uint8 exponent
        t = jnp.maximum(amax, jnp.float32(1e-4)) * jnp.float32(1.0 / 448.0)
        bits = t.view(jnp.uint32)
        e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).astype(jnp.uint32)
        return jnp.where(jnp.isfinite(t), (e << 23).view(jnp.float32), jnp.nan)

    def scale(xf, key, input_scale=None):
        if key.rule is not ScaleRule.DEEPSEEK:
            return lib(xf, key, input_scale)
        amax = tile_amax(xf, key)
        if variant in ("barrier", "barrier_direct"):
            amax = jax.lax.optimization_barrier(amax)
        if variant.endswith("direct"):
            return direct(amax)
        return e8m0_to_f32(exponent_deepseek(amax))
    pallas_fp8.fp8_division_scale = scale


def _pop(flag: str, default: str) -> str:
    if flag in sys.argv:
        i = sys.argv.index(flag)
        value = sys.argv[i + 1]
        del sys.argv[i:i + 2]
        return value
    return default


if __name__ == "__main__":
    script = _pop("--script", "bench_matmul.py")
    if _pop("--exponent", "frexp") == "bits":
        activations.exponent_deepseek = _exponent_bits
    if (variant := _pop("--scale", "lib")) != "lib":
        _scale_variant(variant)
    formats.register(NAME, dataclasses.replace(formats.get("fp8_block"),
                                               activation=ue8m0_activation(128)))
    runpy.run_path(str(pathlib.Path(__file__).with_name(script)), run_name="__main__")
