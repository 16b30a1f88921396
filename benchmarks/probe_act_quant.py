"""Device time of activation quantization alone (session 31): jqlin.numerics.quantize_activation
on a bf16 (M, K) activation, per format, summed over the kernels XLA launches for it.

    PYTHONPATH=. python3 benchmarks/probe_act_quant.py --formats fp8_ptpc,fp8_block,nvfp4 \
        --m 1,16,4096 --k 4096,8192 [--plain-div] --out act_quant.json

--codes xla|pallas|pallas_group: FP8 formats through jqlin.kernels.pallas_fp8.quantize_x with
those codes (pallas: pallas_kernels.act_quant, the scales still XLA's; pallas_group, dynamic
1 x 128 groups only: act_quant.e4m3_group_codes, the scales in the pass too, session 40),
instead of quantize_activation;
NVFP4 / MX through pallas_fp4.nvfp4_activation_operand / mx_activation_operand with that operand
(pallas: the whole rule in one pass, act_quant.nvfp4_operand / mx_operand; session 32).
--div plain: the rules with XLA's own division in place of exact.div (on GPU not correctly
rounded: the cost of exactness is the difference); --div f64: float32 operands divided in
float64 and rounded back (exact: 53 >= 2 * 24 + 2 bits), measured against exact.div's integer
correction (session 31), and checked bitwise against NumPy on 4M pairs first.
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp

from jqlin import bench, formats
from jqlin.numerics import activations, quantize_activation


def _div_f64(a, b):
    a = jnp.asarray(a, jnp.float32)
    b = jnp.asarray(b, jnp.float32)
    with jax.enable_x64(True):
        return (a.astype(jnp.float64) / b.astype(jnp.float64)).astype(jnp.float32)


def _check_f64():
    import numpy as np
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(1 << 22) * np.exp2(rng.uniform(-40, 40, 1 << 22))).astype(np.float32)
    b = (rng.standard_normal(1 << 22) * np.exp2(rng.uniform(-40, 40, 1 << 22))).astype(np.float32)
    for name, got in [("elementwise", jax.jit(_div_f64)(a, b)),
                      ("broadcast", jax.jit(lambda a: _div_f64(a, b[:1]))(a))]:
        ref = a / (b if name == "elementwise" else b[:1])
        bad = int(np.sum(np.asarray(got).view(np.uint32) != ref.view(np.uint32)))
        print(f"f64 division vs NumPy ({name}): {bad} of {a.size} differ", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--formats", default="fp8_ptpc,fp8_block,fp8_per_tensor,nvfp4,mxfp4")
    p.add_argument("--m", default="1,16,4096")
    p.add_argument("--k", default="4096,8192")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--div", default="exact", choices=["exact", "plain", "f64"])
    p.add_argument("--codes", default="", choices=["", "xla", "pallas", "pallas_group"])
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    if args.div == "plain":
        activations.div = lambda a, b: jnp.asarray(a) / jnp.asarray(b, jnp.float32)
    elif args.div == "f64":
        activations.div = _div_f64
        _check_f64()
    records = []
    for name in args.formats.split(","):
        key = formats.get(name).activation
        scale = None if key.dynamic and key.global_scale is None else jnp.float32(0.37)
        for k in map(int, args.k.split(",")):
            fn = jax.jit(lambda x, s, key=key: quantize_activation(x, key, s))
            if args.codes and name.startswith(("nvfp4", "mx")):
                from jqlin.kernels import pallas_fp4
                operand = (pallas_fp4.nvfp4_activation_operand if name.startswith("nvfp4")
                           else pallas_fp4.mx_activation_operand)
                qw = bench._make_weight(jax.random.key(1), name, 256, k)
                fn = jax.jit(lambda x, s, qw=qw, key=key, operand=operand: operand(
                    x, qw, key, operand=args.codes))
            elif args.codes:
                from jqlin.kernels.pallas_fp8 import quantize_x
                qw = bench._make_weight(jax.random.key(1), name, 256, k)
                fn = jax.jit(lambda x, s, qw=qw: quantize_x(x, qw, qw.spec, codes=args.codes)[:2])
            for m in map(int, args.m.split(",")):
                x = jax.random.normal(jax.random.key(m * 7 + k), (m, k), jnp.bfloat16)
                jax.block_until_ready(fn(x, scale))
                per = bench.kernel_medians_us(fn, (x, scale), args.calls)
                rec = {"format": name, "M": m, "K": k, "div": args.div, "codes": args.codes,
                       "us": round(sum(per.values()), 2), "kernels": len(per),
                       "per_kernel": {n: round(v, 2) for n, v in per.items()}}
                records.append(rec)
                print(f"{name} M={m} K={k}: {rec['us']} us in {rec['kernels']} kernels", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "probe_act_quant.py " + " ".join(
                sys.argv[1:] if argv is None else argv),
                       "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    main()
