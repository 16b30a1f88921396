"""Tensor-parallel QuantDense: partition specs for quantized data and scales, and the shard_map
around the kernel.

Column parallel splits the output features N: every device holds whole rows of codes with
their row scales and computes its own output columns from the full activation, so the numerics
are those of the unsharded layer. Row parallel splits the input features K: every device
multiplies its K-slice and the partial products are summed (`psum`, in float32). In
deterministic mode the Pallas kernels instead run each device's part of the unsharded K
schedule and add all devices' split-K partials in the unsharded order
(`pallas_kernels.k_shards`): bitwise the unsharded layer. Where that cannot be (the XLA
kernel, or a K schedule with fewer splits than devices) the psum stays, with a warning.

A shard boundary may never cut a scale tile: block rows (column) or block/group columns (row)
must be whole on each device; an error names the tensor and the sizes. Dynamic activation
scales that span the whole row (per-token, per-tensor) or every row (per-tensor, when tokens
are split over `batch_axis`) take their amax across the devices holding the parts
(`numerics.tiling.sharded_amax`): every device quantizes with the unsharded scale.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from pallas_kernels import KShardError, deterministic_rows, k_shards

from ..dispatch import explain, matmul, output_dtype, registered_kernels
from ..numerics.tiling import sharded_amax
from ..qweight import QuantizedWeight
from ..spec import Granularity

__all__ = ["TensorParallel", "weight_partition_specs", "shard_layer", "sharded_matmul",
           "interleave_parts", "interleaved_rows"]

MODES = ("column", "row")


@dataclasses.dataclass(frozen=True)
class TensorParallel:
    """How a QuantDense is split: over mesh axis `axis`, `mode` column or row; activations'
    leading (token) dimension optionally split over `batch_axis`. `gather` makes a column-
    parallel layer return its output replicated: left sharded, the next reduction over the
    features (a norm, attention) would run as per-device partial sums plus an all-reduce and
    differ from one device in the last bits."""

    mesh: Mesh
    mode: str
    axis: str
    batch_axis: str | None = None
    gather: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"tensor-parallel mode must be one of {MODES}, got {self.mode!r}")
        for name in (self.axis, self.batch_axis):
            if name is not None and name not in self.mesh.shape:
                raise ValueError(f"mesh has axes {tuple(self.mesh.shape)}; no axis {name!r}")
        if self.axis == self.batch_axis:
            raise ValueError("axis and batch_axis must be different mesh axes")

    @property
    def size(self) -> int:
        return self.mesh.shape[self.axis]


def weight_partition_specs(qw: QuantizedWeight, mode: str, axis: str, n_shards: int, *,
                           weight_only: bool = False) -> dict[str, P | None]:
    """PartitionSpec of each stored array of `qw` ("data", "scale", "global_scale",
    "input_scale"; None where the array is absent) for `mode` over `n_shards` devices."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    wk = qw.spec.weight
    rows, cols = qw.storage_shape
    g = wk.granularity
    specs: dict[str, P | None] = {}
    if mode == "column":
        if rows % n_shards:
            raise ValueError(f"column parallel: {rows} stored weight rows (out_features, padded "
                             f"to whole blocks) do not divide over {n_shards} devices")
        local = rows // n_shards
        if g is Granularity.BLOCK and local % wk.block[0]:
            raise ValueError(
                f"column parallel: a shard boundary would split a {wk.block[0]}-row scale block "
                f"(weight scale grid {tuple(qw.scale.shape)}; {rows} rows over {n_shards} devices "
                f"= {local} rows each, not a multiple of {wk.block[0]})")
        specs["data"] = P(axis, None)
        specs["scale"] = P(None, None) if g is Granularity.TENSOR else P(axis, None)
        if qw.global_scale is not None:
            specs["global_scale"] = P(axis) if qw.global_scale.ndim == 1 else P()
    else:
        if cols % n_shards:
            raise ValueError(f"row parallel: {cols} stored weight columns (in_features, padded "
                             f"to whole tiles) do not divide over {n_shards} devices")
        local = cols // n_shards
        if wk.k_tile and local % wk.k_tile:
            raise ValueError(
                f"row parallel: a shard boundary would split a weight scale "
                f"{'block' if g is Granularity.BLOCK else 'group'} of {wk.k_tile} columns "
                f"(weight scale grid {tuple(qw.scale.shape)}; {cols} columns over {n_shards} "
                f"devices = {local} each)")
        if wk.is_fp4 and local % 2:
            raise ValueError(f"row parallel: {local} columns per device split a packed e2m1 byte")
        act = None if weight_only else qw.spec.activation
        if act is not None:
            if act.k_tile and local % act.k_tile:
                raise ValueError(
                    f"row parallel: a shard boundary would split an activation scale group of "
                    f"{act.k_tile} ({cols} columns over {n_shards} devices = {local} each)")
        specs["data"] = P(None, axis)
        specs["scale"] = P(None, axis) if wk.k_tile else P(None, None)
        if qw.global_scale is not None:
            specs["global_scale"] = P(*([None] * qw.global_scale.ndim))
    specs.setdefault("global_scale", None)
    specs["input_scale"] = None if qw.input_scale is None else P()
    return specs


