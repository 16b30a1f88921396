"""Strict checks on tensors read from a checkpoint: dtype, shape, and scale values.

Every failure is a CheckpointError naming the file, the tensor, what it holds and what was
expected. Scales must be finite and > 0: a zero scale turns a block into zeros (or 0/0 = NaN for
divisor scales), a NaN or negative one is never written by a producer. They must also be small
(or, for divisors, large) enough that the largest value they can dequantize stays finite in
float32: a finite scale of 1e37 still turns weights into inf and outputs into NaN.
"""

from __future__ import annotations

from typing import Collection

import numpy as np

from ..errors import CheckpointError
from .safetensors_io import TensorInfo

__all__ = ["expect", "shape_str", "check_float_scale", "check_e4m3_scale", "check_e8m0_scale",
           "check_fp8_data", "check_scale_bound", "FLOAT_TAGS", "F32_MAX"]

FLOAT_TAGS = ("F32", "BF16", "F16")  # float scales; bf16/f16 upcast to f32 exactly
F32_MAX = float(np.finfo(np.float32).max)


def shape_str(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def expect(info: TensorInfo, what: str, dtypes: Collection[str],
           shapes: Collection[tuple[int, ...]] | None = None) -> None:
    if info.dtype not in dtypes:
        raise CheckpointError(
            f"{info.where} ({what}): expected dtype {' or '.join(dtypes)}, got {info.dtype}")
    if shapes is not None and tuple(info.shape) not in {tuple(s) for s in shapes}:
        raise CheckpointError(
            f"{info.where} ({what}): expected shape {' or '.join(shape_str(s) for s in shapes)}, "
            f"got {shape_str(info.shape)}")


def _report(info: TensorInfo, what: str, bad: np.ndarray, kinds: dict[str, int]) -> None:
    if not bad.any():
        return
    first = np.unravel_index(int(np.argmax(bad)), bad.shape) if bad.ndim else ()
    counts = ", ".join(f"{n} {k}" for k, n in kinds.items() if n)
    raise CheckpointError(
        f"{info.where} ({what}): {counts} of {bad.size} value(s) (first at index "
        f"{tuple(int(i) for i in first)}); expected finite scales > 0")


def check_float_scale(arr: np.ndarray, info: TensorInfo, what: str) -> np.ndarray:
    """Returns the scale as float32 (exact for bf16/f16)."""
    f = np.asarray(arr).astype(np.float32)
    nan, inf = np.isnan(f), np.isinf(f)
    zero, neg = f == 0, (f < 0) & ~inf
    _report(info, what, nan | inf | zero | neg,
            {"NaN": nan.sum(), "infinite": inf.sum(), "zero": zero.sum(), "negative": neg.sum()})
    return f


def check_e4m3_scale(arr: np.ndarray, info: TensorInfo, what: str) -> np.ndarray:
    b = np.asarray(arr).view(np.uint8)
    mag = b & 0x7F
    nan, zero = mag == 0x7F, mag == 0
    neg = (b >= 0x80) & ~nan & ~zero
    _report(info, what, nan | zero | neg,
            {"NaN": nan.sum(), "zero": zero.sum(), "negative": neg.sum()})
    return arr


def check_e8m0_scale(arr: np.ndarray, info: TensorInfo, what: str) -> np.ndarray:
    """e8m0 exponent bytes (uint8 view); 0xFF is NaN, every other byte a power of two > 0."""
    u = np.asarray(arr).view(np.uint8)
    nan = u == 0xFF
    _report(info, what, nan, {"NaN (0xFF)": nan.sum()})
    return u


def check_fp8_data(arr: np.ndarray, info: TensorInfo) -> None:
    b = np.asarray(arr).view(np.uint8)
    nan = (b & 0x7F) == 0x7F
    if nan.any():
        first = np.unravel_index(int(np.argmax(nan)), nan.shape)
        raise CheckpointError(
            f"{info.where} (e4m3 weight): {int(nan.sum())} NaN code(s) (first at index "
            f"{tuple(int(i) for i in first)}); quantized weights are finite")


def check_scale_bound(values: np.ndarray, info: TensorInfo, what: str, *, reach: str,
                      at_most: float | None = None, at_least: float | None = None) -> None:
    """Scale values (float64-exact: float32 or decoded e8m0) beyond the bound at which
    `reach` (the largest value they dequantize, e.g. "448 · scale") overflows float32."""
    v = np.asarray(values, np.float64)
    bad = (v > at_most) if at_most is not None else (v < at_least)
    if not bad.any():
        return
    first = np.unravel_index(int(np.argmax(bad)), bad.shape) if bad.ndim else ()
    side = f"above {at_most:.4g}" if at_most is not None else f"below {at_least:.4g}"
    raise CheckpointError(
        f"{info.where} ({what}): {int(bad.sum())} of {bad.size} value(s) {side} (first at index "
        f"{tuple(int(i) for i in first)}: {float(v[first]):.4g}); {reach} must stay within "
        f"float32's max {F32_MAX:.4g}, else the dequantized values are inf / NaN")
