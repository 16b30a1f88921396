"""A weight closed over by jit is a constant to XLA; passed in, it is data. XLA's simplifier
treats constants differently (a division by one becomes a reciprocal multiply, products of
constants fold on the host in IEEE arithmetic), and session 44 found an NVFP4 finish whose bits
moved with it (common.kept mends that one). The dispatcher's kernels on the GPU must give the
same bits either way, for every format at M = 1, 16 (the decode kernels, their finish by XLA or
in the kernel) and 64 (the mid-M kernels). Not M = 2-8: FP8 weight-only runs one XLA GEMM there,
whose algorithm XLA's autotuner picks per compilation. (XLA:CPU's reference moves a bit or two
between the two on several formats: a constant weight's dot is not compiled as a parameter's.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jqlin

NAMES = jqlin.formats.names()
STATIC_ACT = {"fp8_per_tensor", "nvfp4"}


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_gpu_closed_over_weight_gives_the_passed_weights_bits(rng, name):
    n, k = 1024, 2048
    w = jnp.asarray(rng.standard_normal((n, k)), jnp.float32)
    cal = jnp.asarray(rng.standard_normal((4, k)), jnp.float32) if name in STATIC_ACT else None
    qw = jqlin.quantize(w, name, calibration=cal)
    closed = jax.jit(lambda x: jqlin.matmul(x, qw))
    passed = jax.jit(lambda x, q: jqlin.matmul(x, q))
    for m in (1, 16, 64):
        x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        chosen = jqlin.explain(x, qw).chosen
        np.testing.assert_array_equal(
            np.asarray(closed(x).astype(jnp.float32)),
            np.asarray(passed(x, qw).astype(jnp.float32)), err_msg=f"M={m} ({chosen})")
