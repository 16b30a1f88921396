"""QuantizedWeight: a quantized (N, K) = (out_features, in_features) weight as a JAX pytree.

Arrays are leaves; the spec, logical shape, row segments and layout are static aux data, so a
QuantizedWeight passes through jit, vmap, shard_map and checkpointing.

Storage may be larger than the logical shape: block formats pad N and K to whole blocks, group
formats pad K to whole groups (zeros, which never change a tile's amax). `segments` maps stored
rows to logical output rows: a fused weight whose parts were padded to whole 128-row blocks
keeps each part's rows as one (start, length) segment, and outputs are gathered back.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import formats
from .numerics import dequantize_weight, quantize_weight
from .numerics.exact import div
from .numerics.tiling import abs_max
from .spec import GlobalScale, Granularity, QuantKey, QuantSpec

__all__ = ["QuantizedWeight", "quantize", "fuse", "calibrate_input_scale"]

Segments = tuple[tuple[int, int], ...]


@jax.tree_util.register_pytree_with_keys_class
@dataclasses.dataclass(frozen=True, eq=False)  # (arrays have no truth value: identity equality)
class QuantizedWeight:
    data: jax.Array  # e4m3 (Ns, Ks) or packed e2m1 uint8 (Ns, Ks/2)
    scale: jax.Array  # scale grid of spec.weight over the stored (Ns, Ks)
    global_scale: jax.Array | None  # NVFP4 second-level scale: () or per stored row (Ns,)
    input_scale: jax.Array | None  # static activation scale (fp8) / activation global (NVFP4)
    spec: QuantSpec
    shape: tuple[int, int]  # logical (N, K)
    segments: Segments = ()  # stored-row ranges forming the logical rows; () = rows [0, N)
    layout: str = "nk"

    # -- pytree -------------------------------------------------------------------------------
    def tree_flatten(self):
        return ((self.data, self.scale, self.global_scale, self.input_scale),
                (self.spec, self.shape, self.segments, self.layout))

    def tree_flatten_with_keys(self):
        # (named paths: Orbax / nnx state and error messages say ".scale", not "[1]")
        children, aux = self.tree_flatten()
        keys = (jax.tree_util.GetAttrKey(n) for n in ("data", "scale", "global_scale",
                                                       "input_scale"))
        return tuple(zip(keys, children)), aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        for name, val in zip(("data", "scale", "global_scale", "input_scale"), children):
            object.__setattr__(obj, name, val)
        for name, val in zip(("spec", "shape", "segments", "layout"), aux):
            object.__setattr__(obj, name, val)
        return obj

    # -- shapes -------------------------------------------------------------------------------
    @property
    def storage_shape(self) -> tuple[int, int]:
        rows, cols = self.data.shape
        return rows, cols * (2 if self.spec.weight.is_fp4 else 1)

    @property
    def row_segments(self) -> Segments:
        return self.segments or ((0, self.shape[0]),)

    @property
    def trivially_trimmed(self) -> bool:
        """Logical rows are the first N stored rows (only a tail is padding)."""
        return len(self.row_segments) == 1 and self.row_segments[0][0] == 0

    def trim_rows(self, y: jax.Array) -> jax.Array:
        """Gather the logical output columns from a (..., Ns) result over stored rows."""
        if self.trivially_trimmed:
            n = self.row_segments[0][1]
            return y if y.shape[-1] == n else y[..., :n]
        return jnp.concatenate([y[..., s:s + n] for s, n in self.row_segments], axis=-1)

    def check(self, name: str = "qw") -> None:
        """Raise ValueError if the arrays do not hold what spec, shape and segments say.

        The numerics trust shapes and dtypes (a scale grid that merely divides the storage
        broadcasts; e8m0 exponents are read as bytes), so a hand-built or restored weight is
        checked once per (spec, shape, arrays' shapes and dtypes) before any kernel runs."""
        if not isinstance(self.spec, QuantSpec):
            raise ValueError(f"{name}: spec must be a QuantSpec, got {type(self.spec).__name__}")
        args = (self.spec, self.shape, self.segments, self.layout,
                *(_shape_dtype(a) for a in (self.data, self.scale, self.global_scale,
                                            self.input_scale)))
        try:
            why = _layout_problem(*args)
        except TypeError:  # unhashable aux data (a list shape): check it uncached
            why = _layout_problem.__wrapped__(*args)
        if why:
            raise ValueError(f"{name}: {why}")

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(a.shape)) * a.dtype.itemsize
                   for a in (self.data, self.scale, self.global_scale, self.input_scale)
                   if a is not None)

    # -- numerics -----------------------------------------------------------------------------
    def dequantize_storage(self) -> jax.Array:
        """float32 (Ns, Ks) over the padded storage."""
        return _dequantize(self.data, self.scale, self.global_scale, self.spec.weight)

    def dequantize(self) -> jax.Array:
        """float32 (N, K) logical weight: W ~= q * scale, exactly as the producer dequantizes."""
        w = self.dequantize_storage()
        return self.trim_rows(w.T).T[:, : self.shape[1]]

    def with_spec(self, spec: QuantSpec) -> "QuantizedWeight":
        return dataclasses.replace(self, spec=spec)

    def __repr__(self) -> str:
        name = formats.name_of(self.spec) or self.spec.describe()
        arrays = all(hasattr(a, "shape") and hasattr(a, "dtype") for a in (self.data, self.scale))
        if not arrays or len(self.data.shape) != 2:
            # (tree.map(jnp.shape, ...) puts other leaves here; vmap / scan stack weights)
            show = [(a.dtype, tuple(a.shape)) if arrays else a for a in (self.data, self.scale)]
            return f"QuantizedWeight({name}, shape={self.shape}, data={show[0]}, scale={show[1]})"
        return (f"QuantizedWeight({name}, shape={self.shape}, storage={self.storage_shape}, "
                f"data={self.data.dtype}, scale={self.scale.dtype}{list(self.scale.shape)})")


