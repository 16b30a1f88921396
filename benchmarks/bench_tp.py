"""Tensor-parallel Llama on 1 vs N GPUs (issue 8): forward of M tokens, one run, side by side.

A random Llama-3-8B-shaped model (hidden 4096, 14336 intermediate, 32 heads / 8 KV heads),
every Linear but lm_head quantized online; timed as a 1-layer model ("one decoder layer" plus
embedding and lm_head) and deeper ones (`--layers 1,32`: the 8B "model step"), at M in
{1, 16, 256} tokens, on one device and tensor-parallel over N devices in each `--styles` layout
("megatron", "column"); each row also records whether deterministic logits are bitwise those of
one device.

    PYTHONPATH=. python benchmarks/bench_tp.py --out tp.json          # on the GPU machine
    PYTHONPATH=. python benchmarks/bench_tp.py --small                # CPU smoke run
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

import jqlin
from jqlin import bench
from jqlin.models.llama import Llama, LlamaConfig
from jqlin.models.parallel import shard_model

_IDS = itertools.count()


def build(cfg: LlamaConfig, fmt: str) -> Llama:
    model = Llama(cfg, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
    jqlin.quantize_model(model, [("lm_head", None), ("*", fmt)])
    return model


_FORWARDS: dict = {}


def forward(model: Llama, deterministic: bool = False):
    """(name, f): the model's forward jitted once per (model, mode) and kept -- the timings and
    the checks of one row share its compile. The module is split once and merged inside the
    jitted function: no NNX graph walk per call."""
    key = (id(model), deterministic)
    if key not in _FORWARDS:
        graphdef, state = nnx.split(model)
        name = f"tp_forward_{next(_IDS)}"

        def fwd(s, x):
            return nnx.merge(graphdef, s)(x, deterministic=deterministic)
        fwd.__name__ = fwd.__qualname__ = name
        f = jax.jit(fwd)
        _FORWARDS[key] = (model, name, lambda x: f(state, x))  # (the model kept alive: id)
    return _FORWARDS[key][1:]


def forget(model: Llama) -> None:
    """Drop the model's kept forwards (and with them the model's weights)."""
    for key in [key for key in _FORWARDS if key[0] == id(model)]:
        del _FORWARDS[key]


def timed(model: Llama, ids: np.ndarray, reps: int, calls: int = 10,
          deterministic: bool = False) -> tuple[float, float]:
    """(wall, device) seconds per forward. Wall: `calls` jitted forwards dispatched back to back,
    median over `reps` samples -- at small M this is host dispatch, not the GPUs. Device (GPUs
    only): CUPTI kernel time of the forward's module per call, the busiest device's sum (NCCL
    kernels included, so waiting for a peer counts)."""
    name, f = forward(model, deterministic)
    jax.block_until_ready(f(ids))
    on_gpu = jax.default_backend() == "gpu"
    trace_dir = tempfile.mkdtemp(prefix="jqlin_tp_") if on_gpu else None
    if trace_dir:
        jax.profiler.start_trace(trace_dir)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready([f(ids) for _ in range(calls)])
        times.append((time.perf_counter() - t0) / calls)
    device = float("nan")
    if trace_dir:
        jax.profiler.stop_trace()
        per = bench.device_seconds(trace_dir, per_device=True)
        busiest = [t for (plane, mod), t in per.items() if mod == f"jit_{name}"]
        if busiest:
            device = max(busiest) / (reps * calls)
        shutil.rmtree(trace_dir, ignore_errors=True)
    return statistics.median(times), device


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--format", default="fp8_block")
    ap.add_argument("--layers", default="1,4",
                    help="comma list of model depths to time (1: one decoder layer)")
    ap.add_argument("--devices", type=int, default=len(jax.devices()))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--calls", type=int, default=10,
                    help="jitted forwards dispatched back to back per sample")
    ap.add_argument("--m", default="1,16,256", help="comma list of token counts")
    ap.add_argument("--styles", default="megatron,column", help="shard_model styles to time")
    ap.add_argument("--det", action="store_true",
                    help="also time the deterministic forward (row-parallel: split partials "
                         "gathered and added in order, where the layer allows)")
    ap.add_argument("--small", action="store_true", help="tiny shapes for a CPU smoke run")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shape = (dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64) if args.small else
             dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128))
    rows = []
    n = args.devices
    mesh = Mesh(np.array(jax.devices()[:n]), ("tp",))
    styles = args.styles.split(",")
    def save() -> None:  # after every row: a time box that cuts the run keeps what it measured
        if args.out:
            meta = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, devices=n,
                        shape=shape, styles=styles, timing=f"wall: per jitted forward, {args.calls} "
                        "dispatched back to back, median of reps; device: CUPTI kernel time per "
                        "forward of the busiest GPU", rows=rows)
            with open(args.out + ".tmp", "w") as fh:
                json.dump(meta, fh, indent=1)
            os.replace(args.out + ".tmp", args.out)

    for layers in sorted({int(v) for v in args.layers.split(",")}):
        cfg = LlamaConfig(num_hidden_layers=layers, **shape)
        single = build(cfg, args.format)
        ids_by_m = {m: np.random.default_rng(m).integers(3, cfg.vocab_size, (1, m)).astype(np.int32)
                    for m in (int(v) for v in args.m.split(","))}
        one = {m: timed(single, ids, args.reps, args.calls) for m, ids in ids_by_m.items()}
        one_det = {m: timed(single, ids, args.reps, args.calls, deterministic=True)
                   for m, ids in ids_by_m.items()} if args.det else {}
        for style in styles:
            tp = build(cfg, args.format)
            layout = shard_model(tp, mesh, "tp", style=style)
            for m, ids in ids_by_m.items():
                (t1, d1), (tn, dn) = one[m], timed(tp, ids, args.reps, args.calls)
                ref, out = forward(single)[1](ids), forward(tp)[1](ids)
                err = float(jnp.linalg.norm(ref - out) / jnp.linalg.norm(ref))
                det = bool(np.array_equal(np.asarray(forward(single, True)[1](ids)),
                                          np.asarray(forward(tp, True)[1](ids))))
                rows.append(dict(layers=layers, m=m, devices=n, format=args.format, style=style,
                                 t1_us=t1 * 1e6, tn_us=tn * 1e6, speedup=t1 / tn,
                                 device_t1_us=d1 * 1e6, device_tn_us=dn * 1e6,
                                 device_speedup=d1 / dn, rel_err_vs_1=err, det_bitwise=det,
                                 modes=sorted(set(layout.values()))))
                if args.det:
                    (_, d1d), (_, dnd) = one_det[m], timed(tp, ids, args.reps, args.calls,
                                                           deterministic=True)
                    rows[-1].update(device_t1_det_us=d1d * 1e6, device_tn_det_us=dnd * 1e6,
                                    device_speedup_det=d1d / dnd)
                    print(f"   deterministic device: {d1d * 1e6:9.1f} / {dnd * 1e6:9.1f} us "
                          f"({d1d / dnd:5.2f}x)", flush=True)
                print(f"layers={layers} {style:8s} M={m:<4} wall: 1 device {t1 * 1e6:9.1f} us, "
                      f"{n} devices {tn * 1e6:9.1f} us ({t1 / tn:5.2f}x); device: "
                      f"{d1 * 1e6:9.1f} / {dn * 1e6:9.1f} us ({d1 / dn:5.2f}x); rel.err {err:.1e}"
                      f" det bitwise {det}", flush=True)
                save()
            forget(tp)
            del tp
        forget(single)
        del single
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
