"""Tensor-parallel Llama on 1 vs N GPUs (issue 8): forward of M tokens, one run, side by side.

A random Llama-3-8B-shaped model (hidden 4096, 14336 intermediate, 32 heads / 8 KV heads),
every Linear but lm_head quantized online; timed as a 1-layer model ("one decoder layer" plus
embedding and lm_head) and a `--layers`-layer model ("model step"), at M in {1, 16, 256}
tokens, on one device and tensor-parallel ("megatron" layout) over N devices.

    PYTHONPATH=. python benchmarks/bench_tp.py --out tp.json          # on the GPU machine
    PYTHONPATH=. python benchmarks/bench_tp.py --small                # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

import jqlin
from jqlin.models.llama import Llama, LlamaConfig
from jqlin.models.parallel import shard_model


def build(cfg: LlamaConfig, fmt: str) -> Llama:
    model = Llama(cfg, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
    jqlin.quantize_model(model, [("lm_head", None), ("*", fmt)])
    return model


def timed(model: Llama, ids: np.ndarray, reps: int) -> float:
    f = nnx.jit(lambda m, x: m(x))
    f(model, ids).block_until_ready()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f(model, ids).block_until_ready()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--format", default="fp8_block")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--devices", type=int, default=len(jax.devices()))
    ap.add_argument("--reps", type=int, default=20)
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
    for layers in sorted({1, args.layers}):
        cfg = LlamaConfig(num_hidden_layers=layers, **shape)
        single, tp = build(cfg, args.format), build(cfg, args.format)
        layout = shard_model(tp, mesh, "tp", style="megatron")
        for m in (1, 16, 256):
            ids = np.random.default_rng(m).integers(3, cfg.vocab_size, (1, m)).astype(np.int32)
            t1, tn = timed(single, ids, args.reps), timed(tp, ids, args.reps)
            err = float(jnp.linalg.norm(single(ids) - tp(ids)) / jnp.linalg.norm(single(ids)))
            rows.append(dict(layers=layers, m=m, devices=n, format=args.format, t1_us=t1 * 1e6,
                             tn_us=tn * 1e6, speedup=t1 / tn, rel_err_vs_1=err,
                             modes=sorted(set(layout.values()))))
            print(f"layers={layers} M={m:<4} 1 device {t1 * 1e6:9.1f} us   {n} devices "
                  f"{tn * 1e6:9.1f} us   speedup {t1 / tn:5.2f}x   rel.err {err:.1e}", flush=True)
        del single, tp
    meta = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, devices=n,
                shape=shape, style="megatron", timing="median of wall time around a jitted "
                "forward incl. dispatch", rows=rows)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(meta, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
