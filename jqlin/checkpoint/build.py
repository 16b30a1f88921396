"""The strict loader's core: one LayerPlan + the tensor store -> one QuantizedWeight.

Stored numbers are used as stored: codes are never requantized and scales never recomputed.
Float scales are upcast to float32 (exact from bf16/f16), NVFP4 block scales stay e4m3, MX
scales stay uint8 exponent bytes. Storage is padded to whole blocks/groups and to the spec's
K alignment, exactly as `jqlin.quantize` lays it out: zero codes, and scale 1 over tiles that
lie entirely in the padding (they multiply zeros).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from ..errors import CheckpointError
from ..qweight import QuantizedWeight
from ..spec import GlobalScale, Granularity, QuantKey
from .checks import (F32_MAX, FLOAT_TAGS, check_e4m3_scale, check_e8m0_scale, check_float_scale,
                     check_fp8_data, check_scale_bound, expect, shape_str)
from .native import METADATA_FILE
from .plan import LayerPlan
from .safetensors_io import TensorStore

__all__ = ["build_layer", "required_tensors"]

_SCALAR_SHAPES = ((), (1,))
_E4M3_MAX = 448.0  # the largest e4m3 group scale an NVFP4 global multiplies (or divides)


def required_tensors(lp: LayerPlan) -> list[str]:
    """Tensor names the layer cannot be built without (a cheap check before reading data)."""
    names = [lp.data, lp.scale]
    if lp.spec.weight.global_scale is not None:
        names.append(lp.global_scale)
    if lp.spec.static_input_scale:
        names.append(lp.input_scale)
    return [n for n in names if n is not None]


def _scale_tags(key: QuantKey) -> tuple[str, ...]:
    if key.scale_dtype == "float8_e4m3fn":
        return ("F8_E4M3",)
    if key.scale_dtype == "float8_e8m0fnu":
        return ("U8", "F8_E8M0")
    return FLOAT_TAGS


def _scale_shapes(key: QuantKey, n: int, k: int, four_d: bool) -> list[tuple[int, ...]]:
    g = key.granularity
    grid = key.scale_grid(n, k)
    if g is Granularity.TENSOR:
        return [(), (1,), (1, 1)]
    if g is Granularity.CHANNEL:
        return [(n, 1), (n,)]
    if g is Granularity.BLOCK and four_d:
        return [(grid[0], 1, grid[1], 1), grid]
    return [grid]


def _bound(key: QuantKey, *, global_scale: bool = False) -> dict:
    """check_scale_bound arguments for a float scale of `key`: the largest value it dequantizes
    -- the largest code times the scale, and for an NVFP4 global also times the largest e4m3
    group scale (divided, for a divisor global) -- must be finite in float32."""
    m = key.max_value
    if not global_scale:
        return dict(at_most=F32_MAX / m, reach=f"the largest dequantized value, {m:g} · scale,")
    if key.global_scale is GlobalScale.DIVISOR:
        return dict(at_least=m * _E4M3_MAX / F32_MAX,
                    reach=f"the largest dequantized value, {m:g} · {_E4M3_MAX:g} / scale,")
    return dict(at_most=F32_MAX / (m * _E4M3_MAX),
                reach=f"the largest dequantized value, {m:g} · {_E4M3_MAX:g} · scale,")


def _read_scale(store: TensorStore, name: str, key: QuantKey, shapes, what: str) -> np.ndarray:
    info = store.info(name)
    expect(info, what, _scale_tags(key), shapes)
    arr = store.read(name)
    if key.scale_dtype == "float8_e4m3fn":  # <= 448: bounded through the global scale
        return check_e4m3_scale(arr, info, what)
    if key.scale_dtype == "float8_e8m0fnu":
        u = check_e8m0_scale(arr, info, what)
        check_scale_bound(np.ldexp(1.0, u.astype(np.int32) - 127), info, what, **_bound(key))
        return u
    f = check_float_scale(arr, info, what)
    check_scale_bound(f, info, what, **_bound(key))
    return f


def _read_scalar(store: TensorStore, name: str | None, what: str, module: str,
                 shapes=_SCALAR_SHAPES, bound: dict | None = None) -> np.ndarray:
    if name is None:
        raise CheckpointError(f"layer '{module}': no tensor is planned for its {what}")
    info = store.info(name)
    expect(info, what, FLOAT_TAGS, shapes)
    f = check_float_scale(store.read(name), info, what)
    if bound is not None:
        check_scale_bound(f, info, what, **bound)
    return f


def _read_input_scale(store: TensorStore, lp: LayerPlan, shapes=_SCALAR_SHAPES) -> np.ndarray:
    act = lp.spec.activation
    return _read_scalar(store, lp.input_scale, "static input scale", lp.module, shapes,
                        _bound(act, global_scale=act.global_scale is not None))


def _check_dropped(store: TensorStore, lp: LayerPlan) -> None:
    """Tensors the format allows and jqlin drops (ModelOpt W4A16's input_scale): unused, but a
    NaN / zero / negative one still says the export is broken, as for every other scale."""
    for name in lp.ignorable:
        info = store.info(name)
        what = "scale the format does not use (dropped)"
        expect(info, what, FLOAT_TAGS)
        check_float_scale(store.read(name), info, what)


def _pad(arr: np.ndarray, shape: tuple[int, int], fill) -> np.ndarray:
    if arr.shape == tuple(shape):
        return arr
    out = np.full(shape, fill, dtype=arr.dtype)
    out[: arr.shape[0], : arr.shape[1]] = arr
    return out


def _scale_fill(key: QuantKey):
    if key.scale_dtype == "float8_e8m0fnu":
        return np.uint8(127)  # 2**0
    if key.scale_dtype == "float8_e4m3fn":
        return ml_dtypes.float8_e4m3fn(1.0)
    return np.float32(1.0)


def _read_data(store: TensorStore, name: str, key: QuantKey) -> tuple[np.ndarray, object]:
    info = store.info(name)
    what = "packed e2m1 weight" if key.is_fp4 else "e4m3 weight"
    expect(info, what, ("U8",) if key.is_fp4 else ("F8_E4M3",))
    if len(info.shape) != 2 or min(info.shape) < 1:
        raise CheckpointError(f"{info.where} ({what}): expected a non-empty 2-D (out_features, "
                              f"in_features{'/2' if key.is_fp4 else ''}) tensor, got "
                              f"{shape_str(info.shape)}")
    data = store.read(name)
    if not key.is_fp4:
        check_fp8_data(data, info)
    return data, info


def build_layer(store: TensorStore, lp: LayerPlan) -> QuantizedWeight:
    if lp.native is not None:
        return _build_native(store, lp)
    spec, wk = lp.spec, lp.spec.weight
    data, dinfo = _read_data(store, lp.data, wk)
    n, k = data.shape[0], data.shape[1] * (2 if wk.is_fp4 else 1)

    scale = _read_scale(store, lp.scale, wk, _scale_shapes(wk, n, k, lp.block_scale_4d),
                        "weight scale").reshape(wk.scale_grid(n, k))
    gscale = None
    if wk.global_scale is not None:
        g = _read_scalar(store, lp.global_scale, f"{wk.global_scale.value} global scale",
                         lp.module, bound=_bound(wk, global_scale=True))
        gscale = jnp.asarray(g.reshape(()))
    iscale = None
    if spec.static_input_scale:
        iscale = jnp.asarray(_read_input_scale(store, lp).reshape(()))
    _check_dropped(store, lp)
    for z in lp.zero_points:
        zinfo = store.info(z)
        zp = store.read(z)
        if np.asarray(zp).astype(np.float32).any():
            raise CheckpointError(f"{zinfo.where}: nonzero zero point in a symmetric scheme "
                                  "(asymmetric quantization is not supported)")
    if lp.shape_tensor is not None:
        sinfo = store.info(lp.shape_tensor)
        got = [int(v) for v in np.asarray(store.read(lp.shape_tensor)).reshape(-1)]
        if got != [n, k]:
            raise CheckpointError(f"{sinfo.where}: records weight shape {got}, but "
                                  f"'{lp.data}' holds a {[n, k]} weight")

    rows, cols = spec.storage_shape(n, k)
    data = _pad(data, (rows, cols // 2 if wk.is_fp4 else cols), data.dtype.type(0))
    scale = _pad(scale, wk.scale_grid(rows, cols), _scale_fill(wk))
    return QuantizedWeight(jnp.asarray(data), jnp.asarray(scale), gscale, iscale, spec, (n, k))


def _build_native(store: TensorStore, lp: LayerPlan) -> QuantizedWeight:
    """A jqlin checkpoint stores the in-memory arrays (already padded): check and wrap them."""
    spec, wk, lay = lp.spec, lp.spec.weight, lp.native
    data, dinfo = _read_data(store, lp.data, wk)
    rows, cols = data.shape[0], data.shape[1] * (2 if wk.is_fp4 else 1)
    n, k = lay.shape
    scale = _read_scale(store, lp.scale, wk, [wk.scale_grid(rows, cols)], "weight scale")
    gscale = None
    if wk.global_scale is not None:
        g = _read_scalar(store, lp.global_scale, f"{wk.global_scale.value} global scale",
                         lp.module, shapes=((), (rows,)), bound=_bound(wk, global_scale=True))
        gscale = jnp.asarray(g)
    iscale = None
    if spec.static_input_scale:
        iscale = jnp.asarray(_read_input_scale(store, lp, shapes=((),)))
    qw = QuantizedWeight(jnp.asarray(data), jnp.asarray(scale), gscale, iscale, spec,
                         (n, k), tuple(lay.segments), lay.layout)
    try:  # the recorded shape / segments must be what the arrays hold: a smaller shape would
        # drop stored rows or columns, overlapping segments duplicate rows
        qw.check(f"layer '{lp.module}' (shape {list(lay.shape)}, segments "
                 f"{[list(g) for g in lay.segments]} in {METADATA_FILE})")
    except ValueError as e:
        raise CheckpointError(f"{dinfo.where}: {e}") from None
    return qw

