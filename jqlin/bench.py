"""Quantized-matmul benchmark: every format's chosen kernel vs bf16 `jnp.dot`, side by side.

The unit of work is a *case*: (shape (K, N), M, op). Ops are built from jqlin format names and
registered kernel names, so a new format or kernel appears here without code changes:
  bf16        x (M,K) bf16 @ W (N,K)^T bf16 (XLA / cuBLAS): the baseline of every speedup;
  xla_fp8     XLA's own fp8 x fp8 product (per-tensor scales, cuBLASLt) incl. activation cast;
  <kernel>    jqlin.matmul(x, qw, kernel=<kernel>, deterministic=...) for a format;
  xla         the jqlin XLA reference path (f32 dequantize + HIGHEST dot), small M only.
Timing: a jitted call runs 1-4 independent products (an optimization barrier per product, so
XLA cannot merge them); calls are dispatched back to back so the device never idles, and
successive products rotate over weight copies totalling >= 192 MB (3x L2), so weights stream
from HBM as in a decode step. Reported per product: `wall_us` (median over `reps` samples of
wall time) and, on GPUs, `device_us` (CUPTI kernel time of the product's XLA module through
jax.profiler, summed over its kernels: activation pre-pass, Pallas kernel, split-K sum). The
primary `median_us` is device_us when present: host dispatch cannot inflate it. Copy
bandwidth is measured in the same process (XLA device copies of 3 x 1 GiB, bytes read plus
written; and an elementwise pass for reference).

`python -m jqlin bench` runs a small version; benchmarks/bench_matmul.py the full one.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as futures
import dataclasses
import glob
import importlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from . import dispatch, formats, qweight
from .cli import positive_int

__all__ = ["SHAPES", "Op", "bf16_op", "xla_fp8_op", "kernel_op", "build_ops", "measure_copy_bandwidth", "run", "run_and_report", "add_parser", "main"]

# (K, N) of the linear layers of each model (K = in_features, N = out_features).
SHAPES: dict[str, list[tuple[int, int]]] = {
    "llama3-8b": [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)],
    "llama3-70b": [(8192, 10240), (8192, 8192), (8192, 57344), (28672, 8192)],
    "deepseek-v3": [(7168, 24576), (7168, 36864), (18432, 7168)],
}
M_VALUES = (1, 16, 64, 256, 1024, 4096, 16384)
L2_ROTATE_BYTES = 192 << 20  # weights rotated over >= 3x the H200's 60 MB L2
SMALL_SHAPE, CPU_SHAPE = "4096x4096", "512x512"  # `jqlin bench`'s default shape


@dataclasses.dataclass(frozen=True)
class Op:
    """One thing to time: fn(x, weight) -> y."""

    name: str  # "bf16" | "xla_fp8" | a registered kernel name
    fmt: str | None  # jqlin format of the weight, None for bf16
    mode: str  # "default" | "det"
    fn: Callable[[jax.Array, Any], jax.Array]
    max_m: int | None = None  # skip larger M (slow reference paths)
    min_m: int | None = None
    config: dict | None = None  # recorded as is (explicit-config sweeps)
    # From this M on, compiling the op autotunes XLA GEMMs on the device (None: never).
    xla_gemm_min_m: int | None = None

    @property
    def label(self) -> str:
        base = self.name if self.fmt is None else f"{self.fmt}:{self.name}"
        return base + ("[det]" if self.mode == "det" else "")


def _bf16_dot(x, w):
    return jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())),
                               preferred_element_type=jnp.float32).astype(x.dtype)


def _xla_fp8(x, w):
    """XLA's fp8 path as a user would write it: static per-tensor scales, e4m3 x e4m3 -> f32."""
    xq = jnp.clip(x.astype(jnp.float32) / w.input_scale, -448, 448).astype(jnp.float8_e4m3fn)
    y = jax.lax.dot_general(xq, w.data, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)
    return (y * (w.input_scale * w.scale.reshape(()))).astype(x.dtype)


def bf16_op() -> Op:
    """The baseline of every speedup: bf16 x @ W^T through XLA (cuBLAS, autotuned)."""
    return Op("bf16", None, "default", _bf16_dot, xla_gemm_min_m=0)


def xla_fp8_op(fmt: str = "fp8_per_tensor") -> Op:
    """XLA's own fp8 x fp8 product (cuBLASLt, autotuned) on a per-tensor weight of `fmt`."""
    return Op("xla_fp8", fmt, "default", _xla_fp8, xla_gemm_min_m=0)


