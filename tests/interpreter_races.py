"""The Mosaic GPU interpreter's race detector for the kernels' CPU tests (no public API yet:
private modules)."""

from typing import Callable

import jax
import numpy as np


def run_checking_races(call: Callable) -> tuple[jax.Array, bool]:
    """call(interpret_params) run with the happens-before race detector on, from a fresh
    interpreter state: (its output, whether a race was found). Asserts the output finite."""
    import jax.experimental.pallas.mosaic_gpu as plgpu
    from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as gpu_interpret
    gpu_interpret.reset_gpu_interpret_mode_state()
    y = call(plgpu.InterpretGPUParams(detect_races=True))
    assert np.isfinite(np.asarray(y, np.float32)).all()
    return y, gpu_interpret.get_races().races_found
