"""The batch-invariance check every kernel's tests share (docs/determinism.md)."""

import jax.numpy as jnp
import numpy as np

from jqlin import dispatch


def assert_rows_batch_invariant(qw, k: int, dtype, rng, ms, label: str, **call) -> None:
    """In deterministic mode, rows 0, M/2 and M-1 of an M-row matmul equal the same rows computed
    alone, bitwise, for every M in `ms`. Rows are scaled by 0.1..3 so they differ in range."""
    def run(x):
        return np.asarray(dispatch.matmul(x, qw, deterministic=True, **call).astype(jnp.float32))
    for m in ms:
        x = jnp.asarray(rng.standard_normal((m, k)) * rng.uniform(0.1, 3, (m, 1)), dtype)
        y = run(x)
        for i in sorted({0, m // 2, m - 1}):
            np.testing.assert_array_equal(run(x[i:i + 1])[0], y[i],
                                          err_msg=f"{label} M={m} row {i}")
