"""QuantKey and QuantSpec: a quantized format described as data.

A QuantKey says what stored numbers are (element dtype, how scales tile the tensor, the scale
dtype, static or dynamic, and the producer's rule for computing scales). A QuantSpec pairs a
weight key with an activation key (None = activations stay in floating point). Everything else
in jqlin -- numerics, kernels, checkpoint mapping -- is derived from these two frozen values.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers

__all__ = ["Granularity", "ScaleRule", "GlobalScale", "QuantKey", "QuantSpec"]


class Granularity(str, enum.Enum):
    TENSOR = "tensor"  # one scale for the whole operand
    CHANNEL = "channel"  # one scale per output row of the weight, (N, 1)
    TOKEN = "token"  # one scale per activation row (dynamic activations)
    BLOCK = "block"  # 2-D tiles of the weight, `block=(rows, cols)`
    GROUP = "group"  # 1-D groups along K of `group_size` elements, per row


class ScaleRule(str, enum.Enum):
    """Whose arithmetic computes scales from data (FORMATS.md sec. 10).

    Producers agree on the stored layout but not on the float ops that derive a scale; a
    loader must reproduce the producer's rule or logits move.
    """

    CT = "compressed-tensors"
    MODELOPT = "modelopt"
    VLLM = "vllm"  # vLLM CUDA kernels: per-token fp8 scale floored at 1/(448*512)
    # DeepSeek's inference kernels with `scale_fmt: "ue8m0"` (V3.1 on): power-of-two activation
    # scales 2**ceil(log2(max(amax, 1e-4) / 448)) of e4m3 groups; activations only
    DEEPSEEK = "deepseek"


class GlobalScale(str, enum.Enum):
    """How a second-level per-tensor scale (NVFP4) is applied."""

    MULTIPLIER = "multiplier"  # ModelOpt weight_scale_2 / input_scale
    DIVISOR = "divisor"  # compressed-tensors *_global_scale


ELEMENT_DTYPES = ("float8_e4m3fn", "float4_e2m1fn")
SCALE_DTYPES = ("float32", "float8_e4m3fn", "float8_e8m0fnu")
_ELEMENT_MAX = {"float8_e4m3fn": 448.0, "float4_e2m1fn": 6.0}
_SHORT = {"float8_e4m3fn": "e4m3", "float4_e2m1fn": "e2m1", "float32": "f32",
          "float8_e8m0fnu": "e8m0"}


@dataclasses.dataclass(frozen=True)
class QuantKey:
    dtype: str
    granularity: Granularity
    scale_dtype: str = "float32"
    dynamic: bool = False
    block: tuple[int, int] | None = None
    group_size: int | None = None
    rule: ScaleRule = ScaleRule.CT
    global_scale: GlobalScale | None = None
    # an upper bound on the amax a dynamic scale is computed from (fbgemm's
    # `activation_scale_ub`): s = rule(min(amax, float32(amax_bound))), so larger values
    # saturate at +-448
    amax_bound: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "granularity", Granularity(self.granularity))
        object.__setattr__(self, "rule", ScaleRule(self.rule))
        if self.global_scale is not None:
            object.__setattr__(self, "global_scale", GlobalScale(self.global_scale))
        if self.block is not None:
            object.__setattr__(self, "block", tuple(int(b) for b in self.block))
        if self.dtype not in ELEMENT_DTYPES:
            raise ValueError(f"QuantKey.dtype must be one of {ELEMENT_DTYPES}, got {self.dtype!r}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise ValueError(
                f"QuantKey.scale_dtype must be one of {SCALE_DTYPES}, got {self.scale_dtype!r}")
        g = self.granularity
        if (g is Granularity.BLOCK) != (self.block is not None):
            raise ValueError("QuantKey.block is required for, and only for, granularity 'block'")
        if self.block is not None and (len(self.block) != 2 or min(self.block) < 1):
            raise ValueError(f"QuantKey.block must be two positive ints, got {self.block}")
        if (g is Granularity.GROUP) != (self.group_size is not None):
            raise ValueError("QuantKey.group_size is required for, and only for, granularity 'group'")
        if self.group_size is not None and self.group_size < 1:
            raise ValueError(f"QuantKey.group_size must be positive, got {self.group_size}")
        if self.dtype == "float4_e2m1fn" and g is Granularity.GROUP and self.group_size % 2:
            raise ValueError("packed e2m1 groups must have an even group_size")
        if self.scale_dtype != "float32" and g is not Granularity.GROUP:
            raise ValueError(
                f"scale dtype {self.scale_dtype} is only defined for 1-D groups along K")
        if self.global_scale is not None and self.scale_dtype != "float8_e4m3fn":
            raise ValueError("a global scale only exists over e4m3 group scales (NVFP4)")
        if g is Granularity.TOKEN and not self.dynamic:
            raise ValueError("per-token scales only exist for dynamic activations")
        if self.amax_bound is not None:
            bound = self.amax_bound
            if (isinstance(bound, bool) or not isinstance(bound, numbers.Real)
                    or not math.isfinite(bound) or bound <= 0):
                raise ValueError(f"QuantKey.amax_bound must be a finite positive number, got "
                                 f"{bound!r}")
            object.__setattr__(self, "amax_bound", float(bound))
            if not (self.dynamic and self.dtype == "float8_e4m3fn"
                    and self.scale_dtype == "float32"):
                raise ValueError("QuantKey.amax_bound caps the amax of dynamic e4m3 scales "
                                 "computed in float32 (fbgemm's activation_scale_ub); this key "
                                 "has none")
        if self.rule is ScaleRule.DEEPSEEK and not (
                self.dynamic and self.dtype == "float8_e4m3fn" and g is Granularity.GROUP
                and self.scale_dtype == "float8_e8m0fnu"):
            raise ValueError("rule 'deepseek' (ue8m0 activation scales) is defined only for "
                             "dynamic e4m3 groups with e8m0 scales")

    @property
    def max_value(self) -> float:
        return _ELEMENT_MAX[self.dtype]

    @property
    def is_fp4(self) -> bool:
        return self.dtype == "float4_e2m1fn"

    @property
    def k_tile(self) -> int | None:
        """Elements along K that share one scale, or None when a scale spans all of K."""
        if self.granularity is Granularity.BLOCK:
            return self.block[1]
        if self.granularity is Granularity.GROUP:
            return self.group_size
        return None

    @property
    def row_local(self) -> bool:
        """True when an activation's scale depends on its own row only (batch-invariant)."""
        return self.granularity in (Granularity.TOKEN, Granularity.GROUP) or not self.dynamic

    def scale_grid(self, n: int, k: int) -> tuple[int, int]:
        """Shape of the weight scale array for a logical (n, k) weight."""
        g = self.granularity
        if g is Granularity.TENSOR:
            return (1, 1)
        if g is Granularity.CHANNEL:
            return (n, 1)
        if g is Granularity.BLOCK:
            return (math.ceil(n / self.block[0]), math.ceil(k / self.block[1]))
        if g is Granularity.GROUP:
            return (n, math.ceil(k / self.group_size))
        raise ValueError(f"granularity {g.value!r} has no weight scale grid")

    def storage_shape(self, n: int, k: int) -> tuple[int, int]:
        """Padded logical (rows, K) the stored weight occupies: whole blocks / groups."""
        g = self.granularity
        if g is Granularity.BLOCK:
            bn, bk = self.block
            return (math.ceil(n / bn) * bn, math.ceil(k / bk) * bk)
        if g is Granularity.GROUP:
            return (n, math.ceil(k / self.group_size) * self.group_size)
        return (n, k + (k % 2 if self.is_fp4 else 0))

    def describe(self) -> str:
        g = self.granularity
        if g is Granularity.BLOCK:
            gran = f"block{self.block[0]}x{self.block[1]}"
        elif g is Granularity.GROUP:
            gran = f"group{self.group_size}"
        else:
            gran = g.value
        parts = [_SHORT[self.dtype], gran, f"scale={_SHORT[self.scale_dtype]}",
                 "dynamic" if self.dynamic else "static", f"rule={self.rule.value}"]
        if self.global_scale is not None:
            parts.append(f"global={self.global_scale.value}")
        if self.amax_bound is not None:
            parts.append(f"amax<={self.amax_bound:g}")
        return " ".join(parts)


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    weight: QuantKey
    activation: QuantKey | None = None

    def __post_init__(self) -> None:
        w, a = self.weight, self.activation
        if not isinstance(w, QuantKey) or not (a is None or isinstance(a, QuantKey)):
            raise TypeError("QuantSpec takes a weight QuantKey and an activation QuantKey or None")
        if w.dynamic:
            raise ValueError("weight QuantKey must be static (weights are quantized ahead of time)")
        if w.granularity is Granularity.TOKEN:
            raise ValueError("weights have no per-token granularity")
        if a is not None:
            if a.granularity in (Granularity.CHANNEL, Granularity.BLOCK):
                raise ValueError(
                    f"activation granularity {a.granularity.value!r} is not defined; use token/group/tensor")
            if a.granularity is Granularity.GROUP and w.k_tile is not None and (
                    max(a.group_size, w.k_tile) % min(a.group_size, w.k_tile)):
                raise ValueError(
                    f"activation groups of {a.group_size} and weight K-tiles of {w.k_tile} do not nest")

    @property
    def weight_only(self) -> bool:
        return self.activation is None

    @property
    def k_align(self) -> int:
        """K padding every operand of this spec shares (whole weight tiles / activation groups)."""
        tiles = [t for t in (self.weight.k_tile,
                             self.activation.k_tile if self.activation else None) if t]
        align = max(tiles) if tiles else 1
        return align if align > 1 or not self.weight.is_fp4 else 2

    @property
    def static_input_scale(self) -> bool:
        """Whether the weight carries a static activation scale (`input_scale`): static
        per-tensor activations, or the NVFP4 activation global of dynamic groups."""
        act = self.activation
        return act is not None and (not act.dynamic or act.global_scale is not None)

    def storage_shape(self, n: int, k: int) -> tuple[int, int]:
        """(rows, K) a logical (n, k) weight of this spec is stored as: whole weight blocks /
        groups, and K padded to the tiles every operand shares (`jqlin.quantize`, `convert`)."""
        rows, cols = self.weight.storage_shape(n, k)
        return rows, max(cols, -(-k // self.k_align) * self.k_align)

    def without_activation(self) -> "QuantSpec":
        return QuantSpec(self.weight, None)

    def describe(self) -> str:
        act = self.activation.describe() if self.activation else "bf16/f32 (unquantized)"
        return f"W[{self.weight.describe()}] A[{act}]"
