"""Tensor-parallel Llama: every QuantDense placed column- or row-parallel over one mesh axis.

Two layouts:
- "megatron": q/k/v and gate/up column-parallel, o_proj and down_proj row-parallel (their
  float32 partial products are summed across devices). Fewer bytes move. Default mode sums
  with an all-reduce, so results differ from one device in the last bits; deterministic mode
  on the Pallas kernels adds the devices' split-K partials in the unsharded order, bitwise one
  device's, where the layer's K schedule divides over the devices (else it warns; see
  docs/parallel.md).
  Fused q/k/v and gate/up weights get their rows interleaved per shard first
  (`FusedLinear.interleave_for`), so each device holds its own heads of q, k and v and the
  split of the fused output stays on the device: two all-reduces per layer, nothing else.
- "column": every quantized layer column-parallel. Each device computes whole output columns
  with the unsharded layer's arithmetic, so logits are bitwise those of one device in
  deterministic mode for every format and kernel.
Everything else (embeddings, norms, an unquantized lm_head) is replicated over the mesh.
"""

from __future__ import annotations

import warnings

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ..nn.fused import FusedLinear
from ..nn.quantize_model import quant_layers
from ..nn.sharding import weight_partition_specs

__all__ = ["shard_model", "STYLES"]

STYLES = ("megatron", "column")
_ROW_PARALLEL = ("o_proj", "down_proj")


def shard_model(model: nnx.Module, mesh: Mesh, axis: str = "tp", *, style: str = "megatron"
                ) -> dict[str, str]:
    """Place `model`'s quantized layers tensor-parallel over `mesh` axis `axis`, in place.

    Returns {layer path: "column" | "row"}. A layer that cannot be split as the style asks (a
    scale block or activation group cut by a shard boundary) raises ValueError naming it;
    choose style="column" or another mesh size then. Per-token activation scales of
    row-parallel layers take their amax across the devices (jqlin.nn.sharding).
    """
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    if axis not in mesh.shape:
        raise ValueError(f"mesh has axes {tuple(mesh.shape)}; no axis {axis!r}")
    n = mesh.shape[axis]
    cfg = getattr(model, "config", None)
    heads = {name: getattr(cfg, name, None) for name in ("num_attention_heads",
                                                         "num_key_value_heads")}
    split = {name: h for name, h in heads.items() if isinstance(h, int) and h % n}
    if style == "megatron" and split:
        warnings.warn(
            f"shard_model(style='megatron'): {', '.join(f'{k}={v}' for k, v in split.items())} "
            f"do not divide over {n} devices, so heads are cut between devices and XLA moves "
            "data inside attention (slower, and results move by more than the row-parallel "
            "sums' last bits); style='column' avoids both", stacklevel=2)
    layers = quant_layers(model)
    layout = {path: "row" if style == "megatron" and path.endswith(_ROW_PARALLEL) else "column"
              for path in layers}
    for path, layer in layers.items():  # every layer checked before any is changed
        try:
            weight_partition_specs(layer.qweight, layout[path], axis, n,
                                   weight_only=layer.weight_only)
        except ValueError as e:
            raise ValueError(f"shard_model(style={style!r}): layer {path}: {e}") from None
    if style == "megatron":  # fused q/k/v and gate/up: each device its own slice of every part
        for _, node in nnx.iter_graph(model):
            if isinstance(node, FusedLinear):
                node.interleave_for(n)
    for path, layer in layers.items():
        layer.shard(mesh, layout[path], axis, gather=style == "column")
    replicated = NamedSharding(mesh, P())

    def place(a):
        if isinstance(a, jax.Array) and not (
                isinstance(a.sharding, NamedSharding) and a.sharding.mesh == mesh):
            return jax.device_put(a, replicated)
        return a

    graphdef, state = nnx.split(model)
    nnx.update(model, jax.tree.map(place, state))
    return layout
