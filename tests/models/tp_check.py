"""Run by test_parallel.py (CPU, 8 host devices) and by benchmarks/bench_tp.py's check on GPUs:
a Llama loaded from a quantized checkpoint, tensor-parallel vs one device."""

import collections
import functools
import os
import re
import sys
import warnings

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jqlin.models import llama
from jqlin.models.parallel import shard_model


@nnx.jit(static_argnames=("deterministic",))
def forward(model, ids, deterministic: bool = False):
    """The model's logits, jitted: called eagerly a forward compiles every op on its own (on
    CPU most of this script's time)."""
    return model(ids, deterministic=deterministic)


@functools.cache
def one_device(fixture: str) -> tuple[np.ndarray, ...]:
    """The fixture's input ids and its one-device deterministic logits, default logits and
    greedy tokens (computed once: a fixture checked in several styles shares them)."""
    ids = np.load(os.path.join(fixture, "reference", "input_ids.npy"))
    base = llama.from_checkpoint(fixture)
    det_ref = np.asarray(forward(base, ids, deterministic=True))
    ref = np.asarray(forward(base, ids))
    toks_ref = np.asarray(base.generate(ids[:1], 6, deterministic=True).tokens)
    return ids, det_ref, ref, toks_ref


def check(fixture: str, style: str, n: int) -> None:
    ids, det_ref, ref, toks_ref = one_device(fixture)
    model = llama.from_checkpoint(fixture)
    mesh = Mesh(np.array(jax.devices()[:n]), ("tp",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layout = shard_model(model, mesh, "tp", style=style)
    # the fixtures have 5 query heads and 1 key/value head: megatron cuts them and says so
    said = any("do not divide over" in str(w.message) for w in caught)
    assert said == (style == "megatron" and n > 1), (style, [str(w.message) for w in caught])
    det = np.asarray(forward(model, ids, deterministic=True))
    out = np.asarray(forward(model, ids))
    rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    name = os.path.basename(fixture.rstrip("/"))
    rows = sorted(set(layout.values()))
    tokens = ""
    if style == "column":  # (the tokens are a promise of the column layout only: generated
        # there, not for megatron, whose generate compile was a tenth of test_parallel's time)
        assert np.array_equal(det, det_ref), f"{name} column: deterministic logits differ"
        toks = np.asarray(model.generate(ids[:1], 6, deterministic=True).tokens)
        assert np.array_equal(toks, toks_ref), f"{name} column: tokens differ"
        tokens = " tokens_equal=True"
    # default mode: row-parallel sums and XLA strategies move last bits, and a moved bit can
    # flip a dynamic activation code: close, not bitwise
    assert rel < 1e-4, f"{name} {style}: rel {rel}"
    print(f"ok {name} style={style} devices={n} modes={rows} rel={rel:.2e} "
          f"det_bitwise={np.array_equal(det, det_ref)}{tokens}")


def check_layer_bitwise(fmt: str, n: int, shape: tuple[int, int] = (6144, 4096)) -> None:
    """One Llama-3-8B-sized QuantDense, column-parallel over n devices, deterministic: bitwise
    the one-device layer at M in {1, 7}. At this N a shard's own N would give the det heuristics
    another split_k than the whole layer's (jqlin.nn.sharding resolves them for all N)."""
    import jax.numpy as jnp

    import jqlin
    from jqlin.nn import QuantDense
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    qd = QuantDense.from_quantized(jqlin.quantize(w, fmt))
    sharded = nnx.clone(qd)
    sharded.shard(Mesh(np.array(jax.devices()[:n]), ("tp",)), "column", "tp")
    for m in (1, 7):  # float32 activations: a bf16 output would round most differences away
        x = jnp.asarray(rng.standard_normal((m, shape[1])), jnp.float32)
        ref = np.asarray(qd(x, deterministic=True))
        got = np.asarray(sharded(x, deterministic=True))
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), \
            f"{fmt} column det M={m}: max diff {np.abs(got - ref).max()}"
    print(f"ok {fmt} {shape} column deterministic devices={n}: bitwise at M=1, 7")


def check_prefill_column(fmt: str, n: int, m: int = 300, shape: tuple[int, int] = (6144, 4096)
                         ) -> None:
    """Default mode at a prefill size (on sm_90 the Mosaic GPU kernels: fp8_block's from 256
    rows), column-parallel inside shard_map: each device's columns bitwise the one-device
    layer's (a column's sum never sees the others). GPU only, like check_row_bitwise."""
    import jax.numpy as jnp

    import jqlin
    from jqlin.nn import QuantDense
    rng = np.random.default_rng(4)
    qd = QuantDense.from_quantized(jqlin.quantize(
        jnp.asarray(rng.standard_normal(shape), jnp.float32), fmt))
    sharded = nnx.clone(qd)
    sharded.shard(Mesh(np.array(jax.devices()[:n]), ("tp",)), "column", "tp")
    x = jnp.asarray(rng.standard_normal((m, shape[1])), jnp.bfloat16)
    ex = qd.explain(x)
    chosen = f"{ex.chosen}: {(ex.detail or {}).get('path', '')}"
    ref, got = np.asarray(qd(x).astype(jnp.float32)), np.asarray(sharded(x).astype(jnp.float32))
    assert np.array_equal(got, ref), f"{fmt} column M={m}: max diff {np.abs(got - ref).max()}"
    print(f"ok {fmt} {shape} column default devices={n}: bitwise at M={m} ({chosen[:120]})")


def check_row_bitwise(fmt: str, n: int, shape: tuple[int, int] = (4096, 14336)) -> None:
    """A Llama-3-8B down_proj-sized QuantDense, row-parallel (K split) over n devices,
    deterministic: bitwise the one-device layer at M in {1, 7, 64}. Each device runs its splits
    of the unsharded K schedule; the split partials of all devices are summed in split order
    (pallas_kernels.k_shards). GPU only: on CPU the kernel would be the XLA one."""
    import jax.numpy as jnp

    import jqlin
    from jqlin.nn import QuantDense
    rng = np.random.default_rng(2)
    w = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    act = jqlin.formats.get(fmt).activation  # static (global) activation scales: calibrate
    static = act is not None and (not act.dynamic or act.global_scale is not None)
    calib = jnp.asarray(rng.standard_normal((16, shape[1])), jnp.float32) if static else None
    qd = QuantDense.from_quantized(jqlin.quantize(w, fmt, calibration=calib))
    sharded = nnx.clone(qd)
    sharded.shard(Mesh(np.array(jax.devices()[:n]), ("tp",)), "row", "tp")
    for m in (1, 7, 64):  # float32 activations: a bf16 output would round most differences away
        x = jnp.asarray(rng.standard_normal((m, shape[1])), jnp.float32)
        ref = np.asarray(qd(x, deterministic=True))
        with warnings.catch_warnings():
            warnings.filterwarnings("error", "row-parallel")  # no fallback to the all-reduce
            got = np.asarray(sharded(x, deterministic=True))
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), \
            f"{fmt} row det M={m}: max diff {np.abs(got - ref).max()}"
    print(f"ok {fmt} {shape} row deterministic devices={n}: bitwise at M=1, 7, 64")


