"""What every Pallas kernel declaration shares: its dispatcher traits and the check that a
weight is stored the way the Triton bodies read it."""

from __future__ import annotations

import jax.numpy as jnp

from ..qweight import QuantizedWeight

__all__ = ["HOPPER_PALLAS", "check_stored_weight"]

# spec dtype -> the dtype the kernels read: e2m1 codes come packed two per byte, e8m0 exponents
# as raw bytes
_STORED_DATA = {"float4_e2m1fn": jnp.uint8, "float8_e4m3fn": jnp.float8_e4m3fn}
_STORED_SCALE = {"float32": jnp.float32, "float8_e4m3fn": jnp.float8_e4m3fn,
                 "float8_e8m0fnu": jnp.uint8}


def check_stored_weight(m: int, k: int, qw: QuantizedWeight) -> str | None:
    """None, or why the kernels cannot read `qw` (layout or stored dtypes)."""
    del m, k
    if qw.layout != "nk":
        return f"needs the canonical (N, K) layout, the weight has layout {qw.layout!r}"
    wk = qw.spec.weight
    want = jnp.dtype(_STORED_DATA[wk.dtype])
    if qw.data.dtype != want:
        return f"needs {want} weight data for {wk.dtype}, got {qw.data.dtype}"
    want = jnp.dtype(_STORED_SCALE[wk.scale_dtype])
    if qw.scale.dtype != want:
        return f"needs {want} weight scales for {wk.scale_dtype}, got {qw.scale.dtype}"
    return None


# Hopper-only Triton kernels with a batch-invariant configuration, preferred over the XLA
# reference where they honour a spec; on CPU they run in interpret mode (CI's kernel checks).
HOPPER_PALLAS = dict(platforms=("gpu",), batch_invariant=True, priority=10,
                     min_compute_capability=(9, 0), interpret_on=("cpu",),
                     check_shapes=check_stored_weight, k_sliced=True)
