"""Pallas GPU kernels for quantized matmul. No jqlin imports: arrays and static configs only.

Modules: fp8_core (the shared Triton-backend kernel body), fp8_w8a16 (weight-only fp8),
fp8_w8a8 (fp8 x fp8: per-tensor/channel x per-tensor/token, and 128x128-block x 1x128-group),
common (MatmulConfig and explicit -> cached -> heuristic resolution), fp8_heuristics.
"""

from .common import (KShardError, MatmulConfig, cache_config, cached_config,
                     clear_config_cache, deterministic_rows, k_shards, load_tuned_configs,
                     resolve_config)
from .fp8_core import fp8_matmul
from .fp8_w8a16 import w8a16_config, w8a16_matmul
from .fp8_w8a8 import w8a8_config, w8a8_matmul

__all__ = ["MatmulConfig", "cache_config", "cached_config", "clear_config_cache",
           "deterministic_rows", "k_shards", "KShardError", "load_tuned_configs", "resolve_config", "fp8_matmul",
           "w8a16_matmul", "w8a8_matmul", "w8a16_config", "w8a8_config"]
