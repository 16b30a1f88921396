"""Kernel declarations. Importing this package registers every built-in kernel."""

from . import xla  # noqa: F401  the oracle; every platform

try:  # Pallas glue; a JAX without Pallas GPU still has the XLA path.
    from . import pallas_fp8  # noqa: F401
except ImportError as e:  # pragma: no cover - reported by explain() as a missing kernel
    import warnings
    warnings.warn(f"jqlin: Pallas FP8 kernels unavailable: {e}")

try:
    from . import pallas_fp4  # noqa: F401
except ImportError as e:  # pragma: no cover - reported by explain() as a missing kernel
    import warnings
    warnings.warn(f"jqlin: Pallas NVFP4/MX kernels unavailable: {e}")
