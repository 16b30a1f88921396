"""Write benchmarks/REPORT.md from the committed H200 results (no device needed).

    python benchmarks/report.py            # regenerates REPORT.md from benchmarks/results/*.json
"""

from __future__ import annotations

import json
import math
import pathlib
import statistics

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results"


def geomean(v):
    return math.exp(sum(math.log(x) for x in v) / len(v))


def speedup_rows(recs, labels, ms, bw_stat, bw_name: str) -> list[str]:
    """Table rows: per label, geomean (min-max) speedup vs bf16 at each M, then `bw_stat` of the
    fraction of copy bandwidth at M <= 16 (no figure for labels that read no quantized weight)."""
    rows = ["| format : kernel | " + " | ".join(f"M={m}" for m in ms) + f" | {bw_name} |",
            "|---|" + "---|" * (len(ms) + 1)]
    for label in labels:
        cells = []
        for m in ms:
            v = [r["speedup_vs_bf16"] for r in recs if r["label"] == label and r["M"] == m]
            cells.append(f"{geomean(v):.2f}x ({min(v):.2f}-{max(v):.2f})" if v else "-")
        bw = [r["frac_copy_bw"] for r in recs if r["label"] == label and r["M"] <= 16]
        cells.append(f"{bw_stat(bw):.2f}" if bw and "scaled_dot" not in label else "-")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


def fp4_mx_section(path: pathlib.Path) -> list[str]:
    d = json.loads(path.read_text())
    recs = d["records"]
    bf16 = [r for r in recs if r["label"] == "bf16"]
    peak = max(r["tflops"] for r in bf16)
    out = [f"### NVFP4 / MXFP4 / MXFP8 ({path.name})", "",
           f"Device {d['device']}, jax {d['jax_version']}; measured in the same run: copy bandwidth "
           f"{d['copy_bandwidth_Bps'] / 1e12:.2f} TB/s, bf16 `jnp.dot` up to {peak:.0f} TFLOP/s. "
           "Times are CUPTI device time (median); speedup = bf16 `jnp.dot` time / kernel time on "
           "the same shape and M. 11 shapes (Llama-3-8B/70B, DeepSeek-V3).", "",
           "Geomean over shapes (min-max), and median fraction of copy bandwidth on weight bytes:", ""]
    labels = sorted({r["label"] for r in recs if r["label"] != "bf16" and "var[" not in r["label"]})
    out += speedup_rows(recs, labels, (1, 16, 4096), statistics.median, "BW frac M<=16")
    tf = [r for r in recs if r["M"] == 4096 and r["label"] in ("mxfp8:pallas_mxfp8", "scaled_dot_general_mxfp8", "bf16")]
    out += ["", "MXFP8 at M=4096 against `jax.nn.scaled_dot_general` (mxfp8 config) and bf16:", "",
            "| shape (K x N) | bf16 us | scaled_dot_general us | pallas_mxfp8 us | vs scaled_dot | vs bf16 |",
            "|---|---|---|---|---|---|"]
    for key in sorted({(r["K"], r["N"]) for r in tf}):
        t = {r["label"]: r["median_us"] for r in tf if (r["K"], r["N"]) == key}
        if len(t) == 3:
            out.append(f"| {key[0]}x{key[1]} | {t['bf16']:.0f} | {t['scaled_dot_general_mxfp8']:.0f} | "
                       f"{t['mxfp8:pallas_mxfp8']:.0f} | {t['scaled_dot_general_mxfp8'] / t['mxfp8:pallas_mxfp8']:.2f}x | "
                       f"{t['bf16'] / t['mxfp8:pallas_mxfp8']:.2f}x |")
    return out


def fp8_section(path: pathlib.Path) -> list[str]:
    d = json.loads(path.read_text())
    out = [f"### FP8 ({path.name})", "",
           f"Device {d['device']}, jax {d['jax_version']}; copy bandwidth {d['copy_bandwidth_Bps'] / 1e12:.2f} "
           "TB/s in the same run. Session 1's same-run ratios (sweep harness; its small-M figures "
           "include host dispatch), kept for the large-M block / per-token W8A8 tiles.", "",
           "| kernel | M | K x N | us | bf16 us | speedup | source |", "|---|---|---|---|---|---|---|"]
    for name, rows in d["series"].items():
        for r in rows:
            out.append(f"| {name} | {r['M']} | {r['K']}x{r['N']} | {r['us']:.1f} | {r['bf16_us']:.1f} | "
                       f"{r['speedup']:.2f}x | {r['source']} |")
    return out


def grid_section(paths: list[pathlib.Path], title: str) -> list[str]:
    """Geomean speedup vs bf16 over shapes (min-max) per kernel label and M; BW frac at M<=16."""
    recs, runs = [], []
    for path in paths:
        d = json.loads(path.read_text())
        recs += [r for r in d["records"] if "speedup_vs_bf16" in r]
        bws = [lane["copy_bandwidth_Bps"] / 1e12 for lane in d.get("lanes", [])] or \
              [d["copy_bandwidth_Bps"] / 1e12]
        runs.append(f"`{path.name}` (copy bandwidth {min(bws):.2f}-{max(bws):.2f} TB/s; "
                    f"command: `{d.get('command', '?')}`)")
    ms = sorted({r["M"] for r in recs})
    shapes = sorted({(r["K"], r["N"]) for r in recs})
    out = [f"### {title}", "", "Sources: " + "; ".join(runs) + ".", "",
           f"{len(shapes)} shapes (K x N); speedup = bf16 `jnp.dot` time / kernel time, same shape "
           "and M, same process; CUPTI device time. `xla` = jqlin's XLA reference path (f32 "
           "dequantize + dot), `xla_fp8` = XLA's own fp8 x fp8 per-tensor dot (cuBLASLt). "
           "Cells: geomean (min-max).", ""]
    return out + speedup_rows(recs, sorted({r["label"] for r in recs} - {"bf16"}), ms, max,
                              "BW frac M<=16 (max)")


