"""Fused projections (q/k/v, gate/up) built from loaded layers through `jqlin.fuse`, losslessly.

`jqlin.fuse` keeps every shard's stored values: per-tensor scales become a per-channel vector,
NVFP4 globals that differ become per-row globals, partial blocks keep their padding through row
segments, and differing static input scales are reduced to the widest with a warning.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..errors import CheckpointError
from ..qweight import QuantizedWeight, fuse

__all__ = ["fuse_layers", "fuse_projections", "DEFAULT_GROUPS"]

DEFAULT_GROUPS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def fuse_layers(layers: Mapping[str, QuantizedWeight], names: Sequence[str]) -> QuantizedWeight:
    """Fuse the named layers along N (output features), in the given order."""
    missing = [n for n in names if n not in layers]
    if missing:
        raise CheckpointError(f"cannot fuse {list(names)}: no quantized layer named {missing[0]!r}")
    try:
        return fuse([layers[n] for n in names])
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"inconsistent fused shards {list(names)}: {e}") from None


def fuse_projections(layers: Mapping[str, QuantizedWeight],
                     groups: Mapping[str, Sequence[str]] = DEFAULT_GROUPS
                     ) -> dict[str, QuantizedWeight]:
    """{parent.qkv_proj: fused, parent.gate_up_proj: fused, ...} for every parent module that
    has the shards of a group. A parent with only some shards quantized is an error: one fused
    weight cannot be half quantized."""
    out: dict[str, QuantizedWeight] = {}
    parents = {name.rpartition(".")[0] for name in layers}
    for parent in sorted(parents):
        for fused, parts in groups.items():
            names = [f"{parent}.{p}" for p in parts]
            have = [n for n in names if n in layers]
            if not have:
                continue
            if len(have) != len(names):
                lacking = [n for n in names if n not in layers]
                raise CheckpointError(
                    f"inconsistent fused shards for '{parent}.{fused}': {have} are quantized but "
                    f"{lacking} are not quantized layers")
            out[f"{parent}.{fused}"] = fuse_layers(layers, names)
    return out
