"""`python -m jqlin demo`: every registered format through the dispatcher, then a checkpoint demo.

Part 1 quantizes one random layer per format, runs it through kernel="auto" and prints the
kernel chosen, the error against the float matmul, and the time per call on this device.
Part 2 (when the Llama/checkpoint pieces are present) converts the small checkpoint shipped in
the repository, loads it into the reference Llama and generates a few tokens.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from . import formats
from .cli import positive_int
from .dispatch import explain, matmul
from .qweight import quantize

SHIPPED = pathlib.Path(__file__).resolve().parents[1] / "examples" / "tiny_llama_bf16"


def format_table(m: int = 16, n: int = 1024, k: int = 1024, seed: int = 0,
                 deterministic: bool = False) -> list[dict]:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * np.exp(0.5 * rng.standard_normal((n, 1)))).astype(np.float32)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    ref = np.asarray(x, np.float32) @ w.T
    rows = []
    for name in formats.names():
        qw = quantize(w, name, calibration=np.asarray(x, np.float32))
        f = jax.jit(lambda v, q: matmul(v, q, deterministic=deterministic))
        y = f(x, qw).block_until_ready()
        t0 = time.perf_counter()
        reps = 10
        for _ in range(reps):
            y = f(x, qw)
        y.block_until_ready()
        dt = (time.perf_counter() - t0) / reps
        err = np.linalg.norm(np.asarray(y, np.float32) - ref) / np.linalg.norm(ref)
        rows.append(dict(format=name, kernel=explain(x, qw, deterministic=deterministic).chosen,
                         rel_err=float(err), us=dt * 1e6, weight_bytes=qw.nbytes))
    return rows


def print_table(rows: list[dict], out=print) -> None:
    out(f"{'format':<20} {'kernel':<22} {'rel.err vs float':>16} {'us/call':>9} {'weight MiB':>10}")
    for r in rows:
        out(f"{r['format']:<20} {r['kernel']:<22} {r['rel_err']:>16.4f} {r['us']:>9.1f} "
            f"{r['weight_bytes'] / 2**20:>10.3f}")


def run(args: argparse.Namespace) -> int:
    dev = jax.devices()[0]
    print(f"jqlin demo on {dev.platform}: {dev.device_kind}; x bf16 ({args.m}, {args.k}), "
          f"W ({args.n}, {args.k}), kernel='auto', deterministic={args.deterministic}\n")
    if not pathlib.Path(args.checkpoint).is_dir():  # (said before part 1's minutes, not after)
        print(f"jqlin demo: error: --checkpoint {args.checkpoint}: not a directory",
              file=sys.stderr)
        return 2
    print_table(format_table(args.m, args.n, args.k, deterministic=args.deterministic))
    try:
        from .models.demo import run_llama_demo
    except ImportError as e:
        print(f"\n(checkpoint demo unavailable: {e})")
        return 0
    print()
    run_llama_demo(pathlib.Path(args.checkpoint), format=args.format)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="run every format through the dispatcher, then a small model")
    p.add_argument("--m", type=positive_int, default=16, help="activation rows (default 16)")
    p.add_argument("--n", type=positive_int, default=1024, help="out_features (default 1024)")
    p.add_argument("--k", type=positive_int, default=1024, help="in_features (default 1024)")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--checkpoint", default=str(SHIPPED),
                   help="checkpoint directory for the model demo (default: the shipped one)")
    p.add_argument("--format", default="fp8_block", choices=formats.names(),
                   help="format an unquantized checkpoint is converted to (default: fp8_block)")
    p.set_defaults(func=run)