# spec dtype -> the array dtype held in memory: e2m1 codes packed two per byte, e8m0 exponents
# as their raw bytes (what every kernel and the reference read)
STORED_DATA = {"float4_e2m1fn": np.dtype(np.uint8), "float8_e4m3fn": jnp.dtype(jnp.float8_e4m3fn)}
STORED_SCALE = {"float32": np.dtype(np.float32), "float8_e4m3fn": jnp.dtype(jnp.float8_e4m3fn),
                "float8_e8m0fnu": np.dtype(np.uint8)}


def _shape_dtype(a) -> tuple | None:
    if a is None:
        return None
    if not (hasattr(a, "shape") and hasattr(a, "dtype")):
        return ("not an array", type(a).__name__)
    return tuple(a.shape), jnp.dtype(a.dtype)


@functools.lru_cache(maxsize=1024)
def _layout_problem(spec, shape, segments, layout, data, scale, gscale, iscale) -> str | None:
    wk = spec.weight
    if not (isinstance(shape, tuple) and len(shape) == 2
            and all(isinstance(v, (int, np.integer)) and v > 0 for v in shape)):
        return (f"shape must be a tuple of two positive ints (out_features, in_features), "
                f"got {shape!r}")
    if layout != "nk":
        return f"layout must be 'nk' (the stored (N, K) weight), got {layout!r}"
    for role, got in (("data", data), ("scale", scale), ("global_scale", gscale),
                      ("input_scale", iscale)):
        if (got is None and role in ("data", "scale")) or (got and got[0] == "not an array"):
            return f"{role} must be an array, got {got[1] if got else None}"
    (dshape, ddtype), (sshape, sdtype) = data, scale
    want = STORED_DATA[wk.dtype]
    if ddtype != want:
        how = " (e2m1 codes packed two per byte)" if wk.is_fp4 else ""
        return f"data has dtype {ddtype}; a {wk.dtype} weight is stored as {want}{how}"
    if len(dshape) != 2:
        return f"data must be 2-D (stored rows, stored K), got shape {dshape}"
    rows, cols = dshape[0], dshape[1] * (2 if wk.is_fp4 else 1)
    n, k = shape
    want_rows, want_cols = spec.storage_shape(n, k)
    if cols != want_cols:
        return (f"data holds {cols} stored columns; a weight of in_features K={k} in this format "
                f"is stored with {want_cols} (K padded to whole groups / blocks)")
    if segments:
        why = _segments_problem(segments, n, rows)
        if why:
            return why
    elif rows != want_rows:
        return (f"data holds {rows} stored rows; a weight of out_features N={n} in this format is "
                f"stored with {want_rows} (without row segments)")
    grid = wk.scale_grid(rows, cols)
    if sshape != grid:
        return (f"scale has shape {sshape}; {wk.describe()} over the stored {(rows, cols)} "
                f"weight needs the scale grid {grid}")
    want = STORED_SCALE[wk.scale_dtype]
    if sdtype != want:
        how = " (e8m0 exponents as their raw bytes)" if wk.scale_dtype == "float8_e8m0fnu" else ""
        return f"scale has dtype {sdtype}; {wk.scale_dtype} scales are stored as {want}{how}"
    if (wk.global_scale is None) != (gscale is None):
        return ("global_scale must be None for this spec" if gscale is not None else
                "global_scale is missing (the spec's weight has a second-level global scale)")
    if gscale is not None and (gscale[0] not in ((), (rows,)) or gscale[1] != np.float32):
        return (f"global_scale must be float32 of shape () or ({rows},) (one per stored row), "
                f"got {gscale[1]} {gscale[0]}")
    static = spec.static_input_scale
    if static != (iscale is not None):
        return ("input_scale is missing (the spec's activations use a static scale)" if static
                else "input_scale must be None (the spec's activations need no static scale)")
    if iscale is not None and (iscale[0] != () or iscale[1] != np.float32):
        return f"input_scale must be one float32 number (shape ()), got {iscale[1]} {iscale[0]}"
    return None


