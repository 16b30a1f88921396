"""Linen counterpart of QuantDense (`jqlin.linen.QuantDense`).

Its one parameter `qweight` is a QuantizedWeight pytree (codes, scales as leaves; spec and shape
static), so Linen param trees stay ordinary pytrees for jit, checkpointing and sharding.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ..dispatch import matmul
from ..qweight import QuantizedWeight, quantize
from ..spec import QuantSpec
from .dense import _operand_dtype, _spec

__all__ = ["QuantDense"]


class QuantDense(nn.Module):
    """y = x @ W.T (+ bias) with a quantized W (features, in_features).

    `init` draws a float kernel with `kernel_init` and quantizes it into `spec`; existing Dense
    params convert with `QuantDense.convert_params`, a stored weight with `params_from_quantized`.
    dtype: if given, the product's and output's dtype (x is cast to it, or a 16-bit x under
    float32 stays as it is and the kernel writes float32: the same values); None
    keeps x's dtype (unlike `flax.linen.Dense(dtype=None)`, which promotes x with its
    parameters: give `dtype` to keep a float32 output for bf16 x and float32 parameters).
    """

    features: int
    spec: QuantSpec | str
    use_bias: bool = True
    kernel: str = "auto"
    deterministic: bool = False
    weight_only: bool = False
    dtype: Any = None
    param_dtype: Any = jnp.float32
    input_scale: float | None = None  # static activation scale, for specs that need one
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.asarray(x)
        out = None if self.dtype is None else jnp.dtype(self.dtype)
        if out is not None:  # (a 16-bit x under float32 stays as it is: QuantDense)
            x = x.astype(_operand_dtype(x.dtype, out))
        k = x.shape[-1]
        spec = _spec(self.spec)

        def init(rng):
            w = self.kernel_init(rng, (k, self.features), self.param_dtype)
            return quantize(w.T, spec, input_scale=self.input_scale)

        qw = self.param("qweight", init)
        if not isinstance(qw, QuantizedWeight):
            raise TypeError(f"param 'qweight' must be a QuantizedWeight, got {type(qw).__name__}")
        if qw.shape != (self.features, k) or qw.spec != spec:
            raise ValueError(f"param 'qweight' is {qw!r}; this layer expects spec "
                             f"[{spec.describe()}] and shape ({self.features}, {k})")
        y = matmul(x, qw, kernel=self.kernel, deterministic=self.deterministic,
                   weight_only=self.weight_only, out_dtype=out)
        if self.use_bias:
            b = self.param("bias", self.bias_init, (self.features,), self.param_dtype)
            y = y + b.astype(y.dtype)
        return y

    @staticmethod
    def convert_params(dense_params: dict, spec: QuantSpec | str, *,
                       input_scale: Any = None) -> dict:
        """Params of a `flax.linen.Dense` ({'kernel': (in, out)[, 'bias']}) -> this module's."""
        if "kernel" not in dense_params:
            raise ValueError(f"expected Dense params with a 'kernel', got keys {list(dense_params)}")
        out: dict[str, Any] = {"qweight": quantize(jnp.asarray(dense_params["kernel"]).T, _spec(spec),
                                                   input_scale=input_scale)}
        if "bias" in dense_params:
            out["bias"] = dense_params["bias"]
        return out

    @staticmethod
    def params_from_quantized(qw: QuantizedWeight, bias: jax.Array | None = None) -> dict:
        if not isinstance(qw, QuantizedWeight):
            raise TypeError(f"qw must be a QuantizedWeight, got {type(qw).__name__}")
        return {"qweight": qw} if bias is None else {"qweight": qw, "bias": bias}
