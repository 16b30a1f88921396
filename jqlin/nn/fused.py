"""FusedLinear: several linear layers that read the same input (q/k/v, gate/up).

Holds the parts by name until they can run as one product: `fuse()` merges parts that are all
QuantDense of one spec into a single QuantDense through `jqlin.fuse` (no stored value changes).
Float parts stay separate, so `quantize_model` can still quantize each part on its own, the way
checkpoint producers do, and fuse afterwards.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from .dense import QuantDense

__all__ = ["FusedLinear"]


class FusedLinear(nnx.Module):
    """Calling it returns one output per part, in the order the parts were given."""

    def __init__(self, parts: Mapping[str, nnx.Module]):
        if not parts:
            raise ValueError("FusedLinear needs at least one part")
        self.names = tuple(parts)
        self.sizes = tuple(_out_features(name, layer) for name, layer in parts.items())
        self.parts = nnx.Dict(dict(parts))
        self.fused = nnx.data(None)  # a QuantDense once fused
        self.shards = 1  # > 1: fused rows interleaved per shard (interleave_for)

    def fuse(self) -> bool:
        """Merge the parts into one QuantDense when they are all QuantDense with one spec and
        the same options; returns whether the layer is (now) fused."""
        if self.fused is not None:
            return True
        layers = [self.parts[name] for name in self.names]
        if len(layers) < 2 or not all(isinstance(l, QuantDense) for l in layers):
            return False
        if len({(l.spec, tuple(sorted(l.options.items(), key=str))) for l in layers}) != 1:
            return False
        if any(l.parallel is not None for l in layers):
            return False
        self.fused = QuantDense.fuse(layers)
        self.parts = None
        return True

    def interleave_for(self, shards: int) -> bool:
        """Reorder the fused weight's rows for a `shards`-way column-parallel split, so that each
        device holds its slice of every part and the split into parts stays on the device
        (otherwise the split moves data between devices: collective-permutes). Call before
        sharding. Returns False, changing nothing, where the parts do not split evenly into
        whole scale blocks; outputs are the same either way."""
        from .sharding import interleave_parts, interleaved_rows
        if self.fused is None or shards <= 1 or self.shards != 1:
            return self.shards == shards
        if self.fused.parallel is not None:
            raise ValueError("FusedLinear.interleave_for: call it before sharding the layer")
        try:
            qw = interleave_parts(self.fused.qweight, self.sizes, shards)
        except ValueError:
            return False
        self.fused.set_qweight(qw)
        if self.fused.bias is not None:  # added to the output in stored-row order: move it too
            bias = self.fused.bias.get_value()
            self.fused.bias.set_value(bias[interleaved_rows(self.sizes, shards)])
        self.shards = shards
        return True

    def __call__(self, x: jax.Array, apply: Callable[[nnx.Module, jax.Array], jax.Array] | None = None
                 ) -> tuple[jax.Array, ...]:
        """`apply(layer, x)` runs one layer (default: `layer(x)`); lets a model pass options."""
        apply = apply or (lambda layer, v: layer(v))
        if self.fused is not None:
            y = apply(self.fused, x)
            # rows are [part0_0 part1_0 .. | part0_1 part1_1 .. | ..] over `shards` blocks
            # (one block when not interleaved): split within each block
            s = self.shards
            local = [n // s for n in self.sizes]
            bounds = [sum(local[:i + 1]) for i in range(len(local) - 1)]
            y3 = y.reshape(*y.shape[:-1], s, sum(local))
            return tuple(p.reshape(*y.shape[:-1], s * n)
                         for p, n in zip(jnp.split(y3, bounds, axis=-1), local))
        return tuple(apply(self.parts[name], x) for name in self.names)


def _out_features(name: str, layer: Any) -> int:
    n = getattr(layer, "out_features", None)
    if not isinstance(n, int):
        raise TypeError(f"FusedLinear part {name!r} ({type(layer).__name__}) has no out_features")
    return n
