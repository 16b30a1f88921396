"""fp8 x fp8 dot with an explicit tensor-core promotion interval (Triton `maxNumImpreciseAcc`).

Hopper's fp8 MMAs accumulate with reduced precision inside the tensor core. Triton bounds that
with `maxNumImpreciseAcc`: after that many K elements the MMA partial is added into a full
float32 accumulator on the CUDA cores. Pallas' Triton lowering of `lax.dot_general` leaves the
attribute at its default, 0, which promotes after every MMA instruction (K=32): most precise,
and one float32 add per instruction. `fp8_dot(..., promote_k=128)` promotes every 128 K
elements instead (DeepSeek-V3's interval), `promote_k=None` keeps Pallas' default.

This registers a lowering rule in Pallas' Triton lowering table (jax._src, pinned jax 0.11.2):
the rule runs the stock dot_general lowering and sets the attribute on the tt.dot it emits.
Elsewhere (interpret mode, CPU) the primitive is an ordinary float32 dot_general.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import core as jax_core
from jax._src.interpreters import mlir

__all__ = ["fp8_dot", "PROMOTION_AVAILABLE"]

_DIMS = (((1,), (1,)), ((), ()))  # a (m, k) . b (n, k) -> (m, n): both operands K-major

fp8_dot_p = jax_core.Primitive("pallas_kernels_fp8_dot")


def _reference(a, b, *, promote_k):
    del promote_k
    return lax.dot_general(a, b, _DIMS, preferred_element_type=jnp.float32)


@fp8_dot_p.def_abstract_eval
def _abstract(a, b, *, promote_k):
    del promote_k
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"fp8_dot takes (m, k) and (n, k), got {a.shape} and {b.shape}")
    return jax_core.ShapedArray((a.shape[0], b.shape[0]), jnp.float32)


fp8_dot_p.def_impl(_reference)
mlir.register_lowering(fp8_dot_p, mlir.lower_fun(_reference, multiple_results=False))

try:
    from jax._src.lib.mlir import ir
    from jax._src.pallas.triton import lowering as _triton_lowering

    def _triton_rule(ctx, a, b, *, promote_k):
        rule = _triton_lowering.triton_lowering_rules[lax.dot_general_p]
        out = rule(ctx, a, b, dimension_numbers=_DIMS, precision=None,
                   preferred_element_type=jnp.float32, out_sharding=None)
        op = out.owner
        if op.name != "tt.dot":  # the stock rule changed shape: fail loudly, never silently
            raise NotImplementedError(f"fp8_dot: expected the dot lowering to end in tt.dot, "
                                      f"got {op.name}")
        op.attributes["maxNumImpreciseAcc"] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(32), int(promote_k))
        return out

    _triton_lowering.triton_lowering_rules[fp8_dot_p] = _triton_rule
    PROMOTION_AVAILABLE = True
except (ImportError, AttributeError):  # pragma: no cover - another jax layout
    PROMOTION_AVAILABLE = False


def fp8_dot(a: jax.Array, b: jax.Array, *, promote_k: int | None) -> jax.Array:
    """float32 a (m, k) . b (n, k)^T for e4m3 operands; promote_k None = Pallas' default."""
    if promote_k is None:
        return _reference(a, b, promote_k=None)
    if not PROMOTION_AVAILABLE:
        raise NotImplementedError("fp8_dot: promote_k needs the Pallas Triton lowering table "
                                  "of jax 0.11; use promote_k=None")
    return fp8_dot_p.bind(a, b, promote_k=int(promote_k))