def kernel_op(kernel: str, fmt: str, deterministic: bool = False, **kw: Any) -> Op:
    """jqlin.matmul(x, qw, kernel=kernel) on weights of `fmt`. Compiles that autotune XLA GEMMs
    are marked: always for the XLA reference, and in default mode from the M a kernel module
    names in `XLA_GEMM_MIN_M` (where it runs an XLA dot instead of its own kernel)."""
    gemm_m = 0 if kernel == "xla" else None
    if not deterministic:
        impl = dispatch.registered_kernels()[kernel].impl
        gemm_m = getattr(importlib.import_module(impl.__module__), "XLA_GEMM_MIN_M", gemm_m)

    def fn(x, qw):
        return dispatch.matmul(x, qw, kernel=kernel, deterministic=deterministic)
    return Op(kernel, fmt, "det" if deterministic else "default", fn, xla_gemm_min_m=gemm_m,
              **kw)


def fp8_op(fmt: str, name: str, *, path: str | None = None, config: Any = None,
           deterministic: bool = False, **kw: Any) -> Op:
    """`fmt` through its fp8 kernel's glue (w8a16_apply / w8a8_apply: the dispatcher's
    arithmetic) with the kernel's own choice overridden -- `path` (fp8_paths.PATHS) and / or
    `config` (a MatmulConfig, recorded in the op) -- for probes of a launch the dispatcher would
    not pick at that M. kw: Op's fields (min_m, max_m, xla_gemm_min_m)."""
    from .kernels.pallas_fp8 import w8a16_apply, w8a8_apply
    apply = w8a16_apply if formats.get(fmt).activation is None else w8a8_apply
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        return apply(x, qw, qw.spec, path=path, config=config, deterministic=deterministic,
                     interpret=interpret)
    return Op(name, fmt, "det" if deterministic else "default", fn,
              config=None if config is None else config.to_json(), **kw)


def two_rows(fn: Callable[[jax.Array, Any], jax.Array], how: str = "zeros"
             ) -> Callable[[jax.Array, Any], jax.Array]:
    """fn(x, w) for one row of x run on two ('zeros': a zero row appended -- its own XLA pass;
    'broadcast': x broadcast, which XLA keeps inside its GEMM), row 0 kept: XLA's one-row
    product is a reduction, its two-row one a GEMM (benchmarks/NOTES.md, sessions 24-25)."""
    if how not in ("zeros", "broadcast"):
        raise ValueError(f"two_rows: how must be 'zeros' or 'broadcast', got {how!r}")

    def run(x, w):
        x2 = (jnp.pad(x, ((0, 1), (0, 0))) if how == "zeros" else
              jnp.broadcast_to(x, (2, x.shape[1])))
        return fn(x2, w)[:1]
    return run


MODES = ("default", "det")


def check_modes(modes: Sequence[str], what: str = "modes") -> None:
    """A mode not in MODES is an error (session 47: "deterministic" built a second default op)."""
    if not modes or any(mode not in MODES for mode in modes):
        raise ValueError(f"{what}: expected 'default' and/or 'det', got {','.join(modes)!r}")


def build_ops(fmts: Sequence[str], kernels: Sequence[str] | None, *, modes=MODES,
              xla_ref_max_m: int = 16, baselines: bool = True) -> list[Op]:
    """bf16 + xla_fp8 baselines, then for each format its auto-chosen kernel (or `kernels`)."""
    check_modes(modes)
    ops: list[Op] = []
    if baselines:
        ops.append(bf16_op())
        if "fp8_per_tensor" in fmts:
            ops.append(xla_fp8_op())
    for fmt in fmts:
        spec = formats.get(fmt)
        registry = dispatch.registered_kernels()
        if kernels:  # forced kernels, each only for the formats whose spec it honours
            names = [kn for kn in kernels if kn in dispatch.kernels_for(spec)]
        else:
            names = [_auto_kernel(spec)]
        for kname in names:
            k = registry[kname]
            for mode in modes:
                det = mode == "det"
                if det and (not k.batch_invariant or (spec.activation is not None
                                                      and not spec.activation.row_local)):
                    continue
                ops.append(kernel_op(kname, fmt, det))
        if xla_ref_max_m and "xla" not in names:
            ops.append(kernel_op("xla", fmt, max_m=xla_ref_max_m))
    return ops


def _auto_kernel(spec) -> str:
    qw = _abstract_qweight(spec, 256, 256)
    ex = dispatch.explain((1, 256), qw)
    if ex.chosen is None:
        raise RuntimeError(f"no kernel for {spec.describe()}:\n{ex}")
    return ex.chosen


