"""Full quantized-matmul benchmark (device): every format's kernel vs bf16 jnp.dot, one run.

    PYTHONPATH=. python benchmarks/bench_matmul.py --out $OUT            # the full grid
    python benchmarks/bench_matmul.py --plot-only results/h200.json      # redraw the plot

Formats and kernels come from jqlin's registries (--formats / --kernels; default: each format
whose auto-chosen kernel on this device is not the XLA reference), so new formats and kernels
join without edits here. Records stream to <out>/bench.jsonl as they are measured (a run cut
short keeps what it measured); the end writes <out>/bench.json and <out>/speedup_vs_bf16.png.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import pathlib
import sys

import jax

from jqlin import bench


def plot(result: dict, path: pathlib.Path) -> None:
    """Speedup vs bf16 by M: one panel per model, geometric mean over the model's shapes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in result["records"] if "speedup_vs_bf16" in r and r["op"] != "bf16"]
    models = sorted({r["model"] for r in recs})
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        ax.set_prop_cycle(color=plt.cm.tab20.colors)  # ~20 labels: the default 10 colours repeat
        series = collections.defaultdict(lambda: collections.defaultdict(list))
        for r in recs:
            if r["model"] == model:
                series[r["label"]][r["M"]].append(math.log(r["speedup_vs_bf16"]))
        for label in sorted(series):
            ms = sorted(series[label])
            ys = [math.exp(sum(series[label][m]) / len(series[label][m])) for m in ms]
            ax.plot(ms, ys, marker="o", linestyle="--" if "[det]" in label else "-",
                    label=label)
        ax.axhline(1.0, color="k", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("speedup vs bf16 jnp.dot (geomean over shapes)")
        ax.set_title(f"{model} on {result.get('device', '?')}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _fast_convert_op(fmt: str) -> bench.Op:
    """The W8A16 kernel with its resolved config but fast_convert=True (inline-PTX e4m3->bf16)."""
    from jqlin.kernels.pallas_fp8 import w8a16_apply

    interpret = jax.default_backend() == "cpu"  # CPU: a smoke test of the script

    def fn(x, qw):
        return w8a16_apply(x, qw, qw.spec, config_overrides={"fast_convert": True},
                           interpret=interpret)
    return bench.Op("pallas_fp8_w8a16+fast_convert", fmt, "default", fn)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_arguments(p, small=False)
    p.add_argument("--out", default="benchmarks/results", help="output directory")
    p.add_argument("--det-formats", default="",
                   help="time deterministic mode only for these formats (default: all)")
    p.add_argument("--fast-convert-variant", default="",
                   help="also time pallas_fp8_w8a16 with fast_convert=True for these formats")
    p.add_argument("--plot-only", default="", help="redraw the plot from this JSON and exit")
    args = p.parse_args(argv)
    if args.plot_only:  # a bench.json, or the bench.jsonl stream of a run cut short
        src = pathlib.Path(args.plot_only)
        if src.suffix == ".jsonl":
            res = {"records": [json.loads(line) for line in src.read_text().splitlines()
                               if line.strip()]}
        else:
            res = json.loads(src.read_text())
        plot(res, src.with_suffix(".png"))
        return 0
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fmts = bench.default_formats() if args.formats == "auto" else args.formats.split(",")
    kernels = [k for k in args.kernels.split(",") if k] or None
    modes = tuple(args.modes.split(","))
    try:
        bench.check_modes(modes, "--modes")
    except ValueError as e:
        p.error(str(e))
    ops = bench.build_ops(fmts, kernels, modes=modes, xla_ref_max_m=args.xla_ref_max_m)
    if args.det_formats:
        keep = set(args.det_formats.split(","))
        ops = [op for op in ops if op.mode != "det" or op.fmt in keep]
    for fmt in filter(None, args.fast_convert_variant.split(",")):
        ops.append(_fast_convert_op(fmt))
    stream = open(out / "bench.jsonl", "w")

    def on_record(rec):
        stream.write(json.dumps(bench.json_safe(rec)) + "\n")
        stream.flush()

    res = bench.run(bench.parse_shapes(args.shapes), [int(v) for v in args.m.split(",")], ops,
                    reps=args.reps, on_record=on_record)
    stream.close()
    (out / "bench.json").write_text(json.dumps(bench.json_safe(res), indent=1))
    plot(res, out / "speedup_vs_bf16.png")
    print(bench.format_table(res["records"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
