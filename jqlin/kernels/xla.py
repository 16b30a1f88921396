"""The XLA reference matmul: the oracle for every kernel and the path on CPU/TPU.

Weights are dequantized to float32 exactly as their producer dequantizes them, activations are
fake-quantized in float32 by the spec's rule, and the product is taken in float32 at HIGHEST
precision. deterministic=True computes each row with its own (1, K) x (K, N) product inside a
sequential map (jqlin.rowwise), so a row's bits cannot depend on M or on other rows (XLA's own
dot may pick M-dependent blockings, so it is not batch-invariant).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..dispatch import ANY, ANY_ACTIVATION, Kernel, register_kernel
from ..numerics import fake_quantize_activation
from ..qweight import QuantizedWeight
from ..rowwise import seq_map
from ..spec import QuantSpec


def pad_k(x2d: jax.Array, k_storage: int) -> jax.Array:
    k = x2d.shape[-1]
    return x2d if k == k_storage else jnp.pad(x2d, ((0, 0), (0, k_storage - k)))


def reference_activation(x2d: jax.Array, qw: QuantizedWeight, spec: QuantSpec) -> jax.Array:
    """float32 (M, Ks) activations as the spec's producer feeds them to the product."""
    xf = pad_k(x2d.astype(jnp.float32), qw.storage_shape[1])
    if spec.activation is None:
        return xf
    return fake_quantize_activation(xf, spec.activation, qw.input_scale)


def xla_matmul(x2d: jax.Array, qw: QuantizedWeight, *, spec: QuantSpec, deterministic: bool,
               interpret: bool = False, out_dtype=None) -> jax.Array:
    del interpret
    xq = reference_activation(x2d, qw, spec)
    w = qw.dequantize_storage()  # (Ns, Ks) float32
    dot = lambda a: jnp.dot(a, w.T, precision=jax.lax.Precision.HIGHEST,
                            preferred_element_type=jnp.float32)
    if deterministic:
        y = seq_map(lambda row: dot(row[None, :])[0], xq)
    else:
        y = dot(xq)
    return qw.trim_rows(y).astype(out_dtype or x2d.dtype)


XLA = register_kernel(Kernel(
    name="xla",
    impl=xla_matmul,
    honours=((ANY, ANY_ACTIVATION),),
    platforms=("cpu", "gpu", "tpu"),
    batch_invariant=True,
    priority=0,
    description="reference: producer-exact dequantization, float32 HIGHEST dot",
))
