# %% [markdown]
# # jqlin quick start
#
# Specs, `jqlin.quantize`, `jqlin.matmul`, `jqlin.explain`, and the dispatcher's errors.
# Runs on CPU (the XLA reference path) and unchanged on a GPU (Pallas kernels where declared).

# %%
import jax, jax.numpy as jnp, numpy as np
import jqlin
print(jax.devices()[0].platform, jax.__version__)
print(jqlin.formats.names())

# %% [markdown]
# A format is data: a `QuantSpec` of a weight `QuantKey` and an activation `QuantKey` (or None).

# %%
spec = jqlin.formats.get("fp8_block")
print(spec.describe())
print(jqlin.formats.get("nvfp4").describe())

# %% [markdown]
# Quantize a float (out_features, in_features) weight; multiply; compare with the float product.

# %%
rng = np.random.default_rng(0)
w = (rng.standard_normal((512, 320)) * np.exp(0.5 * rng.standard_normal((512, 1)))).astype(np.float32)
x = jnp.asarray(rng.standard_normal((4, 320)), jnp.bfloat16)
qw = jqlin.quantize(w, "fp8_block")
print(qw)
y = jqlin.matmul(x, qw)
ref = np.asarray(x, np.float32) @ w.T
print("relative error vs float:", float(np.linalg.norm(np.asarray(y, np.float32) - ref) / np.linalg.norm(ref)))

# %% [markdown]
# `explain` says which kernel runs and why the others were rejected.

# %%
print(jqlin.explain(x, qw))
print()
print(jqlin.explain(x, qw, weight_only=True))

# %% [markdown]
# Deterministic mode: a row computed alone equals the same row inside a batch, bit for bit.

# %%
xs = jnp.asarray(rng.standard_normal((64, 320)), jnp.bfloat16)
alone = jqlin.matmul(xs[:1], qw, deterministic=True)
batched = jqlin.matmul(xs, qw, deterministic=True)
print("bitwise equal:", bool(jnp.array_equal(alone[0], batched[0])))

# %% [markdown]
# Errors name what is wrong and never fall back silently.

# %%
for call in (lambda: jqlin.matmul(jnp.ones((2, 100)), qw),
             lambda: jqlin.matmul(x, qw, kernel="no_such_kernel"),
             lambda: jqlin.quantize(w, "fp9"),
             lambda: jqlin.quantize(w, "fp8_per_tensor")):
    try:
        call()
    except (ValueError, jqlin.UnsupportedSpecError) as e:
        print(type(e).__name__, ":", str(e).splitlines()[0])