def _segments_problem(segments, n: int, rows: int) -> str | None:
    end = 0
    for seg in segments:
        if not (isinstance(seg, tuple) and len(seg) == 2
                and all(isinstance(v, (int, np.integer)) for v in seg)):
            return f"segments must be (start, length) pairs of ints, got {segments!r}"
        s, m = seg
        if s < end or m < 1:
            return (f"segments must be ascending, non-overlapping (start, length) pairs with "
                    f"length >= 1, got {segments!r}")
        end = s + m
    if end > rows:
        return f"segments {segments!r} reach row {end}, but data holds {rows} stored rows"
    if sum(m for _, m in segments) != n:
        return f"segments {segments!r} hold {sum(m for _, m in segments)} rows, not N={n}"
    return None


def _as_spec(spec_or_name: QuantSpec | str) -> QuantSpec:
    if isinstance(spec_or_name, QuantSpec):
        return spec_or_name
    if isinstance(spec_or_name, str):
        return formats.get(spec_or_name)
    raise TypeError(f"spec must be a QuantSpec or a format name, got {type(spec_or_name).__name__}")


def calibrate_input_scale(act_key: QuantKey, x: jax.Array) -> jax.Array:
    """Static activation scale from calibration activations, in the key's rule and direction.

    fp8 static per-tensor: amax/448 (a multiplier, every producer). NVFP4 global: CT stores the
    divisor 448*6/amax (`input_global_scale`), ModelOpt the multiplier amax/(6*448). Empty x,
    or (values known, not traced) x holding NaN / inf, raise ValueError.
    """
    x = jnp.asarray(x, jnp.float32)
    if x.size == 0:
        raise ValueError(f"calibration activations are empty (shape {x.shape}); a static "
                         "activation scale needs at least one value")
    amax = abs_max(x)
    if not isinstance(amax, jax.core.Tracer) and not np.isfinite(float(amax)):
        raise ValueError(f"calibration activations hold NaN or inf (amax {float(amax)}); a "
                         "static activation scale needs finite calibration data")
    amax = jnp.where(amax == 0, 1.0, amax)  # (traced: a NaN amax stays NaN, as the scale)
    if act_key.global_scale is GlobalScale.DIVISOR:
        return div(448.0 * 6.0, amax)
    if act_key.global_scale is GlobalScale.MULTIPLIER:
        return div(amax, 448.0 * 6.0)
    return div(amax, 448.0)


