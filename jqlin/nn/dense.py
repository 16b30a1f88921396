"""QuantDense: a Flax NNX linear layer whose weight is a jqlin QuantizedWeight.

The stored arrays (codes, scales, global and input scales) are ordinary NNX state of their own
Variable type, so a model splits/merges, jits, checkpoints (Orbax) and shards like any other;
the spec, logical shape and row segments are static attributes. The product is `x @ W.T`
through `jqlin.matmul`: the dispatcher, not this layer, chooses the kernel.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from .. import formats
from ..dispatch import Explanation, explain, matmul
from ..qweight import QuantizedWeight, fuse, quantize
from ..spec import QuantSpec

__all__ = ["QuantDense", "QuantizedParam"]

_ARRAYS = ("data", "scale", "global_scale", "input_scale")


class QuantizedParam(nnx.Variable):
    """Stored quantized numbers or their scales: state, but not a trainable `nnx.Param`
    (an optimizer over `nnx.Param` must not try to differentiate e4m3 codes)."""


def _operand_dtype(x_dtype: Any, compute: jnp.dtype) -> jnp.dtype:
    """The dtype x enters the kernel in for a product computed in `compute`: x's own where that
    only widens a 16-bit x to float32 (the same values), else `compute`."""
    wide = compute == jnp.float32 and jnp.dtype(x_dtype) in (jnp.dtype(jnp.bfloat16),
                                                             jnp.dtype(jnp.float16))
    return jnp.dtype(x_dtype) if wide else compute


def _spec(spec: QuantSpec | str) -> QuantSpec:
    if isinstance(spec, QuantSpec):
        return spec
    if isinstance(spec, str):
        return formats.get(spec)
    raise TypeError(f"spec must be a QuantSpec or a format name, got {type(spec).__name__}")


def _size(arg: str, value: Any) -> int:
    """A layer size as a Python int (numpy ints from a config are fine; a float, a bool or a
    non-positive size is a mistake that would otherwise fail deep inside the initializer)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"QuantDense: {arg} must be a positive int, got {value!r}")
    return int(value)