def interleaved_rows(sizes: tuple[int, ...], shards: int) -> jax.Array:
    """Row order [part0_0 part1_0 .. | part0_1 part1_1 .. | ..] of parts of `sizes` rows."""
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    return jnp.concatenate([
        jnp.arange(off + s * (size // shards), off + (s + 1) * (size // shards))
        for s in range(shards) for off, size in zip(offsets, sizes)])


def interleave_parts(qw: QuantizedWeight, sizes: tuple[int, ...], shards: int
                     ) -> QuantizedWeight:
    """The fused weight `qw` (parts of `sizes` rows, concatenated) with its rows reordered so that
    shard s of a column-parallel split holds [part0_s | part1_s | ...]: each device then owns
    its own slice of every part (its q, k and v heads), and splitting the output into parts
    needs no data from other devices. Stored values are only moved. Raises ValueError where a
    part's rows do not split whole (into shards, and into scale blocks) or rows are padded."""
    wk = qw.spec.weight
    if qw.layout != "nk" or qw.segments or qw.storage_shape[0] != qw.shape[0]:
        raise ValueError("interleave_parts: needs an unpadded (N, K) weight without row segments")
    if sum(sizes) != qw.shape[0]:
        raise ValueError(f"interleave_parts: parts of {sizes} rows, weight has {qw.shape[0]}")
    block = wk.block[0] if wk.granularity is Granularity.BLOCK else 1
    for size in sizes:
        if size % (shards * block):
            raise ValueError(f"interleave_parts: a part of {size} rows does not split into "
                             f"{shards} shards of whole {block}-row scale blocks")
    rows = interleaved_rows(sizes, shards)
    scale = qw.scale
    if wk.granularity is Granularity.BLOCK:
        scale = scale[rows[::block] // block]
    elif wk.granularity is not Granularity.TENSOR:
        scale = scale[rows]
    gscale = qw.global_scale
    if gscale is not None and jnp.ndim(gscale) == 1:
        gscale = gscale[rows]
    return QuantizedWeight(qw.data[rows], scale, gscale, qw.input_scale, qw.spec, qw.shape,
                           qw.segments, qw.layout)


def shard_layer(layer, mesh: Mesh, mode: str, axis: str, *, batch_axis: str | None = None,
                gather: bool = False) -> None:
    """Place a QuantDense's arrays with NamedShardings (recorded as NNX `out_sharding`
    metadata) and make its calls run tensor-parallel."""
    tp = TensorParallel(mesh, mode, axis, batch_axis, gather)
    specs = weight_partition_specs(layer.qweight, mode, axis, tp.size,
                                   weight_only=layer.weight_only)
    for name, spec in specs.items():
        var = getattr(layer, name)
        if var is None:
            continue
        var.set_value(jax.device_put(var.get_value(), NamedSharding(mesh, spec)))
        var.set_metadata(out_sharding=tuple(spec))
    if layer.bias is not None:  # bias is added to the trimmed, logical output: replicate
        layer.bias.set_value(jax.device_put(layer.bias.get_value(), NamedSharding(mesh, P())))
        layer.bias.set_metadata(out_sharding=(None,))
    layer.parallel = tp


def sharded_matmul(x: jax.Array, qw: QuantizedWeight, tp: TensorParallel, *, kernel: str = "auto",
                   deterministic: bool = False, weight_only: bool = False,
                   out_dtype: Any = None) -> jax.Array:
    """`jqlin.matmul(x, qw, out_dtype=...)` computed tensor-parallel as `tp` says; same result
    as unsharded (column: same per-column arithmetic; row: float32 partial sums added across
    devices)."""
    specs = weight_partition_specs(qw, tp.mode, tp.axis, tp.size, weight_only=weight_only)
    x = jnp.asarray(x)
    n, k = qw.shape
    out_dtype = output_dtype(out_dtype, x.dtype)
    if x.shape[-1] != k:
        raise ValueError(f"x has shape {x.shape}; expected (..., {k}) to match in_features")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    batch = tp.batch_axis if tp.batch_axis and m % tp.mesh.shape[tp.batch_axis] == 0 else None
    names = tuple(name for name, spec in specs.items() if spec is not None)
    fn = _sharded_fn(tp, qw.spec, qw.shape, qw.storage_shape, qw.segments, qw.layout, names,
                     tuple(specs[name] for name in names), batch, kernel, deterministic,
                     weight_only, out_dtype)
    y = fn(x2, *[getattr(qw, name) for name in names])
    return y.reshape(*lead, n)


@functools.lru_cache(maxsize=256)
def _sharded_fn(tp: TensorParallel, spec, shape, storage, segments, layout, names, specs, batch,
                kernel, deterministic, weight_only, out_dtype):
    """The jitted shard_map program for one layer configuration (cached: eager calls reuse it;
    jit also reshards the inputs to the in_specs)."""
    (n, k), (rows, cols) = shape, storage
    opts = dict(kernel=kernel, deterministic=deterministic, weight_only=weight_only)
    logical = QuantizedWeight(None, None, None, None, spec, shape, segments, layout)

    def local_weight(parts, local_shape):
        got: dict[str, Any] = dict(zip(names, parts))
        return QuantizedWeight(got["data"], got["scale"], got.get("global_scale"),
                               got.get("input_scale"), spec, local_shape, (), layout)

    if tp.mode == "column":
        def body(xl, *parts):
            # tokens split over batch: per-tensor amax joins; det tiles as for all `rows`
            with sharded_amax(batch, None), deterministic_rows(rows):
                return matmul(xl, local_weight(parts, (rows // tp.size, k)),
                              out_dtype=out_dtype, **opts)

        mapped = jax.shard_map(body, mesh=tp.mesh, in_specs=(P(batch, None), *specs),
                               out_specs=P(batch, tp.axis), check_vma=False)

        def run(x2, *arrays):
            x2, arrays = _placed(tp.mesh, P(batch, None), x2, specs, arrays)
            y = mapped(x2, *arrays)
            if rows == n and not segments and not tp.gather:  # the output stays column-sharded
                return y
            # padding rows sit inside shards: gather the columns, then drop them
            return logical.trim_rows(_put(y, tp.mesh, P(batch, None)))
    else:
        def body(xl, *parts):
            w = local_weight(parts, (rows, cols // tp.size))
            with sharded_amax(batch, tp.axis):  # K split: row-spanning amaxes join across it
                if deterministic:
                    why = _k_slice_problem(xl, w, opts)
                    if why is None:
                        try:
                            with k_shards(tp.axis, tp.size):  # the unsharded sum, on every device
                                return matmul(xl, w, out_dtype=out_dtype, **opts)
                        except KShardError as e:
                            why = str(e)
                    warnings.warn(
                        f"row-parallel {n}x{k} layer, deterministic=True: {why}. Its float32 "
                        f"partial products are all-reduced instead, so results differ from one "
                        f"device in the last bits (column parallel keeps them bitwise)",
                        stacklevel=1)
                # f32 partials: summing rounded bf16 partials would add error the unsharded
                # layer lacks (x keeps its dtype: a float32 x would cost three times the MMAs)
                yl = matmul(xl, w, out_dtype=jnp.float32, **opts)
            return jax.lax.psum(yl, tp.axis)

        mapped = jax.shard_map(body, mesh=tp.mesh, in_specs=(P(batch, tp.axis), *specs),
                               out_specs=P(batch, None), check_vma=False)

        def run(x2, *arrays):
            xp = jnp.pad(x2, ((0, 0), (0, cols - k)))
            xp, arrays = _placed(tp.mesh, P(batch, tp.axis), xp, specs, arrays)
            y = _put(mapped(xp, *arrays), tp.mesh, P(batch, None))
            return logical.trim_rows(y).astype(out_dtype)
    return jax.jit(run)


def _k_slice_problem(xl: jax.Array, w: QuantizedWeight, opts: dict) -> str | None:
    """None if the kernel `matmul` picks can run this device's K-slice of the deterministic
    schedule (pallas_kernels.k_shards), else why not."""
    ex = explain(xl, w, kernel=opts["kernel"], deterministic=True,
                 weight_only=opts["weight_only"])
    if ex.chosen is None:  # matmul raises with the explanation
        return None
    if not registered_kernels()[ex.chosen].k_sliced:
        return (f"kernel {ex.chosen!r} cannot run a K-slice of its deterministic schedule "
                f"(the Pallas kernels can)")
    return None


def _put(a: jax.Array, mesh: Mesh, spec: P) -> jax.Array:
    """`a` resharded to `spec` (a no-op where it already is), for Explicit and Auto meshes."""
    sharding = NamedSharding(mesh, spec)
    if any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        return jax.reshard(a, sharding)
    return jax.lax.with_sharding_constraint(a, sharding)


def _placed(mesh, x_spec, x, specs, arrays):
    return _put(x, mesh, x_spec), [_put(a, mesh, spec) for a, spec in zip(arrays, specs)]
