"""Where do subnormal float32 scales get flushed? (session 47: tests/test_subnormal_scales.py
failed on an H100 for fp8_block_a16 / fp8_per_tensor_a16 / fp8_block at M=300 and fp8_per_tensor
at M=64, default mode: the output was zeros.)

For each FP8 format and M: the dispatcher's choice (explain), and the output's zero fraction
and worst error relative to float64 of the stored codes and scales, at weight scales
2^e for e in --exps (-126 is float32's least normal). With --dump DIR, one case (--case
name:M) runs in this process with Mosaic GPU's PTX and XLA's HLO dumped to DIR, and the PTX's
.ftz instructions and the optimized HLO's custom calls are counted (--summarize DIR).

Usage: python3 benchmarks/probe_subnormal.py [--m 1,8,16,64,300] [--exps -120,-126,-127,-135]
       python3 benchmarks/probe_subnormal.py --case fp8_per_tensor:64 --dump DIR (env set by caller)
       python3 benchmarks/probe_subnormal.py --summarize DIR
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import sys

FP8_NAMES = ["fp8_per_tensor_a16", "fp8_per_channel_a16", "fp8_block_a16", "fp8_per_tensor",
             "fp8_ptpc", "fp8_block"]


def run_case(name: str, m: int, exp: int, det: bool, n: int = 1024, k: int = 4096) -> dict:
    import jax.numpy as jnp
    import numpy as np

    import jqlin
    rng = np.random.default_rng(0)
    w = rng.standard_normal((n, k)).astype(np.float32)
    # every row's amax 448 * 2^exp: the per-row / per-block / per-tensor scale is ~2^exp
    w = (w / np.abs(w).max(axis=1, keepdims=True) * (448.0 * 2.0 ** exp)).astype(np.float32)
    cal = (rng.standard_normal((4, k)) * 2).astype(np.float32) if name == "fp8_per_tensor" else None
    qw = jqlin.quantize(w, name, calibration=cal)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    how = " | ".join(ln.strip() for ln in str(jqlin.explain(x, qw, deterministic=det)).splitlines()
                     if not ln.strip().startswith(("rejected", "spec:", "platform:")))
    y = np.asarray(jqlin.matmul(x, qw, deterministic=det).astype(jnp.float32), np.float64)
    yx = np.asarray(jqlin.matmul(x, qw, kernel="xla").astype(jnp.float32), np.float64)
    scale = np.asarray(qw.scale, np.float64)
    return {"format": name, "M": m, "exp": exp, "det": det, "explain": how[:300],
            "scale_min": float(scale.min()), "scale_max": float(scale.max()),
            "zeros": float(np.mean(y == 0)), "xla_zeros": float(np.mean(yx == 0)),
            "rel_to_xla": float(np.max(np.abs(y - yx)) / max(np.max(np.abs(yx)), 1e-300))}


def summarize(d: pathlib.Path) -> None:
    for p in sorted(d.rglob("*")):
        if not p.is_file():
            continue
        text = p.read_text(errors="replace")
        if p.suffix == ".ptx" or "ptx" in p.name:
            # each instruction once: any with .ftz, and the f32 multiplies / adds without it
            ops = [op for op in re.findall(r"\b([a-z][a-z0-9]*(?:\.[a-z0-9]+)+)\b", text)
                   if ".ftz" in op or re.fullmatch(r"(mul|fma|add)(\.rn)?\.f32", op)]
            print(f"{p.name}: {dict(sorted(collections.Counter(ops).items()))}")
        elif p.name.endswith("after_optimizations.txt"):
            calls = re.findall(r'custom_call_target="([^"]+)"', text)
            alphas = re.findall(r'"alpha_real":\s*([-0-9.e]+)', text)
            if calls:
                print(f"{p.name}: custom calls {sorted(set(calls))} alpha_real {alphas[:4]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default=",".join(FP8_NAMES))
    ap.add_argument("--m", default="1,8,16,64,300")
    ap.add_argument("--exps", default="-120,-126,-127,-135")
    ap.add_argument("--case", default=None, help="name:M, one case (with --dump)")
    ap.add_argument("--summarize", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.summarize:
        summarize(pathlib.Path(a.summarize))
        return 0
    if a.case:
        name, m = a.case.split(":")
        r = run_case(name, int(m), -135, False)
        print(json.dumps(r))
        return 0
    recs = []
    for name in a.formats.split(","):
        for m in map(int, a.m.split(",")):
            for exp in map(int, a.exps.split(",")):
                for det in (False, True):
                    r = run_case(name, m, exp, det)
                    recs.append(r)
                    print(f"{name:20s} M={m:4d} 2^{exp:5d} det={det!s:5s} zeros {r['zeros']:.3f} "
                          f"xla {r['xla_zeros']:.3f} rel {r['rel_to_xla']:.2e}  "
                          f"{r['explain'][:150]}", flush=True)
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(recs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
