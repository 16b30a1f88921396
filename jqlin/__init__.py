"""jqlin: quantized matrix multiplication for JAX, reading PyTorch-world checkpoints as stored."""

from . import formats
from .dispatch import (Explanation, Kernel, KeyPattern, explain, kernels_for, matmul,
                       register_kernel, registered_kernels)
from .errors import CheckpointError, JqlinError, UnknownFormatError, UnsupportedSpecError
from .qweight import QuantizedWeight, calibrate_input_scale, fuse, quantize
from .spec import GlobalScale, Granularity, QuantKey, QuantSpec, ScaleRule
from .checkpoint import Checkpoint, load_checkpoint

__version__ = "0.1.0"

__all__ = ["formats", "QuantKey", "QuantSpec", "Granularity", "ScaleRule", "GlobalScale",
           "QuantizedWeight", "quantize", "fuse", "calibrate_input_scale", "matmul", "explain",
           "Explanation", "Kernel", "KeyPattern", "registered_kernels", "kernels_for",
           "register_kernel", "JqlinError",
           "UnsupportedSpecError", "CheckpointError", "UnknownFormatError", "Checkpoint", "load_checkpoint",
           "QuantDense", "quantize_model", "nn", "linen", "models"]

# Flax-based parts load on first use, so the core does not import flax.
_LAZY = {"QuantDense": ("jqlin.nn", "QuantDense"), "quantize_model": ("jqlin.nn", "quantize_model"),
         "nn": ("jqlin.nn", None), "linen": ("jqlin.nn.linen", None), "models": ("jqlin.models", None)}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'jqlin' has no attribute {name!r}")
    import importlib
    module, attr = _LAZY[name]
    mod = importlib.import_module(module)
    return mod if attr is None else getattr(mod, attr)
