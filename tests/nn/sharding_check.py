"""Sharded-vs-unsharded QuantDense on 8 CPU host devices; run by test_sharding.py in a
subprocess because XLA_FLAGS must be set before jax is imported. Exits non-zero on failure."""

import os
import sys

assert "--xla_force_host_platform_device_count=8" in os.environ.get("XLA_FLAGS", ""), \
    "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jqlin  # noqa: E402
from jqlin.nn import QuantDense  # noqa: E402

assert jax.device_count() == 8, jax.devices()
rng = np.random.default_rng(0)
mesh = jax.make_mesh((2, 4), ("data", "model"))
STATIC = {"nvfp4", "fp8_per_tensor"}


def weight(n, k):
    return rng.standard_normal((n, k)) * np.exp(rng.standard_normal((n, 1))) * np.exp(
        rng.standard_normal((1, k)))


def layer(fmt, n, k, x):
    qw = jqlin.quantize(jnp.asarray(weight(n, k), jnp.float32), fmt,
                        calibration=x if fmt in STATIC else None)
    return QuantDense.from_quantized(qw, jnp.asarray(rng.standard_normal(n), jnp.float32))


def check(name, qd, x, mode, mesh=mesh, **call):
    ref = np.asarray(qd(x, **call))
    sharded = nnx.clone(qd)
    sharded.weight_only = call.get("weight_only", False)  # validated when the weight is placed
    sharded.shard(mesh, mode, "model", batch_axis="data")
    data = sharded.data.get_value()
    want = P("model", None) if mode == "column" else P(None, "model")
    assert data.sharding.spec == want, (name, data.sharding.spec)
    local = data.addressable_shards[0].data.shape
    assert local == ((data.shape[0] // 4, data.shape[1]) if mode == "column"
                     else (data.shape[0], data.shape[1] // 4)), (name, local)
    specs = nnx.get_partition_spec(nnx.state(sharded))
    assert tuple(specs["data"].get_value()) == tuple(want), name
    y = np.asarray(sharded(x, **call))
    y_jit = np.asarray(nnx.jit(lambda m, v: m(v, **call))(sharded, x))
    assert y.shape == ref.shape and y.dtype == ref.dtype, name
    scale = np.abs(ref.astype(np.float32)).max()
    tol = 1e-5 if ref.dtype == np.float32 else 1e-2  # row parallel: f32 partials, re-ordered sum
    for got in (y, y_jit):
        np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=tol,
                                   atol=tol * scale, err_msg=name)
    print(f"ok {name}: max rel diff {np.abs(y.astype(np.float32) - ref).max() / scale:.1e}")


def expect_error(name, fn, match):
    try:
        fn()
    except ValueError as e:
        assert match in str(e), (name, str(e))
        print(f"ok {name}: {e}")
        return
    raise AssertionError(f"{name}: no error")


x = jnp.asarray(rng.standard_normal((2, 3, 512)) * 2, jnp.float32)  # 6 rows: split over "data"
for fmt in ["fp8_block", "fp8_ptpc", "fp8_per_tensor", "nvfp4", "mxfp8", "mxfp4_a16"]:
    qd = layer(fmt, 512, 512, x)
    check(f"{fmt} column", qd, x, "column")
    # per-token scales span all of K: in row parallel their amax is joined across devices
    check(f"{fmt} row", qd, x, "row")
    if fmt == "fp8_ptpc":
        check(f"{fmt} row weight_only", qd, x, "row", weight_only=True)
    if fmt in ("fp8_block", "nvfp4"):
        check(f"{fmt} column deterministic", qd, x, "column", deterministic=True)
        check(f"{fmt} row deterministic", qd, x, "row", deterministic=True)

# dynamic per-tensor activations: one amax over every row and column, however x is split
import dataclasses  # noqa: E402
from jqlin.spec import Granularity  # noqa: E402
ptpc = jqlin.formats.get("fp8_ptpc")
per_tensor = dataclasses.replace(ptpc, activation=dataclasses.replace(
    ptpc.activation, granularity=Granularity.TENSOR))
dyn = QuantDense.from_quantized(jqlin.quantize(jnp.asarray(weight(512, 512), jnp.float32),
                                               per_tensor))
x_skew = x.at[0, 0, 7].set(40.0)  # the tensor amax lives on one device's rows and columns
check("fp8 dynamic per-tensor column (rows split)", dyn, x_skew, "column")
check("fp8 dynamic per-tensor row", dyn, x_skew, "row")
check("fp8_ptpc row, skewed rows", layer("fp8_ptpc", 512, 512, x), x_skew, "row")
# A column-parallel (512 x 128) layer and a row-parallel (128 x 512) one run the same local
# kernel shapes on this mesh ((3, 128) activations, (128, 128) weight), but only the second
# joins the amax across devices: the context adding the pmax is part of jit's cache key, so
# the second may not reuse the first's trace.
x_k128 = x_skew[..., :128].at[1, 2, 100].set(-50.0)
check("fp8_ptpc column 512x128", layer("fp8_ptpc", 512, 128, x_k128), x_k128, "column")
check("fp8_ptpc row 128x512 after it (same local shapes)", layer("fp8_ptpc", 128, 512, x),
      x_skew, "row")

# bf16 activations, odd K handled by padding inside the row-parallel path
xb = jnp.asarray(rng.standard_normal((4, 512)), jnp.bfloat16)
check("fp8_block bf16 row", layer("fp8_block", 512, 512, xb), xb, "row")
# bf16 x, float32 output (a layer promoting x with float32 parameters: x stays bf16, out_dtype)
promoting = layer("nvfp4_a16", 512, 512, xb)
promoting.promote = jnp.float32
check("nvfp4_a16 bf16 x float32 out, column", promoting, xb, "column")
check("nvfp4_a16 bf16 x float32 out, row", promoting, xb, "row")

# fused weight whose parts end in partial blocks: rows map back through segments
parts = [jqlin.quantize(jnp.asarray(weight(130, 512), jnp.float32), "fp8_block") for _ in range(2)]
fused = QuantDense.from_quantized(jqlin.fuse(parts))
assert fused.segments
check("fused fp8_block column (segments)", fused, x, "column")
check("fused fp8_block row (segments)", fused, x, "row")

# a mesh built the classic way (Auto axes) and a layer inside a jitted NNX model
auto = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
check("mxfp8 column, Auto-axis mesh", layer("mxfp8", 512, 512, x), x, "column", mesh=auto)
check("nvfp4 row, Auto-axis mesh", layer("nvfp4", 512, 512, x), x, "row", mesh=auto)

# Deterministic column shards are bitwise the unsharded layer. The det heuristics size split_k
# by N (programs per SM); with 4 "SMs" a 128-row shard would pick another K split than the
# 512-row layer, so this only passes because the shards resolve their configs for all 512 rows.
import pallas_kernels.fp8_heuristics as fp8_h  # noqa: E402
import pallas_kernels.fp8_paths as fp8_paths  # noqa: E402
import pallas_kernels.mx_heuristics as mx_h  # noqa: E402
fp8_h.num_sms = mx_h.num_sms = lambda: 4
# The Mosaic GPU interpreter cannot run on several devices at once (one device's end-of-kernel
# check sees another's barriers), and a float32 x runs as bf16 rows, which the interpreter would
# give the Mosaic W8A16 kernel: these checks run the Triton kernels' schedules (tests/models/
# tp_check.py checks the Mosaic kernels' row-parallel schedule on GPUs).
fp8_paths.mosaic_wgmma_ok = lambda interpret: False
for fmt, kernel, k in [("fp8_per_channel_a16", "pallas_fp8_w8a16", 1024),
                       ("nvfp4_a16", "pallas_nvfp4", 2048)]:
    heuristic = (lambda n, kk: fp8_h.w8a16_heuristic(None, n, kk, per_block=False)
                 if fmt.startswith("fp8") else mx_h.dequant_heuristic(None, n, kk, elem_bits=4,
                                                                       group=16))
    assert heuristic(128, k).split_k != heuristic(512, k).split_k, fmt  # the check has teeth
    xk = jnp.asarray(rng.standard_normal((2, 3, k)), jnp.float32)  # bf16 output hides ulps
    qd = layer(fmt, 512, k, xk)
    call = dict(kernel=kernel, deterministic=True)
    ref = np.asarray(qd(xk, **call))
    sharded = nnx.clone(qd)
    sharded.shard(mesh, "column", "model", batch_axis="data")
    got = np.asarray(sharded(xk, **call))
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), fmt
    print(f"ok {fmt} column deterministic {kernel}: bitwise (shard N 128 of 512)")

# Deterministic row-parallel layers on the Pallas kernels are bitwise the unsharded layer:
# each device runs its splits of the unsharded K schedule and the split partials of all devices
# are added in split order. K=2048 gives 4 splits, 2 per device: a psum would add
# (s0 + s1) + (s2 + s3) instead of ((s0 + s1) + s2) + s3, and NVFP4's global scale would come
# before the sum -- float32 outputs show those last bits (the fallback fails these checks).
import warnings  # noqa: E402
fp8_h.num_sms = mx_h.num_sms = lambda: 132  # the real heuristics again
mesh2 = jax.make_mesh((4, 2), ("data", "model"))
x2048 = jnp.asarray(rng.standard_normal((2, 3, 2048)), jnp.float32)


def row_bitwise(fmt, kernel, tp_mesh, x_dtype=jnp.float32, n=256):
    xk = x2048.astype(x_dtype)
    qd = layer(fmt, n, 2048, x2048)
    call = dict(kernel=kernel, deterministic=True)
    ref = np.asarray(qd(xk, **call))
    sharded = nnx.clone(qd)
    sharded.shard(tp_mesh, "row", "model", batch_axis="data")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "row-parallel")  # the bitwise path: no fallback
        got = np.asarray(sharded(xk, **call))
    assert got.dtype == ref.dtype and np.array_equal(got, ref), (fmt, tp_mesh.shape)
    assert np.isfinite(ref.astype(np.float32)).all() and np.abs(ref.astype(np.float32)).max() > 0
    print(f"ok {fmt} row deterministic {kernel} over {tp_mesh.shape['model']}: bitwise "
          f"({jnp.dtype(x_dtype).name} x)")


