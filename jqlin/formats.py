"""Named formats: one row per name, mapping it to a QuantSpec.

jqlin's own online-quantization rule is compressed-tensors' (FORMATS.md sec. 10), the open
producer most checkpoints come from; loaded checkpoints carry their producer's rule instead.
"""

from __future__ import annotations

from .errors import UnknownFormatError
from .spec import GlobalScale, Granularity, QuantKey, QuantSpec, ScaleRule

__all__ = ["REGISTRY", "get", "names", "register", "name_of"]

E4M3, E2M1 = "float8_e4m3fn", "float4_e2m1fn"
T, C, TOK, B, G = (Granularity.TENSOR, Granularity.CHANNEL, Granularity.TOKEN,
                   Granularity.BLOCK, Granularity.GROUP)

_W_TENSOR = QuantKey(E4M3, T)
_W_CHANNEL = QuantKey(E4M3, C)
_W_BLOCK = QuantKey(E4M3, B, block=(128, 128))
_A_STATIC = QuantKey(E4M3, T)
_A_TOKEN = QuantKey(E4M3, TOK, dynamic=True)
_A_GROUP128 = QuantKey(E4M3, G, dynamic=True, group_size=128)
_NVFP4 = dict(scale_dtype=E4M3, group_size=16, global_scale=GlobalScale.DIVISOR)
_W_NVFP4 = QuantKey(E2M1, G, **_NVFP4)
_A_NVFP4 = QuantKey(E2M1, G, dynamic=True, **_NVFP4)
_MX = dict(scale_dtype="float8_e8m0fnu", group_size=32)
_W_MXFP8, _A_MXFP8 = QuantKey(E4M3, G, **_MX), QuantKey(E4M3, G, dynamic=True, **_MX)
_W_MXFP4, _A_MXFP4 = QuantKey(E2M1, G, **_MX), QuantKey(E2M1, G, dynamic=True, **_MX)

REGISTRY: dict[str, QuantSpec] = {
    "fp8_per_tensor": QuantSpec(_W_TENSOR, _A_STATIC),
    "fp8_per_tensor_a16": QuantSpec(_W_TENSOR),
    "fp8_per_channel_a16": QuantSpec(_W_CHANNEL),
    "fp8_ptpc": QuantSpec(_W_CHANNEL, _A_TOKEN),
    "fp8_block": QuantSpec(_W_BLOCK, _A_GROUP128),
    "fp8_block_a16": QuantSpec(_W_BLOCK),
    "nvfp4": QuantSpec(_W_NVFP4, _A_NVFP4),
    "nvfp4_a16": QuantSpec(_W_NVFP4),
    "mxfp8": QuantSpec(_W_MXFP8, _A_MXFP8),
    "mxfp8_a16": QuantSpec(_W_MXFP8),
    "mxfp4": QuantSpec(_W_MXFP4, _A_MXFP4),
    "mxfp4_a16": QuantSpec(_W_MXFP4),
}


def names() -> list[str]:
    return sorted(REGISTRY)


def get(name: str) -> QuantSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownFormatError(
            f"unknown format {name!r}; registered formats: {', '.join(names())}") from None


def register(name: str, spec: QuantSpec) -> None:
    if name in REGISTRY and REGISTRY[name] != spec:
        raise ValueError(f"format {name!r} is already registered with another spec")
    REGISTRY[name] = spec


def name_of(spec: QuantSpec) -> str | None:
    """The registered name of `spec`, ignoring the scale rule; None if unnamed."""
    def norm(k: QuantKey | None) -> QuantKey | None:
        return None if k is None else _with_rule(k, ScaleRule.CT)
    target = (norm(spec.weight), norm(spec.activation))
    for name, s in REGISTRY.items():
        if (norm(s.weight), norm(s.activation)) == target:
            return name
    return None


def _with_rule(key: QuantKey, rule: ScaleRule) -> QuantKey:
    import dataclasses
    gs = key.global_scale and GlobalScale.DIVISOR  # the direction of a global is a rule detail
    return dataclasses.replace(key, rule=rule, global_scale=gs)