def default_formats() -> list[str]:
    """Formats whose auto-chosen kernel on this device is not the XLA reference."""
    return [f for f in formats.names() if _auto_kernel(formats.get(f)) != "xla"]


def _abstract_qweight(spec, n, k):
    w = jax.ShapeDtypeStruct((n, k), jnp.float32)
    needs = spec.activation is not None and (not spec.activation.dynamic
                                             or spec.activation.global_scale is not None)
    cal = jax.ShapeDtypeStruct((4, k), jnp.float32) if needs else None
    return jax.eval_shape(lambda w, c: qweight.quantize(w, spec, calibration=c), w, cal)


def _make_weight(key, fmt: str | None, n: int, k: int):
    w = jax.random.normal(key, (n, k), jnp.float32) * 0.02
    if fmt is None:
        return w.astype(jnp.bfloat16)
    spec = formats.get(fmt)
    needs = spec.activation is not None and (not spec.activation.dynamic
                                             or spec.activation.global_scale is not None)
    cal = jax.random.normal(jax.random.fold_in(key, 1), (64, k), jnp.float32) if needs else None
    return _QUANTIZE(fmt)(w, cal)


_QCACHE: dict[str, Callable] = {}


def _QUANTIZE(fmt: str):
    if fmt not in _QCACHE:
        _QCACHE[fmt] = jax.jit(lambda w, c: qweight.quantize(w, fmt, calibration=c))
    return _QCACHE[fmt]


def _nbytes(tree) -> int:
    return sum(int(a.size) * a.dtype.itemsize for a in jax.tree.leaves(tree))


def _estimate(m: int, n: int, k: int, weight_bytes: int) -> float:
    return max(weight_bytes / 3.5e12, 2.0 * m * n * k / 6e14) + 4e-6


def _inner_count(m: int, n: int, k: int, weight_bytes: int) -> int:
    # Products per jitted call: with calls dispatched back to back the device stays busy once a
    # call's work (>= ~40 us) exceeds host dispatch; each product is its own kernel instance to
    # compile, so no more than 4.
    return int(min(4, max(1, math.ceil(4e-5 / _estimate(m, n, k, weight_bytes)))))


def _copies(weight_bytes: int) -> int:
    return int(min(8, max(1, math.ceil(L2_ROTATE_BYTES / max(weight_bytes, 1)))))


def measure_copy_bandwidth(nbytes: int = 1 << 30, buffers: int = 3, reps: int = 7,
                           kind: str = "copy") -> float:
    """Device copy bandwidth: bytes read + written per second over `buffers` x `nbytes`.

    kind "copy": XLA device-to-device copies of non-donated arrays; "xor": an elementwise
    kernel (what a fused XLA pass reaches)."""
    n = nbytes // 4
    keys = jax.random.split(jax.random.key(7), buffers)
    xs = [jax.random.bits(k, (n,), jnp.uint32) for k in keys]
    if kind == "copy":
        f = jax.jit(lambda xs: [jnp.copy(x) for x in xs])
    else:
        f = jax.jit(lambda xs: [x ^ jnp.uint32(0x5A5A5A5A) for x in xs])
    jax.block_until_ready(f(xs))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(xs))
        times.append(time.perf_counter() - t0)
    return 2.0 * nbytes * buffers / statistics.median(times)


def kernel_events(trace_dir: str) -> list[tuple[str, str, str, int, int]]:
    """(device plane, hlo_module, kernel name, start ns, duration ns) of every GPU kernel in
    the newest trace under trace_dir.

    Kernel events of the device planes carry the XLA module that launched them; derived lines
    ("XLA Modules", "XLA Ops", "Steps") repeat the same time and are skipped."""
    files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not files:
        return []
    data = jax.profiler.ProfileData.from_file(max(files, key=os.path.getmtime))
    out = []
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if line.name.startswith("XLA") or "Step" in line.name:
                continue
            for ev in line.events:
                module = next((str(v) for key, v in ev.stats if key == "hlo_module"), None)
                if module is not None:
                    out.append((plane.name, module, ev.name, ev.start_ns, ev.duration_ns))
    return out


def kernel_medians_us(fn: Callable, args: Sequence, calls: int, name_chars: int = 80
                      ) -> dict[str, float]:
    """fn(*args) run `calls` times under the profiler (compile it first): the median device time
    (us) of each GPU kernel it launches, by kernel name (cut to name_chars). {} on a CPU."""
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d)
        for _ in range(calls):
            y = fn(*args)
        jax.block_until_ready(y)
        jax.profiler.stop_trace()
        per_kernel = collections.defaultdict(list)
        for _, _, name, _, dur in kernel_events(d):
            per_kernel[name[:name_chars]].append(dur * 1e-3)
    return {name: statistics.median(v) for name, v in per_kernel.items()}