for fmt, kernel in [("fp8_per_channel_a16", "pallas_fp8_w8a16"),
                    ("fp8_block_a16", "pallas_fp8_w8a16"), ("nvfp4_a16", "pallas_nvfp4"),
                    ("nvfp4", "pallas_nvfp4"), ("mxfp8", "pallas_mxfp8"),
                    # fp8 x fp8: one program sums K in 8 parts; a device runs its 4 as splits
                    ("fp8_ptpc", "pallas_fp8_w8a8"), ("fp8_block", "pallas_fp8_block")]:
    row_bitwise(fmt, kernel, mesh2)
row_bitwise("fp8_per_channel_a16", "pallas_fp8_w8a16", mesh)  # 4 K-slices of the 4 splits
row_bitwise("mxfp8_a16", "pallas_mxfp8", mesh2, x_dtype=jnp.bfloat16)  # a model's activations

# Where the deterministic schedule has fewer K splits than devices (K=256: two K-steps, one
# split), or the kernel is the XLA one, the row-parallel sum stays a psum: warned.
for fmt, kernel, k, why in [("fp8_per_channel_a16", "pallas_fp8_w8a16", 256, "1 split"),
                            ("fp8_per_channel_a16", "xla", 512, "cannot run a K-slice")]:
    xk = x2048[..., :k]
    qd = layer(fmt, 256, k, xk)
    sharded = nnx.clone(qd)
    sharded.shard(mesh2, "row", "model", batch_axis="data")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = np.asarray(sharded(xk, kernel=kernel, deterministic=True))
    msgs = [str(w.message) for w in caught]
    assert any(why in msg and "all-reduced" in msg for msg in msgs), (fmt, msgs)
    ref = np.asarray(qd(xk, kernel=kernel, deterministic=True))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max(), err_msg=fmt)
    print(f"ok {fmt} row deterministic {kernel}: psum with a warning ({why})")

# shard boundaries inside a scale tile are errors
blk = layer("fp8_block", 256, 256, x[..., :256])
expect_error("block rows split", lambda: nnx.clone(blk).shard(mesh, "column", "model"), "128-row scale block")
expect_error("block cols split", lambda: nnx.clone(blk).shard(mesh, "row", "model"), "block of 128")
grp = layer("nvfp4_a16", 64, 160, x[..., :160])
expect_error("nvfp4 groups split", lambda: nnx.clone(grp).shard(mesh, "row", "model"), "group of 16")
expect_error("bad mode", lambda: nnx.clone(grp).shard(mesh, "diagonal", "model"), "mode")
expect_error("bad axis", lambda: nnx.clone(grp).shard(mesh, "column", "tensor"), "no axis")
print("ALL OK")
sys.exit(0)