def twin_models(cfg, fmt: str):
    """Two identical random Llamas of `cfg` in bf16, every Linear but lm_head quantized to fmt
    (one stays on one device, the other gets sharded)."""
    import jax.numpy as jnp

    import jqlin
    from jqlin.models.llama import Llama
    models = []
    for _ in range(2):
        m = Llama(cfg, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
        jqlin.quantize_model(m, [("lm_head", None), ("*", fmt)])
        models.append(m)
    return models


def check_megatron_bitwise(fmt: str, n: int) -> None:
    """A random Llama (heads divide over the devices) in the megatron layout, deterministic:
    logits and greedy tokens bitwise those of one device. GPU only, as check_row_bitwise."""
    from jqlin.models.llama import LlamaConfig
    cfg = LlamaConfig(num_hidden_layers=2, vocab_size=512, hidden_size=2048,
                      intermediate_size=4096, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=128)
    base, model = twin_models(cfg, fmt)
    layout = shard_model(model, Mesh(np.array(jax.devices()[:n]), ("tp",)), "tp",
                         style="megatron")
    assert "row" in layout.values()
    ids = np.random.default_rng(3).integers(3, cfg.vocab_size, (1, 7)).astype(np.int32)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "row-parallel")  # no fallback to the all-reduce
        det = np.asarray(forward(model, ids, deterministic=True))
        toks = np.asarray(model.generate(ids, 6, deterministic=True).tokens)
    ref = np.asarray(forward(base, ids, deterministic=True))
    toks_ref = np.asarray(base.generate(ids, 6, deterministic=True).tokens)
    assert np.array_equal(det, ref), f"{fmt} megatron det: max diff {np.abs(det - ref).max()}"
    assert np.array_equal(toks, toks_ref), f"{fmt} megatron det tokens differ"
    print(f"ok {fmt} megatron deterministic devices={n}: logits and tokens bitwise")


