"""The accuracy check of the Mosaic GPU kernel tests: y against a float64 reference, within
acc_rtol of the |.|-sum bound (accumulation) plus one rounding to y's dtype."""

import jax.numpy as jnp
import numpy as np


def assert_within_bound(y, ref, bound, acc_rtol: float, out_dtype) -> None:
    y = np.asarray(jnp.asarray(y, jnp.float32), np.float64)
    assert y.shape == ref.shape and np.isfinite(y).all()
    ulp = 2.0 ** -23 if out_dtype == jnp.float32 else 2.0 ** -7
    tol = acc_rtol * bound + ulp * np.maximum(np.abs(ref), np.abs(y))
    excess = np.abs(y - ref) / tol
    assert excess.max() <= 1.0, f"max |y-ref|/tol {excess.max():.3g}"