def quantize(w: jax.Array, spec: QuantSpec | str, *, input_scale=None,
             calibration: jax.Array | None = None) -> QuantizedWeight:
    """Quantize a float (N, K) = (out_features, in_features) weight into `spec`.

    Specs whose activations use a static scale (fp8_per_tensor; the NVFP4 activation global)
    need `input_scale` (in the key's own convention) or `calibration` activations to derive it.
    """
    spec = _as_spec(spec)
    w = jnp.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"weight must be 2-D (out_features, in_features), got shape {w.shape}")
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise ValueError(f"weight must be floating point, got {w.dtype}")
    if 0 in w.shape:
        raise ValueError(f"weight must have at least one row and one column "
                         f"(out_features, in_features), got shape {w.shape}")
    n, k = w.shape
    rows, cols = spec.storage_shape(n, k)
    data, scale, gscale, bad, amax = _quantize_padded(w, spec.weight, rows, cols)
    if not isinstance(w, jax.core.Tracer):  # (traced: no values to check)
        if int(bad):  # (on the device: two numbers come back)
            first = np.unravel_index(int(jnp.argmin(jnp.isfinite(w))), w.shape)
            raise ValueError(f"weight holds {int(bad)} NaN or inf value(s) (first at index "
                             f"{tuple(int(i) for i in first)}); quantized weights are finite")
        _check_not_flushed(float(amax), QuantizedWeight(data, scale, gscale, None, spec, (n, k)))
    if spec.static_input_scale:
        if input_scale is None and calibration is None:
            raise ValueError(
                f"spec {formats.name_of(spec) or spec.describe()} has a static activation scale: "
                "pass input_scale= or calibration= activations")
        if input_scale is None:
            input_scale = calibrate_input_scale(spec.activation, calibration)
        input_scale = jnp.asarray(input_scale, jnp.float32)
        if input_scale.size != 1:
            raise ValueError(f"input_scale must be one number (the static activation scale), "
                             f"got shape {input_scale.shape}")
        input_scale = input_scale.reshape(())
        if not isinstance(input_scale, jax.core.Tracer) and not (
                np.isfinite(float(input_scale)) and float(input_scale) > 0):
            raise ValueError(f"input_scale must be finite and > 0 (a static activation scale), "
                             f"got {float(input_scale)}")
    elif input_scale is not None:
        raise ValueError("input_scale given, but the spec's activations need no static scale")
    return QuantizedWeight(data, scale, gscale, input_scale, spec, (n, k))


# (one program per shape and key, as _quantize_padded below; the same bits as eager)
_dequantize = jax.jit(dequantize_weight, static_argnums=3)


@functools.partial(jax.jit, static_argnames=("key", "rows", "cols"))
def _quantize_padded(w: jax.Array, key: QuantKey, rows: int, cols: int):
    """quantize_weight of w padded to (rows, cols), and w's count of non-finite values and its
    largest magnitude (for quantize's checks), as one program per (shape, dtype, key). Eager,
    each of the rules' dozens of ops was its own dispatch and compile: CPU, 12 formats x 4
    small shapes 13.9 s cold against 3.0 s; 4096 x 4096 bf16, three formats, 1.04 s warm
    against 0.18 s (session 41). The same bits (tests: eager and jitted rules agree)."""
    wp = jnp.pad(w, ((0, rows - w.shape[0]), (0, cols - w.shape[1])))
    data, scale, gscale = quantize_weight(wp, key)
    return data, scale, gscale, jnp.sum(~jnp.isfinite(w)), abs_max(w.astype(jnp.float32))


# Below this magnitude a weight may meet float32's limits in its scales (amax / 448 and
# NVFP4's amax / 2688 reach subnormals, which XLA flushes to zero; the compressed-tensors
# global 2688 / amax overflows): look at what the quantized weight holds.
_TINY_AMAX = 2.0 ** -90


def _check_not_flushed(amax: float, qw: QuantizedWeight) -> None:
    """A nonzero weight (largest magnitude amax) must not quantize to all zeros (a different
    layer, silently) nor to NaN (an infinite compressed-tensors global times a flushed block
    amax)."""
    if not 0 < amax < _TINY_AMAX:
        return
    deq = qw.dequantize()
    if not bool(jnp.all(jnp.isfinite(deq)) & jnp.any(deq != 0)):
        raise ValueError(
            f"weight's largest magnitude is {amax:.3g}: too small for "
            f"{formats.name_of(qw.spec) or qw.spec.describe()}'s float32 scales, it would "
            "quantize to zeros or NaN (rescale the weight, or keep this layer unquantized)")