def check_collectives(fmt: str, n: int) -> None:
    """Megatron layout of a random Llama: per layer exactly the two all-reduces of o_proj and
    down_proj (fused q/k/v and gate/up interleaved per shard, so splitting their outputs moves
    nothing), and logits close to one device."""

    from jqlin.models.llama import LlamaConfig
    cfg = LlamaConfig(num_hidden_layers=2, vocab_size=256, hidden_size=512, intermediate_size=512,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=64)
    base, model = twin_models(cfg, fmt)
    mesh = Mesh(np.array(jax.devices()[:n]), ("tp",))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shard_model(model, mesh, "tp", style="megatron")
    assert not any("do not divide over" in str(w.message) for w in caught)  # 8 / 4 heads
    ids = np.arange(3, 10, dtype=np.int32)[None, :]
    graphdef, state = nnx.split(model)
    hlo = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)).lower(state, ids).compile().as_text()
    ops = collections.Counter(re.findall(
        r"= \S+ (all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter)(?:-start)?\(",
        hlo))
    assert ops == {"all-reduce": 2 * cfg.num_hidden_layers}, f"{fmt}: collectives {dict(ops)}"
    # (eager, as the bound was set: jitted, XLA's CPU fusions move last bf16 bits, and on this
    # random model flipped dynamic e4m3 activation codes then move fp8_block's logits by
    # 2.9e-2 against one device, jitted too -- the same model eager vs jitted: 4.3e-2)
    ref, out = np.asarray(base(ids)), np.asarray(model(ids))
    rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    assert rel < 1e-3, f"{fmt}: megatron rel {rel}"  # CPU: 1.8e-4 (fp8_block), 0 (mxfp8)
    print(f"ok collectives {fmt} devices={n} {dict(ops)} rel={rel:.1e}")


def check_mosaic_row_bitwise(n: int, shape: tuple[int, int] = (4096, 14336)) -> None:
    """The Mosaic GPU W8A16 kernel's deterministic schedule row-parallel over n devices: each
    device runs its K ranges of the unsharded P parts (fp8_block_a16_mgpu.det_params), the
    partials are gathered and added in order -- bitwise the one-device product (float32
    output) at M in {1, 7, 64, 300}, where the one-device launch is ranges or in-CTA parts."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from pallas_kernels import k_shards
    from pallas_kernels.fp8_block_a16_mgpu import fp8_block_a16_matmul_mgpu, launch_params
    rng = np.random.default_rng(3)
    rows, k = shape
    w = jnp.asarray(rng.standard_normal(shape) * 4, jnp.float8_e4m3fn)
    ws = jnp.asarray(rng.uniform(0.01, 2, (rows // 128, k // 128)), jnp.float32)
    mesh = Mesh(np.array(jax.devices()[:n]), ("tp",))

    def run(x, w, ws):
        params = launch_params(x.shape[0], rows, w.shape[1], False, deterministic=True)
        return fp8_block_a16_matmul_mgpu(x, w, ws, out_dtype=jnp.float32, **params)

    def local(x, w, ws):
        with k_shards("tp", n):
            return run(x, w, ws)

    sharded = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(None, "tp"),) * 3,
                                    out_specs=P(), check_vma=False))
    for m in (1, 7, 64, 300):
        x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        ref = np.asarray(jax.jit(run)(x, w, ws))
        got = np.asarray(sharded(x, w, ws))
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), \
            f"mosaic W8A16 row det M={m}: max diff {np.abs(got - ref).max()}"
    print(f"ok mosaic W8A16 {shape} row deterministic devices={n}: bitwise at M=1, 7, 64, 300")


GROUPS = ("fixtures", "column", "row", "megatron", "collectives")

if __name__ == "__main__":
    fixtures = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else len(jax.devices())
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else GROUPS  # e.g. "megatron,collectives"
    if not set(only) <= set(GROUPS):
        raise SystemExit(f"tp_check: groups must be among {GROUPS}, got {only}")
    gpu = jax.default_backend() == "gpu"  # row / megatron: the Pallas kernels (interpret-mode
    if "fixtures" in only:                # twin on CPU: sharding_check)
        check(os.path.join(fixtures, "ct_fp8_dynamic"), "column", n)
        check(os.path.join(fixtures, "ct_mxfp8"), "megatron", n)
        check(os.path.join(fixtures, "ct_mxfp8"), "column", n)
        check(os.path.join(fixtures, "modelopt_nvfp4"), "column", n)
    if "column" in only:  # (on CPU every kernel is the XLA one: the sharding, not the
        # Pallas heuristics, is what is checked, at a smaller layer)
        for fmt in ("fp8_per_channel_a16", "fp8_block", "nvfp4_a16", "mxfp8"):
            check_layer_bitwise(fmt, n, *([] if gpu else [(1536, 1024)]))
    if "column" in only and gpu:
        for fmt in ("fp8_block", "fp8_block_a16"):
            check_prefill_column(fmt, n)
    if "row" in only and gpu:
        for fmt in ("fp8_per_channel_a16", "fp8_block_a16", "fp8_ptpc", "fp8_block",
                    "nvfp4_a16", "nvfp4", "mxfp8"):
            check_row_bitwise(fmt, n)
        check_mosaic_row_bitwise(n)
    if "megatron" in only and gpu:
        for fmt in ("fp8_per_channel_a16", "fp8_block", "nvfp4_a16", "mxfp8"):
            check_megatron_bitwise(fmt, n)
    if "collectives" in only:  # default mode: on sm_90 fp8_block_a16 runs the Mosaic W8A16 kernel
        for fmt in ("fp8_block", "mxfp8", "fp8_block_a16"):
            check_collectives(fmt, n)
    print("ALL OK")