def tp_section(path: pathlib.Path) -> list[str]:
    d = json.loads(path.read_text())
    out = [f"### Tensor parallel ({path.name})", "",
           f"{d['devices']} x {d['device']}, style {d['style']}, format "
           f"`{d['rows'][0]['format']}`; timing: {d['timing']}. Llama-3-8B-shaped layers, random "
           "weights. These wall times are dominated by something other than weight bytes (each "
           "extra layer at M=1 costs ~180 us on one GPU for ~0.22 GB, ~65 us of reading; host "
           "dispatch or per-kernel latency, which wall time cannot separate): they do not "
           "measure TP scaling. bench_tp.py now also records CUPTI device time (not yet run). "
           "NOTES.md: the megatron program of this run also had 5 collective-permutes per layer "
           "(splitting the fused q/k/v and gate/up outputs), since removed by interleaving "
           "the fused rows per shard (CPU-checked, not re-run here).", "",
           "| layers | M | 1 GPU us | 2 GPUs us | speedup | rel. diff vs 1 GPU |", "|---|---|---|---|---|---|"]
    for r in d["rows"]:
        out.append(f"| {r['layers']} | {r['m']} | {r['t1_us']:.0f} | {r['tn_us']:.0f} | "
                   f"{r['speedup']:.2f}x | {r['rel_err_vs_1']:.1e} |")
    return out


def main() -> int:
    lines = ["# H200 performance report", "",
             "Generated by `python benchmarks/report.py` from the JSON in `benchmarks/results/`; "
             "every figure was measured on the `nvidia-h200` device (one H200 SXM, jax 0.11.2). "
             "`benchmarks/NOTES.md` has each kernel version, its prediction and the runs.", "",
             "## Roofline", "",
             "* Memory: the XLA device copy measured 3.2-3.6 TB/s in these runs (KINDS.md's 4.3 TB/s "
             "was a torch copy; a read-mostly kernel can exceed the copy figure, so BW fractions "
             "above 1 occur). Decode (M <= 16) is bound by weight bytes: the ceiling over a "
             "bandwidth-bound bf16 dot is 2 B / bytes-per-weight: fp8 1.94-2.0x, NVFP4 3.56x, MXFP4 3.76x.",
             "* Arithmetic: bf16 `jnp.dot` 685-750 TFLOP/s at M=4096; XLA fp8 x fp8 (cuBLASLt, per-tensor) "
             "1085 TFLOP/s on 8192^2.",
             "* Decode limiter: not bytes. The fp8 x fp8 kernels and XLA's own fused multiply-reduce of "
             "the dequantized weight (the `xla` path at M=1) stream at ~1.0-1.2x the copy figure; the "
             "W8A16 kernels, which turn e4m3 into bf16 in the Triton body, reach 0.7-1.0 at M=1 and "
             "0.6-0.85 at M=16 (NOTES.md: an integer-op conversion did not help the 16-row MMA tile, "
             "so the conversion's place in the MMA pipeline, not its instruction count, limits).", "",
             "## How to reproduce", "",
             "```", "LANE0=\"tests grid:llama3-8b:1,16,64,256\" LANE1=\"grid:llama3-70b,deepseek-v3:1,16,64,256\" \\",
             "  bash benchmarks/run_device_x2.sh                # FP8 decode grid on nvidia-h200-x2 (~6 min)",
             "bash benchmarks/run_device.sh tests,full        # FP8: GPU tests + full grid, one GPU",
             "bash benchmarks/run_device_fp4.sh tests,bench     # NVFP4 / MX",
             "PYTHONPATH=. python benchmarks/bench_tp.py --out tp.json   # tensor parallel, 2+ GPUs",
             "python -m jqlin bench                             # a small version, any GPU", "```", "",
             "## Results", ""]
    decode = RESULTS / "h200_fp8_grid_s2_decode.json"
    if decode.exists():
        lines += grid_section([decode], "FP8, decode and mid M (all 11 shapes)") + [""]
    large = RESULTS / "h200_fp8_grid_s2_large.json"
    if large.exists():
        lines += grid_section([large], "FP8, prefill M (2 shapes; the rest of the grid did not "
                              "run); W8A16 heuristics at M > 512 changed after this run") + [""]
    for p in sorted(RESULTS.glob("h200_fp8_speedup_vs_bf16.json")):
        lines += fp8_section(p) + [""]
    for p in sorted(RESULTS.glob("h200_fp4_mx.json")):
        lines += fp4_mx_section(p) + [""]
    for p in sorted(RESULTS.glob("h200x2_tp.json")):
        lines += tp_section(p) + [""]
    lines += ["## Targets (issues 3 and 4)", "",
              "None of the speed targets is met yet; the measured figure, the bound and the limiter "
              "of each are in NOTES.md (FP8 status table and the NVFP4/MX section)."]
    (HERE / "REPORT.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {HERE / 'REPORT.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