def write_records(path: str, records: list[dict]) -> None:
    """A probe's results JSON: device, jax version, the command line, its records."""
    with open(path, "w") as f:
        json.dump(json_safe(dict(device=str(jax.devices()[0].device_kind), jax=jax.__version__,
                                 command=" ".join(sys.argv), records=records)), f, indent=1)


def device_seconds(trace_dir: str, *, per_device: bool = False) -> dict:
    """hlo_module name -> summed GPU kernel time (s) in the newest trace under trace_dir
    (per_device: (device plane name, hlo_module) -> seconds)."""
    total: dict = collections.defaultdict(float)
    for plane, module, _, _, dur in kernel_events(trace_dir):
        total[(plane, module) if per_device else module] += dur * 1e-9
    return dict(total)


@dataclasses.dataclass
class _Case:
    op: Op
    m: int
    inner: int
    copies: int
    compiled: Any = None
    error: str | None = None
    name: str = ""  # unique function name: its kernels carry hlo_module "jit_<name>"
    products: int = 0  # products run while the profiler traced


def _runner(fn, inner: int, name: str = "run"):
    def run(xs, ws):
        out = []
        for i in range(inner):
            # The barrier gives each product its own operand values: without it XLA merges
            # dots that share a weight into one batched dot (DotMerger).
            x, w = jax.lax.optimization_barrier((xs[i], ws[i]))
            out.append(fn(x, w))
        return out
    run.__name__ = run.__qualname__ = name
    return run


def _abstract(tree):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


def _compile_case(case: _Case, x_abs, w_abs) -> _Case:
    try:
        run = _runner(case.op.fn, case.inner, case.name)
        case.compiled = jax.jit(run).lower([x_abs] * case.inner,
                                           [w_abs] * case.inner).compile()
    except Exception as e:  # recorded, the sweep goes on
        case.error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return case


def _time(compiled, xs, ws, inner: int, est: float, reps: int,
          b2b: int | None = None) -> tuple[float, int]:
    """(median wall seconds per product, products run). Each sample dispatches `b2b` calls
    back to back (the device stays busy), rotating through the weight copies so every product
    reads its weight from HBM, not from L2."""
    if b2b is None:
        b2b = int(min(8, max(2, round(4e-3 / (inner * est)))))
    calls = [([xs[(j * inner + i) % len(xs)] for i in range(inner)],
              [ws[(j * inner + i) % len(ws)] for i in range(inner)]) for j in range(b2b)]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        outs = [compiled(*c) for c in calls]
        jax.block_until_ready(outs)
        times.append((time.perf_counter() - t0) / (b2b * inner))
        del outs
    return statistics.median(times), reps * b2b * inner


def _describe(op: Op, m: int, w, x_dtype) -> dict | None:
    if op.config is not None:
        return op.config
    registry = dispatch.registered_kernels()
    if op.fmt is None or op.name in ("xla", "xla_fp8") or op.name not in registry:
        return None
    kernel = registry[op.name]
    mod = importlib.import_module(kernel.impl.__module__)
    describe = getattr(mod, "describe_config", None)  # optional hook of a kernel's glue module
    if describe is None:
        return None
    try:
        return describe(op.name, m, w, w.spec, x_dtype, op.mode == "det")
    except Exception as e:  # pragma: no cover - a describer must never stop a benchmark
        return {"error": str(e)[:200]}


