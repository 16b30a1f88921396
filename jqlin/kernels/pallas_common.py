"""What every Pallas kernel declaration shares: its dispatcher traits.

(That a weight is stored the way the kernels read it -- layout, data and scale dtypes and
shapes -- the dispatcher checks for every kernel: `QuantizedWeight.check`.)"""

from __future__ import annotations

__all__ = ["HOPPER_PALLAS"]

# Hopper-only Triton kernels with a batch-invariant configuration, preferred over the XLA
# reference where they honour a spec; on CPU they run in interpret mode (CI's kernel checks).
HOPPER_PALLAS = dict(platforms=("gpu",), batch_invariant=True, priority=10,
                     min_compute_capability=(9, 0), interpret_on=("cpu",), k_sliced=True)