def fuse(parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
    """Concatenate weights along N (fused q/k/v, gate/up) without changing any stored value.

    Per-tensor weight scales become a per-channel vector; differing NVFP4 global scales become
    a per-row global vector; parts of block formats that end in a partial block keep their
    padding and are mapped back through row segments. Static activation scales must be one
    value: the widest range is kept (as vLLM does) with a warning when they differ.
    """
    parts = list(parts)
    if not parts:
        raise ValueError("fuse needs at least one QuantizedWeight")
    first = parts[0]
    for i, p in enumerate(parts):
        if not isinstance(p, QuantizedWeight):
            raise TypeError(f"fuse: part {i} is {type(p).__name__}, not a QuantizedWeight")
        if p.layout != "nk":
            raise ValueError(f"fuse: part {i} has layout {p.layout!r}; fuse canonical (N, K) weights")
        if p.shape[1] != first.shape[1]:
            raise ValueError(f"fuse: part {i} has K={p.shape[1]}, part 0 has K={first.shape[1]}")
        if p.storage_shape[1] != first.storage_shape[1]:
            raise ValueError(f"fuse: part {i} is stored with K padded to {p.storage_shape[1]}, "
                             f"part 0 to {first.storage_shape[1]} (different K tiles)")
        if _spec_modulo_tensor(p.spec) != _spec_modulo_tensor(first.spec):
            raise ValueError(f"fuse: part {i} has spec {p.spec.describe()}, "
                             f"part 0 has {first.spec.describe()}")
    if len(parts) == 1:
        return first
    wk = first.spec.weight
    spec = first.spec
    scales = [p.scale for p in parts]
    if wk.granularity in (Granularity.TENSOR, Granularity.CHANNEL):
        if wk.granularity is Granularity.TENSOR and _all_equal([p.scale for p in parts]):
            scales = [first.scale]
        else:
            scales = [jnp.broadcast_to(p.scale, (p.storage_shape[0], 1)) for p in parts]
            spec = dataclasses.replace(spec, weight=dataclasses.replace(
                wk, granularity=Granularity.CHANNEL))
    data = jnp.concatenate([p.data for p in parts], axis=0)
    scale = scales[0] if len(scales) == 1 else jnp.concatenate(scales, axis=0)

    gscale = None
    if first.global_scale is not None:
        gs = [jnp.asarray(p.global_scale, jnp.float32) for p in parts]
        if all(g.ndim == 0 for g in gs) and _all_equal(gs):
            gscale = gs[0]
        else:
            gscale = jnp.concatenate([jnp.broadcast_to(g, (p.storage_shape[0],))
                                      for g, p in zip(gs, parts)])

    iscale = None
    if first.input_scale is not None:
        vals = [jnp.asarray(p.input_scale, jnp.float32) for p in parts]
        same = _all_equal(vals)
        if same is None:  # traced: the same warning, when the values are known
            jax.debug.callback(_warn_if_input_scales_differ, jnp.stack(vals))
        elif not same:
            _warn_if_input_scales_differ(np.stack([np.asarray(v) for v in vals]))
        reduce = jnp.min if spec.activation.global_scale is GlobalScale.DIVISOR else jnp.max
        iscale = reduce(jnp.stack(vals))  # the widest activation range in either convention

    segments: list[tuple[int, int]] = []
    offset = 0
    for p in parts:
        segments.extend((offset + s, n) for s, n in p.row_segments)
        offset += p.storage_shape[0]
    n_total = sum(p.shape[0] for p in parts)
    segs = tuple(segments)
    if len(segs) > 1 and all(segs[i][0] + segs[i][1] == segs[i + 1][0] for i in range(len(segs) - 1)):
        segs = ((segs[0][0], n_total),)
    if segs == ((0, n_total),):
        segs = ()
    return QuantizedWeight(data, scale, gscale, iscale, spec, (n_total, first.shape[1]), segs)


def _all_equal(arrays: Sequence[jax.Array]) -> bool | None:
    """Whether the arrays hold equal values; None under a trace (values unknown): the
    callers then keep every part's own value, which is lossless."""
    if any(isinstance(a, jax.core.Tracer) for a in arrays):
        return None
    return all(bool(jnp.array_equal(a, arrays[0])) for a in arrays)


def _warn_if_input_scales_differ(vals) -> None:
    vals = np.asarray(vals)
    if not (vals == vals[0]).all():
        warnings.warn(
            "fuse: static input scales of the fused parts differ "
            f"({[float(v) for v in vals]}); one value is needed, taking the widest range "
            "(the largest multiplier or the smallest divisor)",
            stacklevel=3)


def _spec_modulo_tensor(spec: QuantSpec) -> QuantSpec:
    """Spec with per-tensor weight scales seen as per-channel (they fuse into one)."""
    if spec.weight.granularity is Granularity.TENSOR:
        return dataclasses.replace(spec, weight=dataclasses.replace(
            spec.weight, granularity=Granularity.CHANNEL))
    return spec