def run(shapes: Sequence[tuple[str, int, int]], ms: Sequence[int], ops: Sequence[Op], *,
        reps: int = 5, workers: int | None = None, log=print,
        on_record: Callable[[dict], None] | None = None,
        on_header: Callable[[dict], None] | None = None,
        device_timing: bool | None = None, smoke: bool = False) -> dict:
    """Time every (shape, M, op); returns {"device", "jax_version", "copy_bandwidth", "records"}.
    on_header gets that dict but its records once, first; on_record each record as it comes.

    smoke: one product per jitted call, one call per sample and no warm-up call (the scripts'
    CPU smoke runs, where the interpreter's time is CI's and the timings mean nothing; a case
    that fails is recorded by its timed call instead); records as usual."""
    dev = jax.devices()[0]
    on_cpu = dev.platform == "cpu"
    device_timing = (not on_cpu) if device_timing is None else device_timing
    copy_bw = measure_copy_bandwidth() if not on_cpu else float("nan")
    xor_bw = measure_copy_bandwidth(kind="xor") if not on_cpu else float("nan")
    log(f"device: {dev.device_kind} ({dev.platform}); jax {jax.__version__}; "
        + ("copy bandwidth not measured on a CPU (BWfrac: -)" if on_cpu else
           f"copy bandwidth {copy_bw / 1e12:.3f} TB/s, elementwise {xor_bw / 1e12:.3f} TB/s "
           f"(read+write)"))
    result = {"device": dev.device_kind, "platform": dev.platform, "jax_version": jax.__version__,
              "copy_bandwidth_Bps": copy_bw, "elementwise_bandwidth_Bps": xor_bw,
              "records": []}
    if on_header:
        on_header({key: v for key, v in result.items() if key != "records"})
    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    key = jax.random.key(0)
    for model, k, n in shapes:
        t_shape = time.perf_counter()
        # Weights: one set of copies per weight kind (bf16 or a format).
        kinds = sorted({op.fmt if op.name != "bf16" else None for op in ops},
                       key=lambda v: v or "")
        weights: dict[Any, list] = {}
        for kind in kinds:
            w0 = _make_weight(jax.random.fold_in(key, hash((k, n, kind)) & 0xFFFF), kind, n, k)
            c = _copies(_nbytes(w0))
            weights[kind] = [w0] + [_make_weight(jax.random.fold_in(key, 1000 + i), kind, n, k)
                                    for i in range(1, c)]
        cases = []
        for m in ms:
            for op in ops:
                if (op.max_m is not None and m > op.max_m) or (op.min_m is not None
                                                                and m < op.min_m):
                    continue
                ws = weights[op.fmt if op.name != "bf16" else None]
                wb = _nbytes(ws[0])
                cases.append(_Case(op, m, 1 if smoke else _inner_count(m, n, k, wb), len(ws),
                                   name=f"bench_{len(result['records'])}_{len(cases)}"))
        # Compile everything for this shape (XLA / Triton compiles release the GIL): cases that
        # autotune XLA GEMMs one at a time (concurrent autotuning on one GPU timed out), beside
        # a pool for the rest (Triton compiles use only the host).
        def autotunes(c):
            return c.op.xla_gemm_min_m is not None and c.m >= c.op.xla_gemm_min_m
        with futures.ThreadPoolExecutor(1) as serial, \
                futures.ThreadPoolExecutor(max(1, workers - 1)) as pool:
            jobs = [(serial if autotunes(c) else pool).submit(
                        _compile_case, c, jax.ShapeDtypeStruct((c.m, k), jnp.bfloat16),
                        _abstract(weights[c.op.fmt if c.op.name != "bf16" else None][0]))
                    for c in cases]
            cases = [j.result() for j in jobs]
        t_compiled = time.perf_counter()
        order = sorted(cases, key=lambda c: (c.m, c.op.name != "bf16"))
        xs_by_m = {}
        for c in order:  # warm up (first call, allocator) outside the profiled window
            if c.error:
                continue
            ws = weights[c.op.fmt if c.op.name != "bf16" else None]
            xs_by_m.setdefault(c.m, [jax.random.normal(jax.random.fold_in(key, 7 * i + c.m),
                                                       (c.m, k), jnp.bfloat16)
                                     for i in range(4)])
            if smoke:
                continue
            try:
                jax.block_until_ready(c.compiled([xs_by_m[c.m][i % 4] for i in range(c.inner)],
                                                 [ws[i % len(ws)] for i in range(c.inner)]))
            except Exception as e:
                c.error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        trace_dir = tempfile.mkdtemp(prefix="jqlin_bench_") if device_timing else None
        if trace_dir:
            jax.profiler.start_trace(trace_dir)
        recs = []
        for c in order:
            rec = {"model": model, "K": k, "N": n, "M": c.m, "op": c.op.name, "format": c.op.fmt,
                   "mode": c.op.mode, "label": c.op.label}
            ws = weights[c.op.fmt if c.op.name != "bf16" else None]
            if c.error:
                rec["error"] = c.error
            else:
                est = _estimate(c.m, n, k, _nbytes(ws[0]))
                try:
                    t, c.products = _time(c.compiled, xs_by_m[c.m], ws, c.inner, est, reps,
                                          b2b=1 if smoke else None)
                except Exception as e:
                    rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                else:
                    rec.update(wall_us=t * 1e6, weight_bytes=_nbytes(ws[0]), inner=c.inner,
                               weight_copies=len(ws))
                    cfg = _describe(c.op, c.m, ws[0], jnp.bfloat16)
                    if cfg is not None:
                        rec["config"] = cfg
            recs.append((c, rec))
        device = {}
        if trace_dir:
            jax.profiler.stop_trace()
            try:
                device = device_seconds(trace_dir)
            except Exception as e:  # the wall-clock figures stand alone
                log(f"device timing unavailable: {type(e).__name__}: {e}")
            shutil.rmtree(trace_dir, ignore_errors=True)
        bf16_time: dict[int, float] = {}
        for c, rec in recs:
            if "wall_us" in rec:
                dev = device.get(f"jit_{c.name}")
                if dev and c.products:
                    rec["device_us"] = dev / c.products * 1e6
                # Primary time: CUPTI kernel time when traced (host dispatch cannot inflate it),
                # else wall clock.
                t = rec.get("device_us", rec["wall_us"]) * 1e-6
                rec.update(median_us=t * 1e6, time_basis="device" if "device_us" in rec
                           else "wall", tflops=2.0 * c.m * n * k / t / 1e12,
                           frac_copy_bw=rec["weight_bytes"] / t / copy_bw)
                if c.op.name == "bf16":
                    bf16_time[c.m] = t
                if c.m in bf16_time:
                    rec["speedup_vs_bf16"] = bf16_time[c.m] / t
            result["records"].append(rec)
            if on_record:
                on_record(rec)
        del xs_by_m
        log(f"[{model} K={k} N={n}] {len(cases)} cases: compile {t_compiled - t_shape:.0f}s, "
            f"time {time.perf_counter() - t_compiled:.0f}s")
        del weights, cases
    return result


