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
from typing import Callable, Iterator

import jax

__all__ = ["MatmulConfig", "cdiv", "next_pow2", "m_bucket", "resolve_config", "cache_config",
           "cached_config", "load_tuned_configs", "clear_config_cache", "device_kind",
           "deterministic_rows", "NUM_SMS_DEFAULT"]

NUM_SMS_DEFAULT = 132  # H100/H200 SXM; only used by heuristics when the device cannot say
_VARIANTS = ("mma", "swap", "gemv")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


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


@contextlib.contextmanager
def deterministic_rows(n: int) -> Iterator[None]:
    """Within: deterministic configs are resolved as for a weight of `n` rows (the unsharded N of
    a column-parallel shard), so each shard sums K in the unsharded kernel's order."""
    with _DET_ROWS(int(n)):
        yield


def resolve_config(kernel: str, *, m: int, n: int, k: int, deterministic: bool,
                   explicit: MatmulConfig | None, extra: str,
                   heuristic: Callable[[int | None, int, int], MatmulConfig]) -> MatmulConfig:
    """explicit -> cached -> heuristic. The heuristic gets m=None in deterministic mode, and N of
    an enclosing `deterministic_rows`."""
    if explicit is not None:
        return explicit
    mm = None if deterministic else m
    if deterministic and _DET_ROWS.value is not None:
        n = _DET_ROWS.value
    cfg = cached_config(kernel, m=mm, n=n, k=k, extra=extra)
    return cfg if cfg is not None else heuristic(mm, n, k)
