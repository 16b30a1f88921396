"""Write benchmarks/REPORT.md from the committed H200 results (no device needed).

    python benchmarks/report.py            # regenerates REPORT.md from benchmarks/results/*.json
"""

from __future__ import annotations

import json
import math
import pathlib

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
           "dequantize + dot; timed at M <= 16 only: at M=16 it already runs at 0.11-0.18x), `xla_fp8` = XLA's own fp8 x fp8 per-tensor dot (cuBLASLt). "
           "Cells: geomean (min-max).", ""]
    return out + speedup_rows(recs, sorted({r["label"] for r in recs} - {"bf16"}), ms, max,
                              "BW frac M<=16 (max)")


def sdg_section(path: pathlib.Path) -> list[str]:
    """MXFP8 (W and A) against jax.nn.scaled_dot_general's mxfp8 config and bf16, per shape."""
    recs = json.loads(path.read_text())["records"]
    want = ("mxfp8:pallas_mxfp8", "scaled_dot_general_mxfp8", "bf16")
    rows = [r for r in recs if r["label"] in want and r["M"] >= 1024]
    out = [f"MXFP8 (`mxfp8:pallas_mxfp8`; at M >= 1024 default mode runs the dense path) against "
           f"`jax.nn.scaled_dot_general` with the mxfp8 config (decomposed on Hopper) and bf16 "
           f"`jnp.dot` ({path.name}):", "",
           "| M | shape (K x N) | bf16 us | scaled_dot_general us | pallas_mxfp8 us | vs scaled_dot | vs bf16 |",
           "|---|---|---|---|---|---|---|"]
    for key in sorted({(r["M"], r["K"], r["N"]) for r in rows}):
        t = {r["label"]: r["median_us"] for r in rows if (r["M"], r["K"], r["N"]) == key}
        if len(t) == 3:
            sdg, mx = t["scaled_dot_general_mxfp8"], t["mxfp8:pallas_mxfp8"]
            out.append(f"| {key[0]} | {key[1]}x{key[2]} | {t['bf16']:.0f} | {sdg:.0f} | {mx:.0f} | "
                       f"{sdg / mx:.2f}x | {t['bf16'] / mx:.2f}x |")
    return out


def mgpu_section(path: pathlib.Path) -> list[str]:
    """The Mosaic GPU block kernel's variants against the Triton block kernel and bf16."""
    d = json.loads(path.read_text())
    recs = [r for r in d["records"] if "median_us" in r]
    labels = ["fp8_block:triton_block"] + sorted(
        {r["label"] for r in recs if r["label"].startswith("fp8_block:mgpu")},
        key=lambda l: (l.split("_g")[0], "_p" in l,
                       int(l.rsplit("_g", 1)[1].split("_")[0]) if "_g" in l else 0))
    out = [f"### Block FP8 W8A8 on Mosaic GPU ({path.name})", "",
           "TFLOP/s and speedup vs bf16 `jnp.dot` (same shape and M, same process, CUPTI device "
           "time). `triton_block`: the Triton kernel; `mgpu_block2_g<G>`: the Mosaic GPU wgmma "
           "kernel, 2 K-blocks per pipeline step, launch groups of G tile rows (1: row by row); "
           "`_p<P>`: a persistent grid of P CTAs (the SM count). "
           f"Command: `{d.get('command', '?')}`.", "",
           "| shape (K x N) | M | bf16 TFLOP/s | " + " | ".join(l.split(":")[1] for l in labels)
           + " |", "|---|---|---|" + "---|" * len(labels)]
    for k, n, m in sorted({(r["K"], r["N"], r["M"]) for r in recs}):
        t = {r["label"]: r for r in recs if (r["K"], r["N"], r["M"]) == (k, n, m)}
        if "bf16" not in t:
            continue
        cells = [f"{t[l]['tflops']:.0f} ({t[l]['speedup_vs_bf16']:.2f}x)" if l in t else "-"
                 for l in labels]
        out.append(f"| {k}x{n} | {m} | {t['bf16']['tflops']:.0f} | " + " | ".join(cells) + " |")
    return out


def tp_section(path: pathlib.Path) -> list[str]:
    d = json.loads(path.read_text())
    out = [f"### Tensor parallel ({path.name})", "",
           f"{d['devices']} x {d['device']}, format `{d['rows'][0]['format']}`, Llama-3-8B-shaped "
           f"layers with random weights; timing: {d['timing']}. `device` columns are the ones "
           "to read: wall time at these sizes is host dispatch. Each row also says whether the "
           "deterministic logits on the GPUs were bitwise those of one GPU.", "",
           "| layers | style | M | 1 GPU device us | 2 GPUs device us | device speedup | wall speedup "
           "| rel. diff (default mode) | det bitwise |", "|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        out.append(f"| {r['layers']} | {r['style']} | {r['m']} | {r['device_t1_us']:.0f} | "
                   f"{r['device_tn_us']:.0f} | {r['device_speedup']:.2f}x | {r['speedup']:.2f}x | "
                   f"{r['rel_err_vs_1']:.1e} | {r['det_bitwise']} |")
    return out


