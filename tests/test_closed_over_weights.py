"""A weight closed over by jit is a constant to XLA; passed in, it is data. XLA treats constants
differently -- it folds what it can at compile time (a quantized weight's dequantization into a
float32 constant of the program), turns a division by one into a reciprocal multiply, and
compiles a dot with a constant operand otherwise than with a parameter -- so the same matmul
gave other bits, and held 4 bytes a weight, when the weight was closed over (session 45: 1-2
outputs of several formats on XLA:CPU; session 44: an NVFP4 finish on the GPU). The dispatcher
puts the weight's arrays behind a barrier (dispatch._as_data): the program is the passed
weight's, its constants the stored arrays."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jqlin

NAMES = jqlin.formats.names()
STATIC_ACT = {"fp8_per_tensor", "nvfp4"}
_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "f8e4m3fn": 1, "f8e8m0fnu": 1, "u8": 1, "s8": 1,
          "s32": 4, "u32": 4, "pred": 1}


def _weight(rng, name, n, k):
    w = jnp.asarray(rng.standard_normal((n, k)), jnp.float32)
    cal = jnp.asarray(rng.standard_normal((4, k)), jnp.float32) if name in STATIC_ACT else None
    return jqlin.quantize(w, name, calibration=cal)


def _constant_bytes(hlo: str) -> int:
    """Bytes of the compiled program's array constants of 1024 elements or more."""
    total = 0
    for dtype, dims in re.findall(r"= (\w+)\[([\d,]+)\]\{[^}]*\} constant\(", hlo):
        count = int(np.prod([int(d) for d in dims.split(",")]))
        if count >= 1024:
            total += count * _BYTES[dtype]
    return total


@pytest.mark.parametrize("name", NAMES)
def test_closed_over_weight_is_the_passed_weights_program(rng, name):
    """XLA's reference (the CPU's auto): the closed-over weight's outputs are the passed
    weight's bit for bit at M = 1 and 7, and the program holds no more constant bytes than the
    weight stores (no dequantized copy)."""
    n, k = 256, 512
    qw = _weight(rng, name, n, k)
    closed = jax.jit(lambda x: jqlin.matmul(x, qw, kernel="xla"))
    passed = jax.jit(lambda x, q: jqlin.matmul(x, q, kernel="xla"))
    for m in (1, 7):
        x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        np.testing.assert_array_equal(np.asarray(closed(x).astype(jnp.float32)),
                                      np.asarray(passed(x, qw).astype(jnp.float32)),
                                      err_msg=f"M={m}")
    stored = sum(int(a.nbytes) for a in jax.tree.leaves(qw))
    hlo = closed.lower(jnp.zeros((1, k), jnp.bfloat16)).compile().as_text()
    assert _constant_bytes(hlo) <= stored, (_constant_bytes(hlo), stored)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_gpu_closed_over_weight_gives_the_passed_weights_bits(rng, name):
    """The dispatcher's GPU paths at M = 1, 16 (the decode kernels, finished by XLA or in the
    kernel), 8 (FP8 weight-only: one XLA GEMM of the stored codes -- both programs hold the
    same GEMM fusion, so XLA's autotuner should pick one algorithm for both; not yet run) and
    64 (the mid-M kernels)."""
    n, k = 1024, 2048
    qw = _weight(rng, name, n, k)
    closed = jax.jit(lambda x: jqlin.matmul(x, qw))
    passed = jax.jit(lambda x, q: jqlin.matmul(x, q))
    for m in (1, 8, 16, 64):
        x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        chosen = jqlin.explain(x, qw).chosen
        np.testing.assert_array_equal(
            np.asarray(closed(x).astype(jnp.float32)),
            np.asarray(passed(x, qw).astype(jnp.float32)), err_msg=f"M={m} ({chosen})")
