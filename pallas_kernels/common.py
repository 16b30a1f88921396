"""Shared pieces of the Pallas GPU kernels: tile configs and their resolution.

A config is resolved like tokamax does: an explicit config wins; else a cached (tuned) one for
(kernel, device kind, M bucket or "det", N, K, variant key); else the kernel's heuristic.
Deterministic (batch-invariant) lookups never see M: their key holds "det" instead of the M
bucket, so the reduction order can only depend on (K, N, spec).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
from typing import Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["MatmulConfig", "cdiv", "next_pow2", "m_bucket", "resolve_config", "cache_config",
           "cached_config", "load_tuned_configs", "clear_config_cache", "device_kind",
           "deterministic_rows", "KShards", "KShardError", "k_shards", "current_k_shards",
           "current_det_rows",
           "device_ranges", "finish_rows", "kept",
           "NUM_SMS_DEFAULT"]

NUM_SMS_DEFAULT = 132  # H100/H200 SXM; only used by heuristics when the device cannot say
_VARIANTS = ("mma", "swap", "gemv")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kept(v) -> jax.Array:
    """v as float32 behind an optimization barrier: to XLA it is data, never a constant. A
    finish that divides by it then divides (XLA's simplifier rewrites x / constant -- a global
    scale closed over by jit -- as x * (1/constant): other bits than the kernels' div.full.f32,
    session 44), and no product or quotient of scales is folded on the host in IEEE arithmetic
    where the GPU's would differ. Free on a jit argument or a constant; put it on the leaves (a
    scale as stored): behind a barrier a broadcast is materialized, a kernel of its own
    (session 45: +1.1-1.9 us per NVFP4 decode when the barrier sat on the (N,) column).
    Through jqlin.matmul the weight's arrays are already behind a barrier (dispatch._as_data);
    this one keeps the kernels' own entry points (nvfp4_post_scale called directly, as their
    tests and probes do with a closed-over weight) to the same bits."""
    return jax.lax.optimization_barrier(jnp.asarray(v)).astype(jnp.float32)


def finish_rows(total: jax.Array, col: jax.Array | None, factor: float, op: str, *,
                divide: Callable[[jax.Array, jax.Array], jax.Array] | None = None) -> jax.Array:
    """A finish's float32 arithmetic on a kernel's sums: total times factor, then times (op
    "mul") or divided by ("div") col (broadcast; None: no column factor). The one place XLA
    finishes the kernels' sums (mgpu_common.RowFinish, mx_core's split-K, mx_dense) and the
    Mosaic kernels finish their own (`divide`: mgpu_common.div_full).
    The division is XLA:GPU's div.full.f32 wherever it runs: XLA's `/`, Triton's `/`, and
    div_full spelled out in Mosaic kernels -- so a finish by XLA and one in a kernel give the
    same bits (session 44: 2 of 33280 NVFP4 outputs differed). A divisor must not be a
    compile-time constant, which XLA would invert: build it from `kept` leaves
    (jqlin.kernels.pallas_fp4.nvfp4_post_scale does). (XLA's CPU compiler multiplies by the
    reciprocal of any broadcast divisor; the interpreter's kernels meet the same rewrite.)"""
    if factor != 1:
        total = total * factor
    if col is None:
        return total
    if op != "div":
        return total * col
    return divide(total, col) if divide else total / col


def next_pow2(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def m_bucket(m: int) -> int:
    """Tuned configs are shared by all M in one power-of-two bucket."""
    return next_pow2(max(1, m))


@dataclasses.dataclass(frozen=True)
class MatmulConfig:
    """Tiles and launch parameters of one fp8 matmul launch.

    variant: "mma" (x tile is the MMA's A operand), "swap" (weights are A, x^T is B: keeps the
    MMA's 64-row side on N when M is tiny), "gemv" (no MMA: multiply-reduce, M <= 4).
    split_k: K is cut into this many contiguous ranges computed by separate programs and summed
    afterwards in a fixed left-to-right order.
    promote_k: fp8 x fp8 only; see fp8_dot (None: Pallas' default, promote every MMA).
    fp8_mma: e4m3 activations only. e4m3 -> bf16 is exact, so a bf16 MMA on converted tiles
    computes the same exact products with float32 accumulation; at small M the MMA rate is
    irrelevant and this sidesteps the fp8 MMA's reduced-precision accumulator.
    k_unroll: loads of this many consecutive K-steps are issued together (bytes in flight).
    fast_convert: bf16 MMAs on e4m3 tiles convert with integer ops instead of the cvt chain
    (exact for every finite code; a NaN code becomes 480). Interpret mode converts with astype.
    k_parts (MMA variants, split_k 1): K is accumulated as this many contiguous parts, each from
    zero, the part sums added left to right inside the program (whole-K scales after) -- the
    sums of split_k=k_parts without partials in memory. Deterministic fp8 x fp8 configs use it,
    so that a row-parallel device can compute its parts alone (`k_shards`).
    """

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    group_m: int = 8
    variant: str = "mma"
    promote_k: int | None = None  # fp8 x fp8 only: K elements per tensor-core accumulation
    fp8_mma: bool = True  # e4m3 x: False converts both tiles to bf16 (exact) for a bf16 MMA
    k_unroll: int = 1  # K-steps per loop iteration, their loads issued before any MMA
    fast_convert: bool = False  # e4m3 -> bf16 by bit placement in inline PTX (see fp8_convert)
    k_parts: int = 1  # K sums of split_k=k_parts computed in one program (MMA variants)

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"MatmulConfig.{name} must be a power of two, got {v}")
        if self.variant not in _VARIANTS:
            raise ValueError(f"MatmulConfig.variant must be one of {_VARIANTS}, "
                             f"got {self.variant!r}")
        if self.variant != "gemv" and min(self.block_m, self.block_n, self.block_k) < 16:
            raise ValueError("MMA tiles need block_m, block_n, block_k >= 16 "
                             f"(Triton dot), got {self.block_m}x{self.block_n}x{self.block_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError("MatmulConfig.num_warps must be 1..16 (power of two), "
                             f"got {self.num_warps}")
        if self.promote_k is not None and (self.promote_k < 32 or self.promote_k % 32):
            raise ValueError("MatmulConfig.promote_k must be a multiple of 32, "
                             f"got {self.promote_k}")
        if self.k_unroll < 1:
            raise ValueError(f"MatmulConfig.k_unroll must be >= 1, got {self.k_unroll}")
        if self.num_stages < 1 or self.split_k < 1 or self.group_m < 1:
            raise ValueError("MatmulConfig.num_stages, split_k and group_m must be >= 1")
        if self.k_parts < 1 or (self.k_parts > 1 and (self.split_k > 1 or
                                                       self.variant == "gemv")):
            raise ValueError("MatmulConfig.k_parts must be >= 1, and > 1 only for MMA variants "
                             f"with split_k 1; got k_parts={self.k_parts}, "
                             f"split_k={self.split_k}, variant={self.variant!r}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


_CACHE: dict[tuple, MatmulConfig] = {}


def device_kind() -> str:
    try:
        return jax.devices()[0].device_kind
    except Exception:  # pragma: no cover - no backend at all
        return "unknown"


def _key(kernel: str, kind: str, m: int | None, n: int, k: int, extra: str) -> tuple:
    return (kernel, kind, "det" if m is None else m_bucket(m), n, k, extra)


def cache_config(kernel: str, cfg: MatmulConfig, *, m: int | None, n: int, k: int,
                 extra: str = "", kind: str | None = None) -> None:
    """Remember a tuned config; m=None stores the deterministic (M-independent) one."""
    _CACHE[_key(kernel, kind or device_kind(), m, n, k, extra)] = cfg


def cached_config(kernel: str, *, m: int | None, n: int, k: int, extra: str = "",
                  kind: str | None = None) -> MatmulConfig | None:
    return _CACHE.get(_key(kernel, kind or device_kind(), m, n, k, extra))


def clear_config_cache() -> None:
    _CACHE.clear()


def load_tuned_configs(path: str | pathlib.Path) -> int:
    """Load tuned configs written by benchmarks (a JSON list of entries). Returns the count.

    Entry: {"kernel", "device_kind", "m" (int or "det"), "n", "k", "extra", "config": {...}}.
    """
    entries = json.loads(pathlib.Path(path).read_text())
    for e in entries:
        m = None if e["m"] == "det" else int(e["m"])
        cache_config(e["kernel"], MatmulConfig(**e["config"]), m=m, n=int(e["n"]),
                     k=int(e["k"]), extra=e.get("extra", ""), kind=e["device_kind"])
    return len(entries)


# The deterministic heuristics size split_k by N (programs per SM), so a column-parallel shard
# resolving its config from its own N could cut K differently from the unsharded kernel: then its
# columns would not be bitwise those of one device. Jit-cache-sensitive: a kernel traced inside
# is another program.
_DET_ROWS = jax.make_user_context(default_value=None)


def current_det_rows() -> int | None:
    """The unsharded N of an enclosing `deterministic_rows`, if any (read at trace time)."""
    return _DET_ROWS.value


@contextlib.contextmanager
def deterministic_rows(n: int) -> Iterator[None]:
    """Within: deterministic configs are resolved as for a weight of `n` rows (the unsharded N of
    a column-parallel shard), so each shard sums K in the unsharded kernel's order."""
    with _DET_ROWS(int(n)):
        yield


class KShards(NamedTuple):
    """A deterministic product computed as `count` equal K-slices, slice i on the device at
    index i of mesh axis `axis` (a row-parallel layer)."""

    axis: str
    count: int


class KShardError(ValueError):
    """The deterministic K schedule cannot be cut at the device boundaries of a K-sharded
    product (so a row-parallel result could not be bitwise the unsharded one)."""


# Deterministic mode sums split-K partials left to right. A row-parallel device holding K-slice
# i of P computes exactly splits [i*S/P, (i+1)*S/P) of the unsharded schedule when S % P == 0;
# gathering every device's partials and adding them in split order then reproduces the
# unsharded sum bit for bit (launch_split_k). Jit-cache-sensitive, like _DET_ROWS.
_K_SHARDS = jax.make_user_context(default_value=None)


@contextlib.contextmanager
def k_shards(axis: str, count: int) -> Iterator[None]:
    """Within (inside shard_map over `axis`): deterministic kernels get this device's K-slice of
    a product of K = local K * `count`, run their part of the unsharded K schedule, and return
    the whole (replicated) result: the split partials of all devices are all-gathered and summed
    in split order. Raises KShardError (at trace time) where the schedule does not allow it."""
    if count < 1:
        raise ValueError(f"k_shards: count must be >= 1, got {count}")
    with _K_SHARDS(KShards(str(axis), int(count))):
        yield


def current_k_shards() -> KShards | None:
    """The enclosing `k_shards`, if any (read at trace time by the launch)."""
    return _K_SHARDS.value


def _shard_k_schedule(cfg: MatmulConfig, shards: KShards, k_total: int) -> MatmulConfig:
    """The unsharded config `cfg` (for K = k_total) as one device's part: its share of the
    split_k * k_parts K ranges, each run as a split of its own (partials gathered, then added in
    order: the same sums as the unsharded program's)."""
    step = cfg.block_k * cfg.k_unroll
    if k_total % step:
        raise KShardError(f"K={k_total} is not a whole number of {step}-wide K-steps, so the "
                          f"last step would straddle the K-slices of {shards.count} devices")
    ranges = device_ranges(cfg.split_k * cfg.k_parts, k_total, shards.count)
    return dataclasses.replace(cfg, split_k=ranges, k_parts=1)


def device_ranges(ranges: int, k_total: int, count: int) -> int:
    """How many of a deterministic schedule's `ranges` contiguous K ranges (of K = k_total) each
    of `count` K-slices holds; KShardError where slice boundaries would cut a range."""
    if ranges % count:
        raise KShardError(
            f"the deterministic K schedule of this layer (K={k_total}: {ranges} split(s) of "
            f"{k_total // ranges}) cannot be cut at the boundaries of {count} "
            f"K-slices (needs a split count that is a multiple of {count})")
    return ranges // count


def resolve_config(kernel: str, *, m: int, n: int, k: int, deterministic: bool,
                   explicit: MatmulConfig | None, extra: str,
                   heuristic: Callable[[int | None, int, int], MatmulConfig]) -> MatmulConfig:
    """explicit -> cached -> heuristic. The heuristic gets m=None in deterministic mode, N of
    an enclosing `deterministic_rows` and the unsharded K of an enclosing `k_shards` (whose
    config then runs split_k / count of its splits here)."""
    shards = _K_SHARDS.value
    if shards is not None and not deterministic:
        raise KShardError("k_shards: only deterministic kernels run K-sliced (default mode sums "
                          "row-parallel partials with an all-reduce)")
    if shards is not None:
        k = k * shards.count
    if explicit is not None:
        cfg = explicit
    else:
        mm = None if deterministic else m
        if deterministic and _DET_ROWS.value is not None:
            n = _DET_ROWS.value
        cfg = cached_config(kernel, m=mm, n=n, k=k, extra=extra)
        cfg = cfg if cfg is not None else heuristic(mm, n, k)
    return cfg if shards is None else _shard_k_schedule(cfg, shards, k)