def det_schedule_section(path: pathlib.Path) -> list[str]:
    """Deterministic K schedules of the NVFP4 / MX kernels: time / default mode's, per M."""
    recs = [r for r in json.loads(path.read_text())["records"] if "median_us" in r]
    t = {(r["K"], r["N"], r["M"], r["label"]): r["median_us"] for r in recs}
    ms = sorted({r["M"] for r in recs})
    out = [f"### NVFP4 / MX deterministic K schedules ({path.name})", "",
           "Time relative to default mode (same shape and M, same process); geomean (min-max) "
           f"over {len({(r['K'], r['N']) for r in recs})} shapes. `[det]` is the shipped "
           "deterministic config (block_k 256 for e2m1, 128 for e4m3; split to ~2 programs/SM "
           "by N); each `det-*` row is one M-independent candidate schedule.", "",
           "| schedule | " + " | ".join(f"M={m}" for m in ms) + " |",
           "|---|" + "---|" * len(ms)]
    for fmt, kern in (("nvfp4_a16", "pallas_nvfp4"), ("mxfp8_a16", "pallas_mxfp8")):
        base = f"{fmt}:{kern}"
        labels = [f"{base}[det]"] + sorted({r["label"] for r in recs
                                            if r["label"].startswith(f"{fmt}:var[det")})
        for label in labels:
            cells = []
            for m in ms:
                v = [t[k[:3] + (label,)] / t[k[:3] + (base,)] for k in t
                     if k[2] == m and k[3] == base and k[:3] + (label,) in t]
                cells.append(f"{geomean(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "-")
            rows = f"| {label} | " + " | ".join(cells) + " |"
            out.append(rows)
    return out


# The newest measurement of every (format, kernel, M): later entries replace earlier ones for
# the M they list (None: every M in the file).
CURRENT = (
    ("h200_fp8_grid_s2_decode.json", None), ("h200_fp8_grid_s2_large.json", None),
    ("h200_fp8_grid_s3_large.json", None), ("h200_fp8_grid_s4_large.json", None),
    ("h200_fp8_grid_s3_m1.json", (1,)), ("h200_fp8_grid_s4_kparts.json", None),
    ("h200_fp4_mx_grid_s3.json", None), ("h200_fp4_mx_grid_s3_after.json", (1, 256)),
    ("h200_fp8_grid_s5_paths.json", None), ("h200_fp8_grid_s6_w8a16.json", None),
    ("h200_fp8_grid_s7_det.json", None), ("h200_fp8_grid_s7_large.json", None),
    ("h200_fp8_grid_s7_decode.json", None), ("h200_fp8_grid_s7_per_tensor_a16.json", None),
    # later grids through the dispatcher, in session order (session 8's withdrawn variants,
    # s8_convert / s8_wg4, left out)
    ("h200_fp8_grid_s9_scales.json", None), ("h200_fp8_grid_s9_det.json", None),
    ("h200_fp8_grid_s9_per_tensor.json", None), ("h200_fp8_grid_s10_stream.json", None),
    ("h200_fp8_grid_s11_det.json", None), ("h200_fp8_grid_s11_det_narrow.json", None),
    ("h200_fp8_grid_a16_det_s14.json", None),
    ("h200_nvfp4_grid_s12.json", None), ("h200_fp4_grid_a16_s13.json", None),
    ("h200_fp4_grid_w4a4_s13.json", None), ("h200_fp4_grid_a16_det_s14.json", None),
    ("h200_fp4_grid_det_groups_s15.json", None), ("h200_fp8_grid_wide_det_s16.json", None),
    ("h200_fp4_grid_det_halves_s16.json", None),
    ("h200_fp8_grid_predecode_s17.json", None), ("h200_fp4_grid_det_predecode_s17.json", None),
    ("h200_fp8_grid_stored_groups_s17.json", None),
    ("h200_fp4_grid_stored_groups_s17.json", None),
    ("h200_fp8_grid_reload_s18.json", None), ("h200_fp8_grid_reload_m16384_s18.json", None),
    ("h200_fp4_grid_reload_s18.json", None), ("h200_fp4_grid_mx_rounded_s18.json", None),
    ("h200_fp8_grid_mid_m_s19.json", None), ("h200_fp4_grid_mid_m_s19.json", None),
    ("h200_fp8_grid_widen_s20.json", None), ("h200_fp4_grid_s20.json", None),
    ("h200_fp8_grid_widen_m1024_m16384_s20.json", None),
    ("h200_fp4_grid_dequant_s21.json", None), ("h200_fp4_grid_asm_s22.json", None),
    ("h200_fp4_grid_rowfinish_s22.json", None), ("h200_fp8_grid_decode_s23.json", None),
    ("h200_fp4_grid_det_predecode_m2048_s23.json", None),
    ("h200_fp8_grid_dense_decode_s24.json", None), ("h200_fp4_grid_m2048_s24.json", None),
    ("h200_fp8_grid_decode_s26.json", None), ("h200_fp4_grid_decode_s28.json", None),
    ("h200_fp4_grid_w4a4_decode_s28.json", None),
    # deterministic mode on the decode kernel (session 29): 8 shapes, then the 4 with K parts
    # two a CTA (their rows in s29b are the previous launch)
    ("h200_fp4_decode_det_s29b.json", None), ("h200_fp4_decode_det_s29c.json", None),
    # session 30: deterministic mode at M=2 / 8; block scales at M=2-8 on the decode kernel;
    # NVFP4 / MXFP4 M=1 and 16 with the committed decode (the MX experiments' baseline)
    ("h200_decode_det_m2_8_s30.json", None), ("h200_fp4_decode_det_m2_8_s30.json", None),
    ("h200_decode_block_dispatch_m2_8_s30.json", None), ("h200_mx_two_multiply_s30a.json", None),
    # W4A4 with the fused activation operand (10 of 11 shapes; 18432x7168 keeps s28's rows)
    ("h200_fp4_grid_w4a4_fused_s30.json", None),
)


def _fp4_family(name: str) -> bool:
    """Whether a results file is an NVFP4 / MX grid (else FP8)."""
    return name.startswith(("h200_fp4", "h200_nvfp4"))


# ops of a probe run listed in CURRENT for its dispatcher rows (the explicit launches and the
# replaced kernel stay in its own table, not in the current figures or plots)
PROBE_OPS = ("plain_", "group_a16_mgpu")


def _probe_row(label: str) -> bool:
    return label.split(":")[-1].startswith(PROBE_OPS)


def current_records() -> list[dict]:
    """Records of the committed grids, each tagged with its `source` file; where a later run
    re-measured a (shape, M, label) -- or, for listed M, a whole M -- its records win. Probe
    ops (PROBE_OPS) are left out."""
    by_key: dict[tuple, dict] = {}
    for name, ms in CURRENT:
        path = RESULTS / name
        if not path.exists():
            continue
        d = json.loads(path.read_text())
        rows = [dict(r, source=name, copy_bw=d.get("copy_bandwidth_Bps")) for r in d["records"]
                if (ms is None or r["M"] in ms) and not _probe_row(r["label"])]
        for m in (ms or ()):
            fp4 = _fp4_family(name)  # a re-run replaces its family's rows at that M
            by_key = {k: v for k, v in by_key.items()
                      if not (k[2] == m and _fp4_family(v["source"]) == fp4)}
        for r in rows:
            by_key[(r["K"], r["N"], r["M"], r["label"])] = r
    return list(by_key.values())


def plots() -> list[str]:
    """Speedup-vs-M plots of the current records (bench_matmul.plot), FP8 and NVFP4/MX."""
    import sys
    sys.path.insert(0, str(HERE))
    try:
        from bench_matmul import plot
    except ImportError:  # matplotlib / jqlin not importable: keep the committed PNGs
        return []
    recs = current_records()
    made = []
    for fp4, png in ((False, "h200_fp8_grid_s3_all.png"), (True, "h200_fp4_mx_grid_s3_all.png")):
        rows = [r for r in recs if _fp4_family(r["source"]) == fp4]
        if rows:
            plot({"device": "NVIDIA H200", "records": rows}, RESULTS / png)
            made.append(f"`{png}` (from " + ", ".join(
                f"`{n}`" for n in sorted({r["source"] for r in rows})) + ")")
    return made


def main() -> int:
    lines = ["# H200 performance report", "",
             "Generated by `python benchmarks/report.py` from the JSON in `benchmarks/results/`; "
             "every figure was measured on H200 SXM GPUs (jax 0.11.2) through the device tool, "
             "one measuring process per GPU. `benchmarks/NOTES.md` has each kernel version, its "
             "prediction and the runs.", "",
             "## Roofline", "",
             "* Memory: the XLA device copy measured 3.0-3.7 TB/s in these runs (KINDS.md's 4.3 TB/s "
             "was a torch copy; a read-mostly kernel can exceed the copy figure, so BW fractions "
             "above 1 occur: bf16 `jnp.dot` itself reads at 1.1-1.3x it). Decode (M <= 16) is "
             "bound by weight bytes: the ceiling over a bandwidth-bound bf16 dot is 2 B / "
             "bytes-per-weight: fp8 1.94-2.0x, NVFP4 3.56x, MXFP4 3.76x, MXFP8 1.94x.",
             "* Arithmetic: bf16 `jnp.dot` 685-750 TFLOP/s at M=4096; XLA fp8 x fp8 (cuBLASLt, "
             "per-tensor) 1.57-1.61x bf16 at M >= 1024 (up to ~1280 TFLOP/s).",
             "* Decode limiter: not bytes. The fp8 x fp8 kernels and XLA's own fused multiply-reduce "
             "of the dequantized weight (the `xla` path at M=1) stream at ~1.0-1.2x the copy figure; "
             "the W8A16 gemv reaches 0.56-1.06 at M=1, the 16-row MMA tile <= 0.82 at M=16 (the "
             "e4m3 -> bf16 conversion's place in the MMA pipeline, NOTES.md), and the e2m1 kernels "
             "are bound by decode instructions and latency (2.0-2.6 T weights/s whatever the bytes). "
             "Session 9 (ncu, `h200_s9_ncu_decode.txt`): the Mosaic W8A16 kernel on 28672x8192 "
             "at M=1 reads at 79-84% of DRAM peak (a bf16 stream through it: 91%), no pipe busy.",
             "", "## How to reproduce", "",
             "```",
             "# lanes side by side, one process per GPU (nvidia-h200-x4; ~8 min per call):",
             "LANE0=\"tests grid:llama3-8b:1,16,64,256\" LANE1=\"fp4:all:1,16,64,256,1024,4096,16384\" \\",
             "  GPUS2=2,3 LANE2=\"tp\" \\",
             "  bash benchmarks/run_device_lanes.sh   # -> $OUT/results.tgz; merge_lanes.py -> results/",
             "PYTHONPATH=. python benchmarks/bench_matmul.py --out out   # FP8 grid, one GPU",
             "PYTHONPATH=. python benchmarks/bench_fp4_mx.py --parts grid --out out   # NVFP4 / MX",
             "PYTHONPATH=. python benchmarks/bench_tp.py --out tp.json   # tensor parallel, 2+ GPUs",
             "python -m jqlin bench                             # a small version, any GPU", "```",
             "Each table names its source file, whose `command` field is the exact device command "
             "(session 2's `run_device_x2.sh` is now `run_device_lanes.sh`; its `TP=1` prologue "
             "became the `tp` lane step).",
             "", "## Results", ""]
    sections = [
        ("h200_fp8_grid_s3_m1.json", "FP8 at M=1 (11 shapes; session 3, W8A16 gemv 1x8x256)"),
        ("h200_fp8_grid_s2_decode.json", "FP8, decode and mid M (11 shapes; session 2: its M=1 "
         "W8A16 rows are superseded by the table above)"),
        ("h200_fp8_grid_s3_large.json", "FP8, prefill M (8 shapes; session 3)"),
        ("h200_fp8_grid_s4_large.json", "FP8, prefill M, the other 3 shapes (session 4: "
         "8192x57344 with one lane step per M so XLA's autotuning fits; 8192x8192 and "
         "8192x10240 with the current W8A16 tiles)"),
        ("h200_fp8_grid_s4_kparts.json", "FP8 at M=256 and 4096 after session 4's "
         "deterministic fp8 x fp8 schedule (K in 8 in-program parts; 2 shapes)"),
        ("h200_fp8_grid_s5_paths.json", "FP8 at M=1024 and 4096 with the default-mode prefill "
         "paths (session 5; 7 shapes): whole-K scales run one XLA GEMM of the codes, fp8_block "
         "the Mosaic GPU wgmma kernel; `[det]` rows are the Triton kernels"),
        ("h200_fp8_grid_s6_w8a16.json", "FP8 W8A16 at M=1-1024 after the Mosaic GPU W8A16 kernel "
         "was registered (session 6; 11 shapes): default mode runs it at every M for block "
         "scales and from M=2 for per-channel (the dense path from 1024); `[det]` rows are the "
         "Triton kernels"),
        ("h200_fp8_grid_s7_det.json", "FP8 W8A16 at M=1-4096 with deterministic mode on the "
         "Mosaic GPU kernel (session 7; 11 shapes, M=4096 on 3): `[det]` rows run K in "
         "det_k_parts(K) parts as K ranges or in-CTA parts (fp8_block_a16_mgpu.det_params)"),
        ("h200_fp8_grid_s7_large.json", "FP8 block W8A8 and W8A16 at M=1024 and 4096 on the 4 "
         "shapes session 5 missed (session 7); `[det]` rows: Triton for W8A8, Mosaic for W8A16"),
        ("h200_fp8_grid_s7_decode.json", "FP8 W8A16 at M=1 and 16 with two K-blocks per "
         "pipeline step (session 7, 6 shapes; supersedes the table above there)"),
        ("h200_fp8_grid_s7_per_tensor_a16.json", "FP8 per-tensor W8A16 at M=1-256 with the "
         "session-7 settings (11 shapes; `[det]`: the Mosaic kernel's deterministic schedule)"),
        ("h200_probe_streams_s8.json", "What bounds the Mosaic W8A16 kernel at decode (session "
         "8 probe, benchmarks/probe_w4_mgpu.py, 4 shapes): the kernel on bf16 weights (twice the "
         "bytes, no conversion) runs at XLA's bf16 speed; on fp8, int8 and int4 bytes a 128x128 "
         "block costs ~0.6 us per SM whatever its bytes"),
        ("h200_probe_wg4_s8.json", "The same with four compute warpgroups (256-row weight "
         "tiles, `_wg4`) and two K-blocks per step (session 8, 6 shapes): no gain for fp8, "
         "+9-17% for the int4 stream on large shapes"),
        ("h200_probe_convert_s8.json", "e4m3 -> bf16 by inline PTX (`fp8_stream`, one cvt per "
         "pair plus integer ops; removed) against Mosaic's astype through f32 "
         "(`fp8_astype_stream`), session 8: the PTX route is 0-12% slower"),
        ("h200_fp8_grid_s8_convert.json", "FP8 W8A16 through the dispatcher with that inline-PTX "
         "conversion (session 8, withdrawn: 5-13% slower than session 7 at M >= 256)"),
        ("h200_fp8_grid_s9_scales.json", "FP8 W8A16 at M=1-256 with the Mosaic kernel reading "
         "block and channel scales as stored and x unpadded (session 9, 11 shapes; per-channel "
         "on it from M=1, per-tensor M=1 on the Triton gemv then; supersedes the W8A16 tables above "
         "at these M)"),
        ("h200_fp8_grid_s9_det.json", "FP8 W8A16 deterministic mode with default mode's decode "
         "launch (each CTA storing its K parts as slabs; session 9, 11 shapes)"),
        ("h200_fp8_grid_s9_per_tensor.json", "FP8 per-tensor W8A16 with its scale read as "
         "stored, on the Mosaic kernel from M=1 (session 9, 11 shapes)"),
        ("h200_fp8_sweep_stream_s10.json", "FP8 W8A16 decode: K ranges (`_ranges`, session 9's "
         "launch) against stream-K (`_stream`: every CTA the same run of (weight tile, K-step) "
         "steps) and stream-K closing its pieces by a select (`_stream_select`, removed), "
         "fp8_block_a16 on the Mosaic kernel directly (session 10, 11 shapes)"),
        ("h200_fp8_grid_s10_stream.json", "FP8 W8A16 at M=1-256 with stream-K where "
         "decode_params picks it (session 10, 11 shapes, one GPU; supersedes the W8A16 tables "
         "above at these M)"),
        ("h200_fp8_sweep_det_s11.json", "FP8 W8A16 deterministic decode: session 10's launch "
         "(`_det_ranges`) against the tiles' K parts streamed whole over up to one CTA per SM "
         "where det_params' model picks it, with 16-row x tiles (`_det_x16`) and with 8-row "
         "ones on the GPU (`_det`, launch_params); fp8_block_a16 on the Mosaic kernel "
         "directly (session 11, 11 shapes)"),
        ("h200_fp8_sweep_det_narrow_s11.json", "FP8 W8A16 deterministic at M=64-256: in-CTA "
         "parts on x tiles narrowed to fill the SMs in the same waves (`_det`, wherever the "
         "model took in-CTA parts, also against the stream) against without (`_det_wide`); "
         "det_params narrows only where it settles on in-CTA parts (session 11, 11 shapes)"),
        ("h200_fp8_grid_s11_det.json", "FP8 W8A16 at M=1-256 through the dispatcher with "
         "deterministic decode streaming whole K parts (session 11, 11 shapes, one GPU; "
         "before the narrowed in-CTA parts, which change `[det]` at M=256 on 4096x4096 and "
         "14336x4096: see the sweep above)"),
        ("h200_fp8_grid_s11_det_narrow.json", "The narrowed in-CTA parts through the "
         "dispatcher on the shapes they change (session 11; supersedes those `[det]` rows)"),
        ("h200_fp8_sweep_det_fold_s12.json", "FP8 W8A16 deterministic decode: streamed parts "
         "one slab each (`_det`) vs folded by each tile's first CTA (`_det_fold`; session 12, "
         "adopted up to 16-row x tiles), beside default mode (`_auto`), 11 shapes, same run"),
        ("h200_nvfp4_mgpu_s12.json", "NVFP4 on the Mosaic GPU kernel (`var[mgpu]`, session 12) "
         "vs the Triton kernel (`var[triton]`), W4A16 and W4A4, 11 shapes, same run "
         "(`pallas_nvfp4`: the dispatcher, already Mosaic below M=256 there)"),
        ("h200_nvfp4_mgpu_blocks_s12.json", "The Mosaic NVFP4 kernel with 4 K-blocks a step "
         "(`var[mgpu-4blocks]`) vs the dispatcher's 2 (session 12, 11 shapes, same run)"),
        ("h200_nvfp4_grid_s12.json", "NVFP4 through the dispatcher after session 12 (Mosaic in "
         "default mode up to M=256 and in deterministic mode at every M; 8 Llama-3 shapes)"),
        ("h200_mx_mgpu_s12.json", "MXFP4 / MXFP8 on the Mosaic GPU kernel (`var[mgpu]`) vs "
         "the Triton kernel (`var[triton]`, = `pallas_*` in that run), 11 shapes, same run "
         "(session 12; the dispatcher takes the Mosaic kernel since)"),
        ("h200_nvfp4_mx_words_s13.json", "e2m1 codes read as 32-bit words "
         "(`var[mgpu-words]`, session 13) vs byte loads (`pallas_*` in that run), same launch, "
         "11 shapes, same run"),
        ("h200_fp4_grid_a16_s13.json", "Weight-only NVFP4 / MXFP4 / MXFP8 through the "
         "dispatcher after session 13's words (deterministic mode before its 4 K-blocks a "
         "step), 11 shapes"),
        ("h200_fp4_det_blocks_s13.json", "Deterministic launches with 4 K-blocks a step "
         "(`[det]`, session 13) vs the same partition at 2 (`var[mgpu-det-2blocks]`) and with "
         "byte loads (`var[mgpu-det-bytes]`), 11 shapes at M=1/16, 3 at 256/4096, same run"),
        ("h200_fp4_grid_w4a4_s13.json", "NVFP4 W4A4 / MXFP4 / MXFP8 W8A8 through the "
         "dispatcher after session 13 (quantized activation's exact bf16 form on the Mosaic "
         "kernel up to M=256), 11 shapes"),
        ("h200_fp4_det_straddle_s14.json", "Deterministic streamed K parts in steps that "
         "straddle the parts' ends (`[det]`, session 14: K=7168's parts of 7 K-blocks in steps "
         "of 4 or 2) vs one block a step (`var[mgpu-det-s13]`) and (NVFP4) a stream re-shared "
         "for 4-block steps (`var[mgpu-det-4blocks-reshared]`), same run"),
        ("h200_fp8_sweep_det_straddle_s14.json", "FP8 W8A16 deterministic decode with steps "
         "of 2 across the parts' ends (`_det`, session 14) vs one block a step (`_det_s13`), "
         "beside default mode (`_auto`), same run"),
        ("h200_fp4_det_stream_s14.json", "Deterministic streamed K parts (`var[mgpu-det-"
         "streamed]`) where session 11's stream model kept in-CTA parts (`[det]` in that run), "
         "same run (session 14)"),
        ("h200_fp8_sweep_det_model_s14.json", "FP8 W8A16 deterministic mode under session 14's "
         "stream model (`_det`) vs without the stream (`_det_cta`), same run"),
        ("h200_fp4_grid_a16_det_s14.json", "Weight-only NVFP4 / MXFP4 / MXFP8 through the "
         "dispatcher in both modes after session 14 (straddling steps, the stream model by "
         "folded slabs), 11 shapes at M=1/16"),
        ("h200_fp8_grid_a16_det_s14.json", "FP8 W8A16 (per-tensor, per-channel, block) "
         "through the dispatcher in both modes after session 14, 11 shapes at M=1/16"),
        ("h200_fp4_det_ranges_s14.json", "Deterministic mode at M=64/256 as default "
         "mode's K ranges storing their parts (`var[mgpu-det-stored-ranges]`) vs det_params' "
         "launch (`[det]`), session 14, same run (not adopted)"),
        ("h200_fp4_kparts_s14.json", "Default mode at M=128/256 with its K ranges as 2 or 8 "
         "in-CTA parts (`var[mgpu-kparts<P>]`) vs one, session 14, same run (not adopted)"),
        ("h200_fp8_sweep_det_halves_s15.json", "FP8 W8A16 deterministic mode (`_det`, "
         "session 14's one left fold) vs a two-group order launched as two K ranges "
         "(`_det_halves`), beside default mode, 11 shapes at M=16/64/256 (session 15 call 1)"),
        ("h200_fp4_det_halves_s15.json", "NVFP4 / MXFP8 weight-only: the same probe "
         "(`var[mgpu-det-halves]`) beside both modes at M=64/256 (session 15 call 1)"),
        ("h200_fp8_sweep_det_groups_s15.json", "FP8 W8A16 deterministic mode with the "
         "two-group order (`_det`, session 15) vs one left fold (`_det_g1`) vs default, the 7 "
         "shapes with N <= 16384, same run"),
        ("h200_fp4_grid_det_groups_s15.json", "NVFP4 / MXFP8 weight-only through the "
         "dispatcher in both modes with the two-group order, 5 shapes (session 15)"),
        ("h200_fp8_sweep_det_park_s15.json", "The two-group order's parked launch (`_det`) vs "
         "one fold (`_det_g1`) and one fold writing float32 (`_det_g1_f32`), M=256/4096, same "
         "run (session 15)"),
        ("h200_fp4_det_park_s15.json", "NVFP4 / MXFP8: the two-group order (`[det]`) vs one "
         "fold (`var[mgpu-det-one-fold]`) at M=256/4096, same run (session 15)"),
        ("h200_fp8_sweep_parts_cost_s16.json", "FP8 W8A16 in-CTA parts at 128-row x tiles "
         "(`_k_parts2`, `_k_parts8`, `_det`, `_det_g1`) vs one K range (`_auto`), M=1024/4096, "
         "same run (session 16 call 1: the spills' per-step cost)"),
        ("h200_fp8_sweep_halves_s16.json", "FP8 W8A16 with `wgmma_halves` (`_wgmma_halvesTrue`, "
         "`_h`) vs without, both modes, M=256/4096, same run (session 16 call 2; `_det_h` is "
         "deterministic mode's launch since)"),
        ("h200_fp8_sweep_det_groups_s16.json", "FP8 W8A16 deterministic mode after session 16 "
         "(`_det`: two groups, wgmma_halves at 128-row in-CTA parts) vs one fold (`_det_g1`) vs "
         "default, the 7 shapes with N <= 16384, same run (session 16 call 8)"),
        ("h200_fp8_grid_wide_det_s16.json", "FP8 W8A16 through the dispatcher in both modes, "
         "the 4 shapes with N > 16384, M=256/4096 (session 16 call 6)"),
        ("h200_fp4_det_halves_decode_s16.json", "NVFP4 / MXFP8: the group decode's wgmma_halves "
         "(`var[mgpu-det-halves-decode]`) beside both modes, M=256/4096 (session 16 call 3)"),
        ("h200_fp4_grid_det_halves_s16.json", "NVFP4 / MXFP8 weight-only through the dispatcher "
         "in both modes after session 16 (MXFP8 with the halves), 5 shapes, M=256/4096"),
        ("h200_fp8_sweep_predecode_s17.json", "FP8 W8A16 with `predecode` (`_pd`: weights "
         "converted to bf16 by XLA first, wgmma's A from shared memory) vs without, both modes, "
         "M=1024/4096, 11 shapes, same run (session 17 call 1)"),
        ("h200_fp8_sweep_predecode_m_s17.json", "The same at M=2048/16384, 6 shapes (session 17 "
         "call 2)"),
        ("h200_fp8_sweep_predecode_x64_s17.json", "Predecoded deterministic launches on 64-row "
         "x tiles (`_det_x64`) vs 128-row, M=4096/16384 (session 17 call 5; not adopted)"),
        ("h200_fp8_sweep_groups_store_s17.json", "Predecoded deterministic launches with "
         "stored groups (`_det_gs`) vs the parked first group (`_det`), M=4096/16384, the 7 "
         "shapes with N <= 16384, same run (session 17 call 6)"),
        ("h200_fp8_grid_predecode_s17.json", "FP8 W8A16 (block, channel) through the "
         "dispatcher in both modes with predecode, M=4096/16384, 11 shapes (session 17 call 4)"),
        ("h200_fp8_grid_stored_groups_s17.json", "The same with stored groups, M=4096 "
         "(session 17 call 7: figures of record)"),
        ("h200_fp4_det_predecode_s17.json", "NVFP4 / MXFP4 / MXFP8: deterministic launches on "
         "predecoded codes (`var[mgpu-det-predecode]`) beside both modes, M=1024/4096 "
         "(session 17 call 2)"),
        ("h200_fp4_det_predecode_x64_s17.json", "The same on 64-row x tiles, M=4096 (session "
         "17 call 5; not adopted)"),
        ("h200_fp4_det_groups_store_s17.json", "The same with stored groups, M=4096 (session 17 "
         "call 6)"),
        ("h200_fp4_grid_det_predecode_s17.json", "NVFP4 / MXFP4 / MXFP8 weight-only through the "
         "dispatcher in both modes with MX predecode, 5 shapes, M=1024/4096 (session 17 call 3)"),
        ("h200_fp4_grid_stored_groups_s17.json", "The same with stored groups, M=4096 (session "
         "17 call 7: figures of record)"),
        ("h200_fp8_sweep_groups_reload_s18.json", "Deterministic launches with reloaded "
         "groups (`_det_gr`: the first group's sum read back by its CTA) vs the dispatcher's "
         "(`_det`: M=1024 parked, M=4096 predecoded and stored), the 7 shapes with N <= 16384, "
         "same run (session 18 call 1; `_det_gr4`: 4 stages, not adopted)"),
        ("h200_fp4_det_groups_reload_s18.json", "NVFP4 / MXFP4 / MXFP8: deterministic mode "
         "beside reloaded groups (`var[mgpu-det-reload]`), M=4096, 4 shapes (session 18 call "
         "1)"),
        ("h200_fp8_grid_reload_s18.json", "FP8 W8A16 (block, channel) through the dispatcher "
         "in both modes with reloaded groups, M=4096, 11 shapes (session 18 call 2: figures "
         "of record)"),
        ("h200_fp8_grid_reload_m16384_s18.json", "fp8_block_a16 the same at M=16384 (session "
         "18 call 3)"),
        ("h200_fp4_grid_reload_s18.json", "NVFP4 / MXFP4 / MXFP8 weight-only through the "
         "dispatcher in both modes with reloaded groups, M=4096, 5 shapes (session 18 call 2)"),
        ("h200_fp4_grid_mx_rounded_s18.json", "MXFP4 / MXFP8 the same after their kernel "
         "writes bf16 itself (session 18 call 3: figures of record)"),
        ("h200_fp8_sweep_default_parts_s19_call1.json", "fp8_block_a16 default mode's "
         "predecoded prefill launch: one K range (`_auto`) vs in-CTA parts (`_k_parts2`, "
         "`_k_parts8`), group_m 4 / 16 and deterministic mode's launch, M=4096/16384, 5 shapes, "
         "same run (session 19 call 1)"),
        ("h200_fp8_sweep_default_parts_s19.json", "The same with `_k_parts4`, repeated (session "
         "19 call 2; k_parts=2 adopted: PREFILL_K_PARTS)"),
        ("h200_fp8_sweep_mid_m_s19.json", "FP8 formats at M=256-1024: the dispatcher beside "
         "each path it could take (`path_pallas` Triton, `path_dense` one XLA GEMM, `path_mgpu` "
         "Mosaic), 2 shapes, same run (session 19 call 1)"),
        ("h200_fp8_sweep_mid_m_w8a8_s19.json", "fp8_per_tensor / fp8_ptpc (W8A8): Triton vs "
         "dense at M=16-512, 4 shapes, same run (session 19 call 2; dense from M=128 adopted: "
         "W8A8_DENSE_MIN_M)"),
        ("h200_fp8_sweep_mid_m_a16_s19.json", "fp8_per_tensor_a16 / fp8_per_channel_a16: Mosaic "
         "vs dense at M=512-1024, the other 2 shapes (session 19 call 3; MID_M_MIN_FILL)"),
        ("h200_fp4_mid_m_s19.json", "NVFP4 / MXFP4 / MXFP8 weight-only and NVFP4 W4A4 at "
         "M=256-768: the dispatcher (Triton from 257) beside `var[dense]`, `var[mgpu]`, "
         "`var[pallas]`, 3 shapes, same run (session 19 call 3)"),
        ("h200_fp8_grid_mid_m_s19.json", "FP8 formats through the dispatcher at M=512/768 after "
         "session 19's mid-M rules, default mode, 2 shapes (call 4; cut by its time box)"),
        ("h200_fp4_grid_mid_m_s19.json", "NVFP4 / MXFP4 / MXFP8 weight-only and NVFP4 W4A4 "
         "through the dispatcher in both modes at M=512/768 after session 19's mid-M rule, 4 "
         "shapes (call 4: figures of record)"),
        ("h200_fp8_grid_widen_s20.json", "FP8 W8A16 (block, per-channel) through the "
         "dispatcher in both modes at M=4096 after session 20's Pallas widening pass and "
         "y written by the kernel, 11 shapes (call 3: figures of record)"),
        ("h200_fp8_grid_widen_m1024_m16384_s20.json", "The same at M=1024 and 16384 "
         "(deterministic mode for fp8_block_a16 only), 11 shapes (call 5)"),
        ("h200_fp8_grid_dense_decode_s24.json", "FP8 formats through the dispatcher at "
         "M=2/4/8, both modes, 11 shapes, after session 24's dense path for W8A16 whole-K "
         "scales at M=2-8 (call 4: figures of record)"),
        ("h200_fp8_sweep_a16_small_m_s24.json", "W8A16 whole-K scales at M=1-512: the "
         "dispatcher (Mosaic kernel) beside one XLA dot of the converted codes "
         "(`reduce_bfloat16`), 11 shapes, same run (session 24 call 3)"),
        ("h200_fp8_sweep_a16_m1_s24.json", "The same at M=1-8 on 4 shapes, with the XLA "
         "reference and the float32 formulation beside (session 24 call 2)"),
        ("h200_fp4_grid_m2048_s24.json", "NVFP4 / MXFP4 / MXFP8 (weight-only and W+A) in both "
         "modes at M=2048 after session 24's predecode rule (from 2048 rows except e2m1 "
         "words), 11 shapes (call 2: figures of record)"),
        ("h200_fp4_det_other_decode_m2048_s24.json", "Deterministic mode at M=2048: the "
         "dispatcher's decode beside the other (`var[mgpu-det-other-decode]`), 11 shapes, "
         "two passes in one process (session 24 call 1)"),
        ("h200_fp8_grid_decode_s26.json", "The three W8A16 formats through the dispatcher at "
         "M=1 and 16, default mode, 11 shapes: whole-K scales on the plain-pipeline decode "
         "kernel (fp8_a16_decode_mgpu), fp8_block_a16 the unchanged control (session 26 call "
         "8; figures of record)"),
        ("h200_fp4_grid_decode_s28.json", "NVFP4 / MXFP4 weight-only at M=1 and 16 through the "
         "dispatcher, now the plain-pipeline decode kernel (group_a16_decode_mgpu), beside "
         "group_a16_mgpu (path='mgpu', the previous default) and one explicit launch, 11 "
         "shapes, same run (session 28 call 3; figures of record)"),
        ("h200_fp4_grid_w4a4_decode_s28.json", "NVFP4 / MXFP4 W4A4 at M=1 and 16 through "
         "the dispatcher (the decode kernel on the quantized activation) beside group_a16_mgpu "
         "and bf16, 11 shapes, same run (session 28 call 5)"),
        ("h200_decode_block_plain_s29.json", "FP8 W8A16 128x128 block scales on the "
         "plain-pipeline decode kernel (plain_rule: its decode_params launch; plain_kS: K "
         "ranges) beside the Mosaic kernel the dispatcher ran then, M=1 and 16, 11 shapes "
         "(session 29 call 1; since then the dispatcher runs plain_rule's launch up to K = "
         "14336: fp8_paths.DECODE_BLOCK_MAX_K)"),
        ("h200_decode_det_plain_s29.json", "Per-channel W8A16 deterministic mode, M=1 and 16: "
         "the Mosaic kernel's det launch (the dispatcher's then) beside the decode kernel in "
         "the same order (plain_det, the same bits), 8 of 11 shapes (timed out; session 29 "
         "call 1)"),
        ("h200_decode_det_plain_s29b.json", "The same on the three DeepSeek shapes (session 29 "
         "call 3)"),
        ("h200_decode_det_range_parts_s29.json", "The deterministic decode kernel with 1, 2 or "
         "4 K parts a CTA beside the Mosaic kernel's det launch, 7 shapes, M=1 and 16 (session "
         "29 call 5: more parts a CTA ran slower)"),
        ("h200_fp4_decode_det_s29a.json", "NVFP4 / MXFP4 W4A16 deterministic mode: "
         "group_a16_mgpu's det launch (the dispatcher's then) beside the decode kernel in the "
         "same order, 3 of 11 shapes (timed out; session 29 call 1)"),
        ("h200_fp4_decode_det_s29b.json", "The other 8 shapes, the dispatcher's deterministic "
         "mode on the decode kernel where a K part held whole steps, beside group_a16_mgpu's "
         "det launch (session 29 call 3)"),
        ("h200_fp4_decode_det_s29c.json", "K=7168 and MX K=14336 / 18432 after two K parts a "
         "CTA (range_parts): the decode kernel on every shape in deterministic mode (session "
         "29 call 4)"),
        ("h200_fp4_decode_det_range_parts_s29.json", "More K parts a CTA than the least, two "
         "shapes (session 29 call 5: slower or even)"),
        ("h200_decode_det_overlap_s30.json", "FP8 W8A16 per-channel deterministic mode with a "
         "step's two K-block chains issued together (plain_det_overlap, the same bits) beside "
         "the routed det launch, M=1 and 16, 5 shapes (session 30 call 1: slower or even; the "
         "option was removed after, commit 06b3456 has it)"),
        ("h200_fp4_decode_det_overlap_s30.json", "The same for NVFP4 / MXFP4 W4A16 "
         "(session 30 call 1: slower or even; MX up to 1.45x default)"),
        ("h200_decode_block_m2_8_s30.json", "FP8 W8A16 block scales at M=2 / 4 / 8: the decode "
         "kernel at its launch rule (plain_rule) beside the Mosaic kernel the dispatcher ran "
         "then, 11 shapes (session 30 call 2; routed since up to K = 14336)"),
        ("h200_decode_det_m2_8_s30.json", "Per-channel W8A16 deterministic mode at M=2 and 8 "
         "(dispatcher, Mosaic det, decode det), 6 shapes (session 30 call 2)"),
        ("h200_fp4_decode_det_m2_8_s30.json", "NVFP4 / MXFP4 W4A16 deterministic mode at M=2 "
         "and 8, 6 shapes (session 30 call 2)"),
        ("h200_decode_block_dispatch_m2_8_s30.json", "fp8_block_a16 through the dispatcher at "
         "M=2 / 4 / 8 after the routing change, 11 shapes (session 30 call 5)"),
        ("h200_mx_one_multiply_branch_s30.json", "MXFP4 decoded in one multiply with a "
         "per-thread branch to a second where a scale byte exceeds 128 (not committed; "
         "benchmarks/experiments/mx_one_multiply_s30.patch): 3% slower (session 30 call 3, "
         "run 1)"),
        ("h200_mx_two_multiply_s30a.json", "Its baseline, the committed decode, NVFP4 / MXFP4 "
         "W4A16 and MXFP4 W4A4 at M=1 and 16, 11 shapes (session 30 call 3, run 2)"),
        ("h200_mx_one_multiply_unguarded_s30.json", "MXFP4 in one multiply without the guard "
         "(exact only for scale bytes <= 128; probe only): 5% faster (session 30 call 4, run 1)"),
        ("h200_mx_two_multiply_s30b.json", "Its baseline, the committed decode (session 30 "
         "call 4, run 2)"),
        ("h200_fp4_grid_w4a4_fused_s30.json", "NVFP4 / MXFP4 W4A4 at M=1 and 16 through the "
         "dispatcher with the activation operand in two XLA fusions (session 30 call 7; 10 of "
         "11 shapes, 18432x7168 timed out; figures of record)"),
        ("h200_fp4_grid_w4a4_before_s30.json", "The same before (quantize_activation's "
         "barriers: 7 fusions for NVFP4), same device call (session 30 call 7)"),
        ("h200_group_decode_rule_m1_s28.json", "The plain-pipeline group decode at K ranges "
         "1-16 (codes read as group_a16_mgpu.reads_words says), M=1, 11 shapes, beside the "
         "dispatcher of then (group_a16_mgpu) (session 28 call 2; the data group_decode_params "
         "was fitted to)"),
        ("h200_group_decode_rule_m16_s28.json", "The same at M=16 (session 28 call 2)"),
        ("h200_group_decode_words_m1_s28.json", "The plain-pipeline group decode with e2m1 codes "
         "read as bytes and as 32-bit words, K ranges 2-8, M=1, 11 shapes (session 28 call 1)"),
        ("h200_decode_plain_grid_m1_s26.json", "The plain-pipeline decode probe at M=1, K "
         "ranges x stages, 11 shapes, beside the Mosaic kernel (session 26 call 2; the data "
         "decode_params' rule was fitted to)"),
        ("h200_decode_plain_grid_m8_m16_s26.json", "The same at M=8 and 16, 4 shapes (session "
         "26 call 2)"),
        ("h200_decode_plain_probe_s26.json", "The probe's first run, per-SM split rule, M=1 "
         "and 2, 4 shapes (session 26 call 1)"),
        ("h200_fp8_decode_slab_only_s26.json", "The decode path with float32 slabs only (no "
         "in-CTA finish), 4 shapes, M=1 and 16 -- clean where the in-CTA finish aborted the "
         "process (session 26 call 7)"),
        ("h200_fp8_grid_decode_s23.json", "FP8 formats through the dispatcher at M=1 and 16, "
         "both modes where deterministic differs, 11 shapes (session 23 call 2: a re-measure "
         "of the decode figures with the current kernels; figures of record)"),
        ("h200_fp4_grid_det_predecode_m2048_s23.json", "NVFP4 / MXFP4 / MXFP8 (weight-only and "
         "W+A) in both modes at M=2048 after session 23's MX predecode from 2048 rows in "
         "deterministic mode, 11 shapes (call 1)"),
        ("h200_fp8_sweep_w8a8_decode_s23.json", "W8A8 whole-K scales at M=8-64: the "
         "dispatcher (Triton) beside the dense path (`path_dense`), 10 shapes, same run "
         "(session 23 call 3; mixed, not adopted)"),
        ("h200_fp4_grid_nvfp4_predecode_m2048_s23.json", "NVFP4 (W4A16, W4A4) in both "
         "modes at M=2048 with its deterministic mode predecoded from 2048 rows, 11 shapes "
         "(session 23 call 3; against call 1's register decode: slower on 8 of 11, not "
         "adopted)"),
        ("h200_fp4_det_predecode_mid_s23.json", "Deterministic mode predecoded below "
         "PREDECODE_MIN_M beside the register decode again, M=1024/2048, 3 shapes, same run "
         "(session 23 call 2; MX's [det] rows at 2048 are predecoded themselves now)"),
        ("h200_fp4_grid_rowfinish_s22.json", "NVFP4 / MXFP4 / MXFP8 (weight-only and W+A) in "
         "both modes at M=1024/4096 after session 22's NVFP4 finish in the CTAs and NVFP4 "
         "predecode in deterministic mode, 11 shapes (calls 6-7: figures of record)"),
        ("h200_fp4_det_predecode_mid_s22.json", "Deterministic mode predecoded below "
         "PREDECODE_MIN_M (`var[mgpu-det-predecode-any-m]`) beside the register decode, "
         "M=1024/2048, 3 shapes, same run (session 22 call 8; not adopted yet)"),
        ("h200_fp4_rowfinish_s22.json", "NVFP4 deterministic mode (finish in the CTAs) beside "
         "its launch with XLA's finish (`var[mgpu-det-xla-finish]`) and on predecoded codes "
         "with reloaded groups, M=1024/4096, 3 shapes, same run (session 22 call 5)"),
        ("h200_fp4_grid_asm_s22.json", "NVFP4 / MXFP4 / MXFP8 (weight-only and W+A) in "
         "both modes at M=1024/4096 after session 22's PTX e2m1 decode in the dequantization "
         "pass, 11 shapes (calls 3-4)"),
        ("h200_fp4_grid_dequant_s21.json", "NVFP4 / MXFP4 / MXFP8 (weight-only and W+A) in "
         "both modes at M=1024/4096 after session 21's Pallas dequantization pass (dense "
         "path, MX predecode) and MX dense dots rounding to bf16, 11 shapes (calls 7-8)"),
        ("h200_fp4_dequant_s21.json", "The pass (auto) beside XLA's dequantization "
         "(`var[xla-dequant]`) in the dense path and MX deterministic predecode, and NVFP4 "
         "deterministic mode on predecoded codes (`var[mgpu-det-predecode]`), M=1024/4096, 3 "
         "shapes, same run (session 21 call 3)"),
        ("h200_fp4_grid_s20.json", "MXFP8 / MXFP4 / NVFP4 weight-only in both modes at "
         "M=512/4096 after session 20's y written by the kernel, 3 shapes (call 3)"),
        ("h200_fp4_mx_grid_s3.json", "NVFP4 / MXFP4 / MXFP8, every M (11 shapes; before "
         "session 3's M=1 MXFP8 gemv and M=65-256 tiles)"),
        ("h200_fp4_mx_grid_s3_after.json", "NVFP4 / MXFP4 / MXFP8 at M=1 and 256 with the "
         "session-3 heuristics (11 shapes)"),
    ]
    for name, title in sections:
        path = RESULTS / name
        if path.exists():
            lines += grid_section([path], title) + [""]
    grid4 = RESULTS / "h200_fp4_mx_grid_s3.json"
    if grid4.exists():
        lines += sdg_section(grid4) + [""]
    det = RESULTS / "h200_fp4_mx_det_s4.json"
    if det.exists():
        lines += det_schedule_section(det) + [""]
    mgpu = RESULTS / "h200_fp8_sweep_mgpu_v3_s6.json"
    if mgpu.exists():
        lines += mgpu_section(mgpu) + [""]
    for p in sorted(RESULTS.glob("h200x2_tp_s*.json")):
        lines += tp_section(p) + [""]
    made = plots()
    if made:
        lines += ["### Plots", "", "Speedup vs bf16 by M, geomean over each model's shapes: "
                  + "; ".join(made) + ".", ""]
    dense = RESULTS / "h200_s4_fp8_dense.txt"
    if dense.exists():
        lines += ["### FP8 dense path at prefill M (session 4)", "",
                  "Default mode from M=1024 runs formats with whole-K scales (fp8_per_tensor, "
                  "fp8_ptpc, fp8_per_tensor_a16, fp8_per_channel_a16) as one XLA GEMM of the "
                  "stored codes (`pallas_kernels/fp8_dense.py`); the session 2-4 grids above time "
                  "the Triton kernel there, session 5's grid the paths. Side by side at 8192x8192 (`benchmarks/check_dense.py`, wall "
                  "clock):", "", "```"] + [
            ln for ln in dense.read_text().splitlines() if ln.startswith(("M=", "device"))] + [
            "```", ""]
    lines += ["## Targets (issues 3 and 4)", "",
              "None of the speed targets is met on every shape on the H200 (block W8A8 at "
              "M >= 4096 met 750 TFLOP/s and 1.15x bf16 on the large-N shapes only, sessions 5 "
              "and 7; on an H100, sessions 47-51, 750 TFLOP/s on all 11 and 1.15x on 10). "
              "`docs/targets.md` gives for each target the newest measured figure and its run, "
              "the bound and the limiter."]
    (HERE / "REPORT.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {HERE / 'REPORT.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