def run_and_report(shapes: Sequence[tuple[str, int, int]], ms: Sequence[int],
                   ops: Sequence[Op], *, reps: int = 5, out: str = "", smoke: bool = False
                   ) -> dict:
    """run(), its table printed, its result written as JSON to `out` (if given): the measuring
    step of `jqlin bench` and the probe scripts. Each record is printed and (with `out`) the
    records so far written as they come, so that a run cut short by a time limit keeps them."""
    header: dict = {}
    done: list[dict] = []

    def on_record(rec: dict) -> None:
        done.append(rec)
        print(format_table([rec]).splitlines()[1], flush=True)
        if out:
            _write_json(out, {"partial": True, **header, "records": done})

    res = run(shapes, ms, ops, reps=reps, log=print, smoke=smoke, on_record=on_record,
              on_header=header.update)
    print(format_table(res["records"]), flush=True)
    if out:
        _write_json(out, res)
    return res


def _write_json(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(json_safe(obj), f, indent=1)
    os.replace(tmp, path)


def json_safe(obj: Any) -> Any:
    """obj with non-finite floats as None: JSON has no NaN (Python writes the token `NaN`, which
    strict readers refuse), and a CPU run measures no bandwidth."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _frac(v) -> str:
    """A bandwidth fraction for the table; '-' where none was measured (NaN on a CPU)."""
    return "-" if v is None or not math.isfinite(v) else f"{v:.2f}"


def format_table(records: Sequence[dict]) -> str:
    rows = []
    for r in records:
        if "error" in r:
            rows.append(f"{r['model']:<12} {r['K']:>6} {r['N']:>6} {r['M']:>6} {r['label']:<42} "
                        f"ERROR {r['error'][:60]}")
            continue
        sp = r.get("speedup_vs_bf16")
        rows.append(f"{r['model']:<12} {r['K']:>6} {r['N']:>6} {r['M']:>6} {r['label']:<42} "
                    f"{r['median_us']:>10.1f} {r.get('time_basis', '')[:3]:>4} "
                    f"{r['tflops']:>8.1f} {_frac(r['frac_copy_bw']):>6} "
                    f"{'' if sp is None else f'{sp:6.2f}x'}")
    head = (f"{'model':<12} {'K':>6} {'N':>6} {'M':>6} {'op':<42} {'us':>10} {'by':>4} "
            f"{'TFLOP/s':>8} {'BWfrac':>6} vs bf16")
    return "\n".join([head] + rows)


def parse_launch_grid(spec: str) -> list[tuple[int, int]]:
    """'1,2,4:2,4' (SPLITS:STAGES lists) -> every (splits, stages) pair; 'none' -> []."""
    if spec == "none":
        return []
    try:
        splits, stages = (tuple(int(v) for v in part.split(",")) for part in spec.split(":"))
    except ValueError:
        raise ValueError(f"a launch grid is 'SPLITS:STAGES' comma lists or 'none', got "
                         f"{spec!r}") from None
    return [(sp, st) for sp in splits for st in stages]


def add_decode_probe_args(p: argparse.ArgumentParser, *, m: str, reps: int) -> None:
    """The options the decode probes share: --out, --shapes (four decode shapes by default),
    --m, --reps."""
    p.add_argument("--out", default="")
    p.add_argument("--shapes", default="4096x4096,8192x8192,8192x10240,4096x28672",
                   help="KxN list or model names or 'all' (jqlin.bench.parse_shapes)")
    p.add_argument("--m", default=m)
    p.add_argument("--reps", type=int, default=reps)


def add_rows_probe_args(p: argparse.ArgumentParser, *, m: str) -> None:
    """The options of the probes that check rows bitwise across M, then time launches
    (probe_det_w8a8_mgpu, probe_det_block_mgpu): --shapes, --m, --bitwise-shapes, --reps,
    --tiny (the CPU smoke run), --out."""
    p.add_argument("--shapes", default="all", help="as bench_matmul.py --shapes")
    p.add_argument("--m", default=m)
    p.add_argument("--bitwise-shapes", default="4096x4096,7168x24576",
                   help="KxN list for the bitwise check ('' skips it)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: the interpreter, tiny "
                   "shapes (the timings mean nothing)")
    p.add_argument("--out", required=True)


def rows_probe_sizes(p: argparse.ArgumentParser, args) -> tuple[list, list[int], list]:
    """add_rows_probe_args' sizes: (shapes, M list, bitwise (K, N) list) -- a 256 x 256 weight
    at M = 1 with --tiny (a smoke of the script: the kernels' tests check the rows; session
    53: M = 3 too doubled the interpreter's time); refused on a CPU without it (the Mosaic
    interpreter is slow)."""
    if jax.default_backend() == "cpu" and not args.tiny:
        p.error("on CPU only --tiny runs (the Mosaic interpreter is slow)")
    if args.tiny:
        return [("tiny", 256, 256)], [1], [(256, 256)]
    return (parse_shapes(args.shapes), [int(v) for v in args.m.split(",")],
            [tuple(int(v) for v in s.split("x")) for s in args.bitwise_shapes.split(",") if s])


def rows_probe_record(out: str) -> tuple[dict, Callable[..., None]]:
    """(result, save) of a rows probe: {"command", "bitwise", "records"}, and save() writing it
    to `out` -- called after each check and record, so a device call's time box keeps what
    ran."""
    result: dict = {"command": " ".join(sys.argv), "bitwise": [], "records": []}

    def save(*_):
        with open(out, "w") as f:
            json.dump(json_safe(result), f, indent=1)
    return result, save


def run_into(result: dict, save: Callable[..., None], shape: tuple[str, int, int],
             ms: Sequence[int], ops: Sequence[Op], *, reps: int, smoke: bool) -> None:
    """run() of one shape into rows_probe_record's result (its header and each record saved as
    they come), then its table printed."""
    res = run([shape], ms, ops, reps=reps, log=print, smoke=smoke,
              on_header=lambda h: (result.update(h), save()),
              on_record=lambda r: (result["records"].append(r), save()))
    print(format_table(res["records"]), flush=True)


def parse_shapes(spec: str) -> list[tuple[str, int, int]]:
    """'llama3-8b,deepseek-v3' or 'KxN,KxN' -> [(model, K, N)]."""
    out = []
    for item in spec.split(","):
        item = item.strip()
        if item in SHAPES:
            out += [(item, k, n) for k, n in SHAPES[item]]
        elif item == "all":
            out += [(mdl, k, n) for mdl, lst in SHAPES.items() for k, n in lst]
        else:
            try:
                k, n = (int(v) for v in item.lower().split("x"))
            except ValueError:
                raise ValueError(f"shape {item!r}: expected a model name ({', '.join(SHAPES)}), "
                                 "'all' or KxN (e.g. 4096x4096)") from None
            if k <= 0 or n <= 0:
                raise ValueError(f"shape {item!r}: K and N must be positive")
            model = next((mdl for mdl, lst in SHAPES.items() if (k, n) in lst), "custom")
            out.append((model, k, n))
    return out


def add_arguments(p: argparse.ArgumentParser, *, small: bool) -> None:
    p.add_argument("--shapes", default=None if small else "all",
                   help="model names (%s), 'all', or KxN list (default: %s)"
                        % (", ".join(SHAPES), f"{SMALL_SHAPE}, {CPU_SHAPE} on a CPU"
                           if small else "all"))
    p.add_argument("--m", default="1,16,256" if small else ",".join(map(str, M_VALUES)),
                   help="comma-separated M values")
    p.add_argument("--formats", default="auto",
                   help="jqlin format names, or 'auto': those whose auto kernel is not xla")
    p.add_argument("--kernels", default="",
                   help="force these registered kernels instead of each format's auto choice")
    p.add_argument("--modes", default="default,det", help="comma-separated: default, det")
    p.add_argument("--xla-ref-max-m", type=int, default=16,
                   help="time the f32 XLA reference path up to this M (0: never)")
    p.add_argument("--reps", type=positive_int, default=5, help="timed samples per case")
    p.add_argument("--json", default="", help="write the results here")


def _parse_list(text: str, what: str) -> list[str]:
    items = [v.strip() for v in text.split(",")]
    if not text.strip() or any(not v for v in items):
        raise ValueError(f"{what}: expected a comma-separated list, got {text!r}")
    return items


def _check_args(args) -> tuple[list[tuple[str, int, int]], list[int], list[str] | None,
                                list[str] | None, tuple[str, ...]]:
    """The bench arguments checked before any work: (shapes, ms, formats or None for auto,
    kernels or None, modes); a ValueError names the argument at fault."""
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as e:
        raise ValueError(f"--shapes: {e}") from None
    try:
        ms = [positive_int(v) for v in _parse_list(args.m, "--m")]
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"--m: {e}") from None
    fmts = None
    if args.formats != "auto":
        fmts = _parse_list(args.formats, "--formats")
        unknown = [f for f in fmts if f not in formats.names()]
        if unknown:
            raise ValueError(f"--formats: unknown format {unknown[0]!r} (registered: "
                             f"{', '.join(formats.names())}, or 'auto')")
    kernels = None
    if args.kernels:
        kernels = _parse_list(args.kernels, "--kernels")
        registry = dispatch.registered_kernels()
        unknown = [k for k in kernels if k not in registry]
        if unknown:
            raise ValueError(f"--kernels: unknown kernel {unknown[0]!r} (registered: "
                             f"{', '.join(registry)})")
    modes = tuple(_parse_list(args.modes, "--modes"))
    check_modes(modes, "--modes")
    if args.xla_ref_max_m < 0:
        raise ValueError(f"--xla-ref-max-m: expected >= 0 (0: never), got {args.xla_ref_max_m}")
    if args.json:
        parent = os.path.dirname(os.path.abspath(args.json))
        if os.path.isdir(args.json) or not os.path.isdir(parent):
            raise ValueError(f"--json {args.json}: expected a file path in an existing "
                             "directory")
    return shapes, ms, fmts, kernels, modes


def main_from_args(args) -> int:
    on_cpu = jax.default_backend() == "cpu"
    default_shape = args.shapes is None
    if default_shape:
        args.shapes = CPU_SHAPE if on_cpu else SMALL_SHAPE
    try:
        shapes, ms, fmts, kernels, modes = _check_args(args)
    except ValueError as e:
        print(f"jqlin bench: error: {e}", file=sys.stderr)
        return 2
    if fmts is None:
        fmts = default_formats()
        if not fmts:
            print("no format has a non-XLA kernel on this device (CPU?): timing the XLA path "
                  "of fp8 formats as a smoke test", file=sys.stderr)
            fmts = ["fp8_per_channel_a16", "fp8_ptpc"]
    if kernels:
        registry = dispatch.registered_kernels()
        for kn in kernels:
            if all(registry[kn].spec_mismatch(formats.get(f)) is not None for f in fmts):
                print(f"jqlin bench: error: --kernels {kn}: handles none of the formats "
                      f"{', '.join(fmts)} ({registry[kn].spec_mismatch(formats.get(fmts[0]))})",
                      file=sys.stderr)
                return 2
    if on_cpu:
        print(f"CPU backend: {'default shape ' + CPU_SHAPE + ', ' if default_shape else ''}"
              "a smoke test, not a benchmark", file=sys.stderr)
    ops = build_ops(fmts, kernels, modes=modes, xla_ref_max_m=args.xla_ref_max_m)
    res = run_and_report(shapes, ms, ops, reps=args.reps, out=args.json)
    failed = sum(1 for r in res["records"] if "error" in r)
    if failed:
        print(f"jqlin bench: {failed} of {len(res['records'])} case(s) failed (ERROR rows "
              "above)", file=sys.stderr)
        return 1
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="time quantized matmul kernels against bf16 "
                                            "(small version of benchmarks/bench_matmul.py)")
    add_arguments(p, small=True)
    p.set_defaults(func=main_from_args)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    add_arguments(p, small=True)
    return main_from_args(p.parse_args(argv))
