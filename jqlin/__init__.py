"""jqlin: quantized matrix multiplication for JAX, reading PyTorch-world checkpoints as stored."""

from . import formats
from .dispatch import Explanation, Kernel, KeyPattern, explain, matmul, register_kernel, registered_kernels
from .errors import CheckpointError, JqlinError, UnknownFormatError, UnsupportedSpecError
from .qweight import QuantizedWeight, calibrate_input_scale, fuse, quantize
from .spec import GlobalScale, Granularity, QuantKey, QuantSpec, ScaleRule

__version__ = "0.1.0"

__all__ = ["formats", "QuantKey", "QuantSpec", "Granularity", "ScaleRule", "GlobalScale",
           "QuantizedWeight", "quantize", "fuse", "calibrate_input_scale", "matmul", "explain",
           "Explanation", "Kernel", "KeyPattern", "registered_kernels", "register_kernel", "JqlinError",
           "UnsupportedSpecError", "CheckpointError", "UnknownFormatError"]
