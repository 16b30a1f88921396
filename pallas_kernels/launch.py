"""The launch every tiled kernel here shares: a Triton-backend pallas_call over
(output tiles, split_k) programs, then the split-K partials summed in a fixed order.

The partials are added left to right (split 0 + split 1 + ...), never as a tree whose shape
could follow M: with a deterministic config the reduction order is then a function of the
config alone, which is what batch invariance needs. Inside `common.k_shards` (a row-parallel
layer) every device runs its own splits of the unsharded schedule; the partials of all devices
are gathered and added in the same order, so the result is the unsharded one bit for bit.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .common import current_k_shards

__all__ = ["launch_split_k", "sum_splits", "sum_device_splits", "fold_parts", "writes_partials"]


def writes_partials(split_k: int) -> bool:
    """Whether a launch of `split_k` splits writes float32 partials (and `finish` runs after
    the sum, outside the kernel) rather than the finished output."""
    return split_k > 1 or current_k_shards() is not None


def sum_splits(y: jax.Array, split_k: int, m: int, n: int) -> jax.Array:
    """(split_k * m, n) float32 partials -> (m, n), added in split order."""
    y = y.reshape(split_k, m, n)
    total = y[0]
    for s in range(1, split_k):
        total = total + y[s]
    return total


def launch_split_k(body: Callable, operands: Sequence[jax.Array], *, m: int, n: int,
                   tiles: int, split_k: int, num_warps: int, num_stages: int, out_dtype,
                   poison: bool, interpret: bool, name: str,
                   finish: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
    """Run `body(*in_refs, out_ref)` on a (tiles, split_k) grid and return the (m, n) result.

    With split_k > 1 (or inside k_shards) every split writes float32 partials to its own (m, n)
    slab; they are summed here (after gathering every device's, inside k_shards) and `finish`
    (float32 -> float32, e.g. a per-column scale) is applied before the cast to out_dtype.
    poison: a test hook -- the output is a NaN-filled buffer passed in aliased (the body never
    sees it), so any element the kernel fails to write stays NaN.
    """
    split = writes_partials(split_k)
    out_shape = jax.ShapeDtypeStruct((split_k * m, n), jnp.float32 if split else out_dtype)
    operands = list(operands)
    aliases = {}
    kernel = body
    if poison:
        operands.append(jnp.full(out_shape.shape, jnp.nan, out_shape.dtype))
        aliases = {len(operands) - 1: 0}
        n_in = len(operands)
        kernel = lambda *refs: body(*refs[: n_in - 1], *refs[n_in:])  # noqa: E731
    y = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(tiles, split_k),
        in_specs=[pl.no_block_spec] * len(operands),
        out_specs=pl.no_block_spec,
        input_output_aliases=aliases,
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name=name,
    )(*operands)
    if split:
        total = sum_device_splits(y, split_k, m, n)
        y = (finish(total) if finish is not None else total).astype(out_dtype)
    return y


def fold_parts(part: Callable[[int], jax.Array], count: int, groups: int = 1) -> jax.Array:
    """part(0) + part(1) + ... + part(count - 1), left to right -- or, with groups, each of
    `groups` equal runs of consecutive parts so, then the runs' sums in order (a deterministic
    K order of groups of parts). The one fold of K-ordered partials: XLA's sum of a launch's
    slabs (sum_device_splits) and a decode cluster's in-kernel finish
    (fp8_a16_decode_mgpu.plain_slabs), whose bits must be the same. part(i) is called just
    before its addition (in a kernel: one load live at a time)."""
    if groups < 1 or count % groups:
        raise ValueError(f"{count} splits do not form {groups} equal groups")
    per, total = count // groups, None
    for g in range(groups):
        run = part(g * per)
        for i in range(g * per + 1, (g + 1) * per):
            run = run + part(i)
        total = run if total is None else total + run
    return total


def sum_device_splits(y: jax.Array, split_k: int, m: int, n: int,
                      groups: int = 1) -> jax.Array:
    """sum_splits of this device's float32 partials -- inside `common.k_shards`, of every
    device's, gathered first (device order along the axis is K order: splits stay in order).
    groups: fold_parts' groups of consecutive splits."""
    shards = current_k_shards()
    if shards is not None:
        y = jax.lax.all_gather(y, shards.axis, axis=0, tiled=True)
        split_k *= shards.count
    y = y.reshape(split_k, m, n)
    return fold_parts(lambda s: y[s], split_k, groups)