class QuantDense(nnx.Module):
    """y = x @ W.T (+ bias) with a quantized W of logical shape (out_features, in_features).

    Built three ways: `QuantDense(in_features, out_features, spec, rngs=...)` initializes a float
    kernel like `nnx.Linear` and quantizes it; `from_linear(linear, spec)` quantizes an existing
    `nnx.Linear`; `from_quantized(qw)` wraps a QuantizedWeight as stored (e.g. from a checkpoint).

    Options (static attributes; each can be overridden per call):
      kernel: "auto" or a registered kernel name; deterministic: batch-invariant results;
      weight_only: explicit opt-in to run a spec that quantizes activations with floating-point
      activations; dtype: if given, x is cast to it before the product, so the output has this
      dtype; promote: with dtype None, x is first promoted with this dtype (jnp.result_type), as
      `nnx.Linear(dtype=None)` promotes x with its parameters (`from_linear` sets it); with
      both None the output has x's dtype.
    """

    def __init__(self, in_features: int, out_features: int, spec: QuantSpec | str, *,
                 use_bias: bool = True, rngs: nnx.Rngs | None = None,
                 kernel_init: Any = nnx.initializers.lecun_normal(),
                 bias_init: Any = nnx.initializers.zeros_init(), param_dtype: Any = jnp.float32,
                 input_scale: Any = None, calibration: jax.Array | None = None,
                 kernel: str = "auto", deterministic: bool = False, weight_only: bool = False,
                 dtype: Any = None, promote: Any = None, qweight: QuantizedWeight | None = None,
                 bias: jax.Array | None = None):
        spec = _spec(spec)
        in_features = _size("in_features", in_features)
        out_features = _size("out_features", out_features)
        if bias is not None and not use_bias:
            raise ValueError("QuantDense: use_bias=False but a bias was given (pass one or the "
                             "other)")
        if qweight is None:
            if rngs is None:
                raise ValueError("QuantDense: pass rngs= to initialize a weight, or use "
                                 "QuantDense.from_quantized / from_linear")
            w = kernel_init(rngs.params(), (in_features, out_features), param_dtype)
            qweight = quantize(w.T, spec, input_scale=input_scale, calibration=calibration)
            if use_bias and bias is None:
                bias = bias_init(rngs.params(), (out_features,), param_dtype)
        else:
            if not isinstance(qweight, QuantizedWeight):
                raise TypeError(f"qweight must be a QuantizedWeight, got {type(qweight).__name__}")
            if qweight.shape != (out_features, in_features):
                raise ValueError(f"qweight has logical shape {qweight.shape}; expected "
                                 f"(out_features, in_features) = ({out_features}, {in_features})")
            if qweight.spec != spec:
                raise ValueError(f"qweight's spec [{qweight.spec.describe()}] differs from "
                                 f"spec [{spec.describe()}]")
        if bias is not None:
            bias = jnp.asarray(bias)
            if bias.shape != (out_features,):
                raise ValueError(f"bias has shape {bias.shape}; expected ({out_features},)")
        self.in_features = in_features
        self.out_features = out_features
        self.spec = spec
        self.shape = qweight.shape
        self.segments = qweight.segments
        self.layout = qweight.layout
        for name in _ARRAYS:
            value = getattr(qweight, name)
            setattr(self, name, None if value is None else QuantizedParam(value))
        self.bias = None if bias is None else nnx.Param(bias)
        self.kernel = kernel
        self.deterministic = deterministic
        self.weight_only = weight_only
        self.dtype = dtype
        self.promote = promote
        self.parallel = None  # a sharding.TensorParallel once `shard` placed the weight

    # -- constructors --------------------------------------------------------------------------
    @classmethod
    def from_quantized(cls, qweight: QuantizedWeight, bias: jax.Array | None = None,
                       **options: Any) -> "QuantDense":
        """Wrap a QuantizedWeight as stored; options: kernel, deterministic, weight_only, dtype,
        promote."""
        if not isinstance(qweight, QuantizedWeight):
            raise TypeError(f"qweight must be a QuantizedWeight, got {type(qweight).__name__}")
        n, k = qweight.shape
        return cls(k, n, qweight.spec, qweight=qweight, bias=bias, **options)

    @classmethod
    def from_linear(cls, linear: nnx.Linear, spec: QuantSpec | str, *, input_scale: Any = None,
                    calibration: jax.Array | None = None, **options: Any) -> "QuantDense":
        """Quantize an `nnx.Linear` (kernel stored (in, out)) into `spec`; keeps its bias and
        compute dtype. Static-activation specs need input_scale= or calibration=."""
        if not isinstance(linear, nnx.Linear):
            raise TypeError(f"from_linear takes an nnx.Linear, got {type(linear).__name__}")
        w = linear.kernel.get_value()
        qw = quantize(jnp.asarray(w).T, spec, input_scale=input_scale, calibration=calibration)
        bias = None if linear.bias is None else linear.bias.get_value()
        options.setdefault("dtype", linear.dtype)
        if options["dtype"] is None:  # nnx.Linear computes in x's dtype promoted with its params
            params = [jnp.asarray(w).dtype] + ([] if bias is None else [jnp.asarray(bias).dtype])
            options.setdefault("promote", jnp.result_type(*params))
        return cls.from_quantized(qw, bias, **options)

    @classmethod
    def fuse(cls, layers: "list[QuantDense]") -> "QuantDense":
        """One layer computing the concatenated outputs of `layers` (fused q/k/v, gate/up),
        without changing any stored value (`jqlin.fuse`). Options must agree."""
        layers = list(layers)
        if not layers:
            raise ValueError("QuantDense.fuse needs at least one layer")
        first = layers[0]
        for i, layer in enumerate(layers):
            if not isinstance(layer, QuantDense):
                raise TypeError(f"QuantDense.fuse: layer {i} is {type(layer).__name__}")
            if layer.options != first.options:
                raise ValueError(f"QuantDense.fuse: layer {i} has options {layer.options}, "
                                 f"layer 0 has {first.options}")
            if layer.parallel is not None:
                raise ValueError("QuantDense.fuse: fuse layers before sharding them")
        qw = fuse([layer.qweight for layer in layers])
        bias = None
        if any(layer.bias is not None for layer in layers):
            # the widest: every part's bias reaches the output as it would unfused
            dt = jnp.result_type(*(layer.bias.get_value().dtype for layer in layers
                                   if layer.bias is not None))
            bias = jnp.concatenate([
                layer.bias.get_value().astype(dt) if layer.bias is not None
                else jnp.zeros((layer.out_features,), dt) for layer in layers])
        return cls.from_quantized(qw, bias, **first.options)

    # -- state views ---------------------------------------------------------------------------
    @property
    def options(self) -> dict[str, Any]:
        return dict(kernel=self.kernel, deterministic=self.deterministic,
                    weight_only=self.weight_only, dtype=self.dtype, promote=self.promote)

    @property
    def qweight(self) -> QuantizedWeight:
        """The layer's weight as a QuantizedWeight (arrays are the current state values)."""
        vals = [None if getattr(self, n) is None else getattr(self, n).get_value()
                for n in _ARRAYS]
        return QuantizedWeight(*vals, spec=self.spec, shape=self.shape, segments=self.segments,
                               layout=self.layout)

    def set_qweight(self, qw: QuantizedWeight) -> None:
        """Replace the stored arrays (same spec and logical shape)."""
        if qw.spec != self.spec or qw.shape != self.shape:
            raise ValueError(f"set_qweight: got {qw!r}; this layer holds spec "
                             f"[{self.spec.describe()}] shape {self.shape}")
        for name in _ARRAYS:
            value = getattr(qw, name)
            if (value is None) != (getattr(self, name) is None):
                raise ValueError(f"set_qweight: {name} presence differs from the layer's")
            if value is not None:
                getattr(self, name).set_value(value)
        self.segments, self.layout = qw.segments, qw.layout

    # -- compute -------------------------------------------------------------------------------
    def _resolve(self, kernel, deterministic, weight_only) -> dict[str, Any]:
        return dict(kernel=self.kernel if kernel is None else kernel,
                    deterministic=self.deterministic if deterministic is None else deterministic,
                    weight_only=self.weight_only if weight_only is None else weight_only)

    def compute_dtype(self, x_dtype: Any) -> jnp.dtype:
        """The dtype of the product and its output: `dtype`, else x's promoted with `promote`,
        else x's own. x is cast to it, except a 16-bit x under float32: its values are already
        float32 values, so it stays as it is and the kernel writes float32 (`out_dtype`) -- a
        float32 x would run as its three bf16 parts (three times the MMAs)."""
        if self.dtype is not None:
            return jnp.dtype(self.dtype)
        if self.promote is not None:
            return jnp.result_type(x_dtype, self.promote)
        return jnp.dtype(x_dtype)

    def __call__(self, x: jax.Array, *, kernel: str | None = None,
                 deterministic: bool | None = None, weight_only: bool | None = None) -> jax.Array:
        x = jnp.asarray(x)
        out = self.compute_dtype(x.dtype)
        x = x.astype(_operand_dtype(x.dtype, out))
        opts = dict(self._resolve(kernel, deterministic, weight_only), out_dtype=out)
        if self.parallel is None:
            y = matmul(x, self.qweight, **opts)
        else:
            from .sharding import sharded_matmul
            y = sharded_matmul(x, self.qweight, self.parallel, **opts)
        if self.bias is not None:
            y = y + self.bias.get_value().astype(y.dtype)
        return y

    def explain(self, x: Any, *, kernel: str | None = None, deterministic: bool | None = None,
                weight_only: bool | None = None) -> Explanation:
        """Which kernel this layer runs for inputs like `x` (an array, a ShapeDtypeStruct, or a
        shape, taken as float32), after the layer's own cast of x (`compute_dtype`)."""
        shape, dtype = ((tuple(x), jnp.float32) if isinstance(x, (tuple, list))
                        else (tuple(x.shape), x.dtype))
        out = self.compute_dtype(dtype)
        x = jax.ShapeDtypeStruct(shape, _operand_dtype(dtype, out))
        return explain(x, self.qweight, out_dtype=out,
                       **self._resolve(kernel, deterministic, weight_only))

    def shard(self, mesh: jax.sharding.Mesh, mode: str, axis: str, *,
              batch_axis: str | None = None, gather: bool = False) -> "QuantDense":
        """Place the weight tensor-parallel over `mesh` axis `axis`: mode "column" splits the
        output features, "row" the input features (see jqlin.nn.sharding); `gather` returns a
        column-parallel output replicated. Returns self."""
        from .sharding import shard_layer
        shard_layer(self, mesh, mode, axis, batch_axis=batch_axis, gather=gather)
        return self

    def __repr__(self) -> str:  # nnx's default repr prints every array
        name = formats.name_of(self.spec) or self.spec.describe()
        extra = f", parallel={self.parallel.mode}" if self.parallel is not None else ""
        return (f"QuantDense({name}, in={self.in_features}, out={self.out_features}, "
                f"bias={self.bias is not None}, kernel={self.kernel!r}, "
                f"deterministic={self.deterministic}, weight_only={self.weight_only}{extra})")
