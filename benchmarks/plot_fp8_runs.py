"""Speedup vs bf16 by M for the FP8 kernels, from the device runs recorded in results/.

Every ratio pairs two timings of the same process (same run, same device state):
  M=1 W8A16: run 2 `probe_fp8.py decode` (one product per dispatch, host loop);
  M=16/4096: run 2 `sweep_fp8.py` (timing harness v2). Its M=1 points are left out: there
  its bf16 wall clock was host-inflated (90.2 us vs 57.3 us dispatched alone), see NOTES.md.
    python benchmarks/plot_fp8_runs.py   ->  results/h200_fp8_speedup_vs_bf16.png + .json
"""

from __future__ import annotations

import json
import pathlib
import re

RES = pathlib.Path(__file__).parent / "results"


def _sweep(path):
    return [r for r in json.loads(path.read_text())["records"] if "error" not in r]


def _pick(recs, k, n, m, label_re):
    hits = [r for r in recs if (r["K"], r["N"], r["M"]) == (k, n, m)
            and re.search(label_re, r["label"])]
    return min(hits, key=lambda r: r["median_us"]) if hits else None


def collect() -> dict:
    sweep = _sweep(RES / "h200_fp8_run2_sweep.json")
    meta = json.loads((RES / "h200_fp8_run2_sweep.json").read_text())
    probe = (RES / "h200_fp8_run2_probe_decode.log").read_text()
    us = lambda pat: float(re.search(pat + r"\s+([\d.]+) us", probe).group(1))
    series = {}

    def add(name, m, k, n, t_op, t_bf16, source, cfg=None):
        series.setdefault(name, []).append(dict(M=m, K=k, N=n, us=t_op, bf16_us=t_bf16,
                                                speedup=t_bf16 / t_op, source=source,
                                                config=cfg))

    add("fp8_per_channel_a16 (W8A16)", 1, 8192, 8192, us(r"w8a16 mma 16x64x256 w4s4 sk2"),
        us(r"bf16 dot"), "run2 probe, single dispatch", "16x64x256 w4 s4 split 2")
    rows = [("fp8_per_channel_a16 (W8A16)", 8192, 8192, (16,), r"mma:16x64x128/w4s3/sk2/u4"),
            ("fp8_per_channel_a16 (W8A16)", 8192, 8192, (4096,), r"swap:256x128x64/w8s3"),
            ("fp8_ptpc (W8A8 per-token)", 8192, 8192, (16,),
             r"fp8_ptpc:cfg\[mma:16x64x256/w4s4/sk2\]"),
            ("fp8_ptpc (W8A8 per-token)", 8192, 8192, (4096,), r"64x128x128/w4s4/g16/p128"),
            ("XLA fp8 per-tensor (cuBLASLt)", 8192, 8192, (16, 4096), r"xla_fp8"),
            ("fp8_block (W8A8 block-scaled)", 7168, 24576, (16,),
             r"fp8_block:cfg\[mma:16x64x256/w4s4\]"),
            ("fp8_block (W8A8 block-scaled)", 7168, 24576, (4096,), r"64x128x128/w4s4/g16/p128")]
    for name, k, n, ms, pat in rows:
        for m in ms:
            op, base = _pick(sweep, k, n, m, pat), _pick(sweep, k, n, m, r"^bf16$")
            if op and base:
                add(name, m, k, n, op["median_us"], base["median_us"], "run2 sweep harness v2",
                    op.get("config"))
    return {"device": meta.get("device"), "jax_version": meta.get("jax_version"),
            "copy_bandwidth_Bps": meta.get("copy_bandwidth_Bps"), "series": series}


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = collect()
    (RES / "h200_fp8_speedup_vs_bf16.json").write_text(json.dumps(data, indent=1))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, pts in data["series"].items():
        pts = sorted(pts, key=lambda p: p["M"])
        ax.plot([p["M"] for p in pts], [p["speedup"] for p in pts], marker="o", label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.8, color="gray", ls=":", lw=0.8)
    ax.text(1.05, 1.82, "issue target W8A16 M<=16", fontsize=7, color="gray")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("speedup vs bf16 jnp.dot (same run)")
    ax.set_title(f"FP8 kernels, {data['device']} -- K=N=8192 (block: 7168x24576)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RES / "h200_fp8_speedup_vs_bf16.png", dpi=120)


if __name__ == "__main__":
    main()
