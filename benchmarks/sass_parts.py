"""SASS of the Mosaic W8A16 kernel's 128-row x-tile launches: default mode's one K range
(k_parts=1) against deterministic mode's in-CTA parts (one left fold of 2 or 8 parts, and the
two-group order's parked first half) -- where each one spills and what its main loop executes
(session 16, NOTES.md item 0000 of session 15). Run on the GPU machine:

    PYTHONPATH=. python3 benchmarks/sass_parts.py --out DIR          # compile, ptxas, cuobjdump
    python3 benchmarks/sass_parts.py --summary DIR                   # anywhere: per-loop counts

Each variant compiles in a process of its own with MOSAIC_GPU_DUMP_PTX / MOSAIC_GPU_DUMP_TO
set; its PTX goes through the machine's ptxas (-v: registers, spills) and cuobjdump --dump-sass.
The summary finds each kernel's loops (backward branches) and counts, per loop, the
instructions by opcode: the compute warpgroups' K loop is the one holding HGMMA.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys

VARIANTS = {  # name: fp8_block_a16_matmul_mgpu settings at M=4096, 8192x8192, 128-row x tiles
    # (a --only list picks some)
    "p1": dict(),
    "p2": dict(k_parts=2),
    "p8": dict(k_parts=8),
    "p8g2": dict(k_parts=8, k_groups=2),
    "p1h": dict(wgmma_halves=True),
    "p8h": dict(k_parts=8, wgmma_halves=True),
    "p8g2h": dict(k_parts=8, k_groups=2, wgmma_halves=True),
    # the group kernels (group_a16_mgpu) at the same size: default mode's launch and
    # deterministic mode's (the two-group park)
    "nvfp4_p1": dict(fmt="nvfp4"),
    "nvfp4_det": dict(fmt="nvfp4", deterministic=True),
    "mxfp8_det": dict(fmt="mxfp8", deterministic=True),
    # ... and with the group decode's halves (prepared in session 16)
    "nvfp4_det_h": dict(fmt="nvfp4", deterministic=True, wgmma_halves=True),
    "mxfp8_det_h": dict(fmt="mxfp8", deterministic=True, wgmma_halves=True),
}


def compile_one(name: str) -> None:
    import jax
    import jax.numpy as jnp
    from pallas_kernels.fp8_block_a16_mgpu import fp8_block_a16_matmul_mgpu
    m, n, k = 4096, 8192, 8192
    x = jnp.ones((m, k), jnp.bfloat16)
    w = jnp.ones((n, k), jnp.float8_e4m3fn)
    ws = jnp.ones((n // 128, k // 128), jnp.float32)
    p = dict(VARIANTS[name])
    if "fmt" in p:  # codes and scales of the format, as group_a16_matmul_mgpu takes them
        from pallas_kernels.group_a16_mgpu import group_a16_matmul_mgpu
        fmt = p.pop("fmt")
        e2m1 = fmt != "mxfp8"
        w = jnp.ones((n, k // 2), jnp.uint8) if e2m1 else w
        group = 16 if fmt == "nvfp4" else 32
        ws = (jnp.ones((n, k // group), jnp.float8_e4m3fn) if fmt == "nvfp4" else
              jnp.full((n, k // group), 127, jnp.uint8))
        extra = dict(post="mul", col_scale=jnp.ones((n,), jnp.float32)) if fmt == "nvfp4" else {}
        f = jax.jit(lambda x, w, ws: group_a16_matmul_mgpu(fmt, x, w, ws, **extra, **p))
    else:
        f = jax.jit(lambda *a: fp8_block_a16_matmul_mgpu(*a, block_m=128, **p))
    jax.block_until_ready(f(x, w, ws))


def build(out: str, names: list[str]) -> int:
    os.makedirs(out, exist_ok=True)
    for name in names:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        env = {**os.environ, "MOSAIC_GPU_DUMP_PTX": "1", "MOSAIC_GPU_DUMP_PTXAS": "1",
               "MOSAIC_GPU_DUMP_SASS": "1", "MOSAIC_GPU_DUMP_TO": d}
        r = subprocess.run([sys.executable, __file__, "--compile", name], env=env,
                           capture_output=True, text=True)
        with open(os.path.join(d, "compile.log"), "w") as f:
            f.write(r.stdout + r.stderr)
        print(f"== {name} rc={r.returncode}", flush=True)
        for line in (r.stdout + r.stderr).splitlines():
            if "ptxas" in line or "spill" in line or "rror" in line:
                print("  ", line[:200])
        for ptx in glob.glob(os.path.join(d, "**", "*.ptx"), recursive=True):
            cubin = ptx[:-4] + ".cubin"
            arch = re.search(r"\.target\s+(sm_\w+)", open(ptx).read())
            r = subprocess.run(["ptxas", f"-arch={arch.group(1) if arch else 'sm_90a'}", "-O3",
                                "-v", ptx, "-o", cubin], capture_output=True, text=True)
            print("   ptxas", os.path.basename(ptx), r.returncode, r.stderr.strip()[-400:])
            if r.returncode == 0:
                sass = subprocess.run(["cuobjdump", "--dump-sass", cubin], capture_output=True,
                                      text=True)
                with open(cubin[:-6] + ".sass", "w") as f:
                    f.write(sass.stdout + sass.stderr)
    print(json.dumps({n: sorted(os.path.relpath(p, out) for p in glob.glob(
        os.path.join(out, n, "**", "*"), recursive=True)) for n in names}, indent=1))
    return 0


_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def parse(path: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of every instruction in a cuobjdump SASS listing."""
    out = []
    for line in open(path):
        mt = _INSN.search(line)
        if mt:
            out.append((int(mt.group(1), 16), mt.group(3), mt.group(4).strip()))
    return out


def loops(insns: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """(start, end) address ranges of backward branches: the loops."""
    res = []
    for addr, op, args in insns:
        if op.startswith("BRA"):
            mt = re.search(r"0x([0-9a-f]+)", args)
            if mt and int(mt.group(1), 16) <= addr:
                res.append((int(mt.group(1), 16), addr))
    return res


def summary(out: str) -> None:
    for name in VARIANTS:
        for sass in sorted(glob.glob(os.path.join(out, name, "**", "*.sass"), recursive=True)):
            insns = parse(sass)
            total = collections.Counter(op.split(".")[0] for _, op, _ in insns)
            print(f"== {name} {os.path.relpath(sass, out)}: {len(insns)} instructions; "
                  f"STL {total['STL']} LDL {total['LDL']} HGMMA {total['HGMMA']}")
            for lo, hi in loops(insns):
                body = [op.split(".")[0] for a, op, _ in insns if lo <= a <= hi]
                c = collections.Counter(body)
                if not c["HGMMA"] and not c["STL"] and not c["LDL"] and len(body) < 40:
                    continue
                top = ", ".join(f"{op} {n}" for op, n in c.most_common(14))
                print(f"  loop {lo:#x}-{hi:#x}: {len(body)} insns; STL {c['STL']} LDL "
                      f"{c['LDL']} HGMMA {c['HGMMA']}; {top}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out")
    p.add_argument("--summary")
    p.add_argument("--compile", choices=sorted(VARIANTS))
    p.add_argument("--only", help="comma-separated variants (default: all)")
    a = p.parse_args()
    if a.compile:
        compile_one(a.compile)
        return 0
    if a.summary:
        summary(a.summary)
        return 0
    return build(a.out, a.only.split(",") if a.only else list(VARIANTS))


if __name__ == "__main__":
    raise SystemExit(main())
