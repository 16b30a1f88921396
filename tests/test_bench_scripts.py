"""The device benchmark scripts run end to end on CPU (their smoke modes), so a device call is
never the first run of an edited script. Timings here mean nothing; the records' shape does."""

import pytest
import json
import pathlib
import subprocess
import sys

from cpu_subprocess import cpu_subprocess_env

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run(args, tmp_path, devices=1):
    r = subprocess.run([sys.executable, *args], cwd=REPO, env=cpu_subprocess_env(devices),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r.stdout


def _jsonl(path):
    return [_strict_json(line) for line in path.read_text().splitlines() if line.strip()]


def _strict_json(text):
    """JSON as strict readers take it: no NaN / Infinity tokens (a CPU run measures no
    bandwidth: null)."""
    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def test_bench_matmul_records_every_format_against_bf16(tmp_path):
    _run(["benchmarks/bench_matmul.py", "--shapes", "256x128", "--m", "1,3", "--formats",
          "fp8_per_channel_a16,nvfp4_a16", "--reps", "1", "--out", str(tmp_path)], tmp_path)
    recs = _jsonl(tmp_path / "bench.jsonl")
    _strict_json((tmp_path / "bench.json").read_text())
    assert {r["M"] for r in recs} == {1, 3}
    assert {r["format"] for r in recs if r["format"]} == {"fp8_per_channel_a16", "nvfp4_a16"}
    assert all(r["speedup_vs_bf16"] > 0 for r in recs)
    # several products a jitted call, the full timing loop (the interpreter runs pass --smoke)
    assert all(r["inner"] > 1 for r in recs), recs
    assert (tmp_path / "speedup_vs_bf16.png").stat().st_size > 0


@pytest.mark.slow(27)
def test_bench_fp4_mx_grid_mid_and_det_parts(tmp_path):
    # --tiny runs one M a part (its smallest, at most 32): grid and det M = 1, mid and mxmma 32
    _run(["benchmarks/bench_fp4_mx.py", "--tiny", "--parts", "grid,mid,det,mxmma",
          "--reps", "1", "--out", str(tmp_path)], tmp_path)
    labels = {r["label"] for r in _jsonl(tmp_path / "bench_fp4_mx.jsonl")}
    for fmt in ("nvfp4", "nvfp4_a16", "mxfp4", "mxfp4_a16", "mxfp8", "mxfp8_a16"):
        assert any(label.startswith(f"{fmt}:") for label in labels), (fmt, labels)
    assert "nvfp4_a16:var[dense]" in labels and "bf16" in labels
    assert {"mxfp8:var[fp8mma_mgpu]", "mxfp8:var[fp8mma_mgpu_f4]"} <= labels, labels


def test_bench_tp_two_host_devices(tmp_path):
    out = tmp_path / "tp.json"
    # (two token counts: the default's third, 256, is the same code path and doubled CI's time)
    _run(["benchmarks/bench_tp.py", "--small", "--devices", "2", "--layers", "1", "--reps", "1",
          "--calls", "1",
          "--m", "1,16", "--det", "--out", str(out)], tmp_path, devices=2)
    rows = json.loads(out.read_text())["rows"]
    assert {(r["style"], r["m"]) for r in rows} == {
        (s, m) for s in ("megatron", "column") for m in (1, 16)}
    assert all(r["det_bitwise"] for r in rows if r["style"] == "column")
    assert all("device_tn_det_us" in r for r in rows)


def test_profile_cases_launches_every_case(tmp_path):
    out = _run(["benchmarks/profile_cases.py"], tmp_path)
    assert out.count("finite True") == 4, out


def test_check_dense_times_both_paths(tmp_path):
    out = _run(["benchmarks/check_dense.py", "--shape", "256x128", "--m", "1024"], tmp_path)
    for fmt in ("fp8_per_channel_a16", "fp8_ptpc", "fp8_per_tensor"):
        assert f"M= 1024 {fmt}" in out and "| dense" in out, out


@pytest.mark.slow
def test_sweep_fp8_mgpu_parts_run(tmp_path):
    out_json = tmp_path / "sweep.json"
    _run(["benchmarks/sweep_fp8.py", "--tiny", "--smoke", "--parts",
          "mgpu_parts,mgpu_stream,det_stream,det_straddle,det_model", "--reps", "1", "--out",
          str(out_json)], tmp_path)
    recs = json.loads(out_json.read_text())["records"]
    assert {"fp8_block_a16:mgpu_a16_smem_auto", "fp8_block_a16:mgpu_a16_smem_k_parts4",
            "fp8_block_a16:mgpu_a16_smem_ranges", "fp8_block_a16:mgpu_a16_smem_stream",
            "fp8_block_a16:mgpu_a16_smem_det[det]",
            "fp8_block_a16:mgpu_a16_smem_det_s13[det]",
            "fp8_block_a16:mgpu_a16_smem_det_cta[det]"} <= {r["label"] for r in recs}, recs
    assert all("error" not in r for r in recs), recs


def _sweep_labels(tmp_path, parts: str) -> set:
    out_json = tmp_path / "sweep.json"
    _run(["benchmarks/sweep_fp8.py", "--tiny", "--smoke", "--parts", parts, "--reps", "1",
          "--out", str(out_json)], tmp_path)
    return {r["label"] for r in json.loads(out_json.read_text())["records"]}


@pytest.mark.slow
def test_sweep_fp8_v5_and_mgpu_dec_parts_run(tmp_path):
    labels = _sweep_labels(tmp_path, "v5,mgpu_dec")  # (two tests: xdist balances them)
    assert sum("gemv" in label for label in labels) >= 6, labels
    assert "fp8_block_a16:mgpu_a16_smem_auto" in labels, labels


@pytest.mark.slow
def test_sweep_fp8_mgpu_and_mgpu_a16_parts_run(tmp_path):
    labels = _sweep_labels(tmp_path, "mgpu,mgpu_a16")
    assert {"fp8_block:mgpu_block2_g16", "fp8_block:triton_block",
            "fp8_block:pallas_fp8_block"} <= labels
    assert any(label.startswith("fp8_block:mgpu_block2_g16_p") for label in labels), labels
    assert {"fp8_block_a16:mgpu_a16_smem", "fp8_per_channel_a16:mgpu_a16_smem"} <= labels, labels


def test_probe_w4_mgpu_times_the_weight_streams(tmp_path):
    out_json = tmp_path / "probe_w4.json"
    _run(["benchmarks/probe_w4_mgpu.py", "--smoke", "--shapes", "256x256", "--m", "1",
          "--reps", "1", "--streams", "int4,fp8,bf16", "--a-loads", "wgmma,relabel_4x", "--out",
          str(out_json)], tmp_path)
    recs = {r["label"]: r for r in json.loads(out_json.read_text())["records"]}
    assert {"bf16", "nvfp4_a16:pallas_nvfp4", "fp8_block_a16:pallas_fp8_w8a16",
            "nvfp4_a16:mgpu_int4_stream_smem", "fp8_block_a16:mgpu_fp8_stream_smem",
            "mgpu_bf16_stream_smem", "fp8_block_a16:mgpu_fp8_stream_smem_relabel_4x"
            } <= set(recs), recs
    assert all("error" not in r for r in recs.values()), recs


def test_bench_ue8m0_times_the_v31_spec_beside_fp8_block(tmp_path):
    """bench_ue8m0.py registers DeepSeek-V3.1's spec for its run and hands the rest to
    bench_matmul.py (or --script's); a script that is not there is named."""
    _run(["benchmarks/bench_ue8m0.py", "--shapes", "256x128", "--m", "2", "--formats",
          "fp8_block,fp8_block_ue8m0", "--modes", "default", "--xla-ref-max-m", "0",
          "--reps", "1", "--out", str(tmp_path)], tmp_path)
    recs = _jsonl(tmp_path / "bench.jsonl")
    assert {r["format"] for r in recs if r["format"]} == {"fp8_block", "fp8_block_ue8m0"}
    with pytest.raises(AssertionError, match="no such script"):
        _run(["benchmarks/bench_ue8m0.py", "--script", "nope.py"], tmp_path)


def test_profile_mgpu_decode_and_decode_breakdown_run(tmp_path):
    """The session-9 profiling scripts: the Mosaic decode streams launched once each (the
    interpreter, no profiler range on CPU), and the per-kernel breakdown, which has no GPU
    kernels to list on CPU and says so."""
    out = _run(["benchmarks/profile_mgpu_decode.py", "--range"], tmp_path)
    assert {"bf16:", "mgpu_fp8_stream_smem:", "mgpu_fp8_stream_smem_blocks2:",
            "mgpu_bf16_stream_smem:"} <= {line.split()[0] for line in out.splitlines()}, out
    out_json = tmp_path / "bd.json"
    _run(["benchmarks/decode_breakdown.py", "--shapes", "256x256", "--m", "1", "--reps", "2",
          "--chain", "2", "--out", str(out_json)], tmp_path)
    res = json.loads(out_json.read_text())["results"]
    assert [(r["op"], r["chain"], r.get("note")) for r in res] == [
        ("bf16", 2, "no GPU kernels on CPU"), ("fp8_block_a16", 2, "no GPU kernels on CPU")]


def test_probe_act_quant_and_the_act_switch_run(tmp_path):
    """probe_act_quant.py (session 31) with the XLA operands of session 32's --codes, and
    decode_breakdown.py --act group (session 40's stage, through bench_ue8m0.py's registered
    spec; no GPU kernels to time on CPU: the records' shape)."""
    out_json = tmp_path / "aq.json"
    _run(["benchmarks/probe_act_quant.py", "--formats", "fp8_ptpc,nvfp4,mxfp4,mxfp8", "--m",
          "3", "--k", "256", "--calls", "2", "--codes", "xla", "--out", str(out_json)], tmp_path)
    data = json.loads(out_json.read_text())
    assert "--codes xla" in data["command"]
    assert [(r["format"], r["M"], r["codes"]) for r in data["records"]] == [
        (f, 3, "xla") for f in ("fp8_ptpc", "nvfp4", "mxfp4", "mxfp8")]
    bd = tmp_path / "bd.json"
    _run(["benchmarks/bench_ue8m0.py", "--script", "decode_breakdown.py", "--shapes", "256x256",
          "--m", "1", "--reps", "2", "--ops", "nvfp4,fp8_block_ue8m0", "--act", "group",
          "--out", str(bd)], tmp_path)
    assert [r["op"] for r in json.loads(bd.read_text())["results"]] == ["nvfp4",
                                                                         "fp8_block_ue8m0"]


def test_xla_gemm_config_lists_the_kernels_of_each_formulation(tmp_path):
    """XLA's compiled kernels for W8A16's dense formula at M=1 (and on two rows), M=2: on CPU
    its own dot emitters, one section each with at least one kernel line."""
    out = _run(["benchmarks/xla_gemm_config.py", "--shapes", "256x128", "--m", "1,2"], tmp_path)
    sections = [s for s in out.split("== ") if s.strip()]
    assert [s.splitlines()[0] for s in sections] == [
        "dense K=256 N=128 M=1", "two_rows K=256 N=128 M=1", "broadcast_rows K=256 N=128 M=1",
        "dense K=256 N=128 M=2"], out
    assert all(len(s.splitlines()) > 1 for s in sections), out


def test_probe_subnormal_sweeps_and_summarizes(tmp_path):
    """probe_subnormal.py (session 47; its first device run lost the sweep to `--exps -126`):
    CPU smoke at a normal scale (XLA's CPU flushes subnormals, so quantize refuses them here) --
    a record per (format, M, scale, mode) with the dispatcher's choice; and --summarize counts
    a PTX file's .ftz instructions and an optimized HLO's custom calls."""
    out_json = tmp_path / "sub.json"
    _run(["benchmarks/probe_subnormal.py", "--formats", "fp8_per_tensor,fp8_block_a16", "--m",
          "1", "--exps=-120", "--out", str(out_json)], tmp_path)
    recs = json.loads(out_json.read_text())
    assert [(r["format"], r["det"]) for r in recs] == [
        ("fp8_per_tensor", False), ("fp8_per_tensor", True), ("fp8_block_a16", False),
        ("fp8_block_a16", True)], recs
    assert all(r["zeros"] == 0 and r["explain"].startswith("chosen:") for r in recs), recs
    dump = tmp_path / "dump"
    dump.mkdir()
    (dump / "k.ptx").write_text("mul.rn.f32 %f1, %f2, %f3;\nmul.rn.ftz.f32 %f4, %f5, %f6;\n")
    (dump / "m.sm_9.0a_gpu_after_optimizations.txt").write_text(
        'custom_call_target="__cublas$lt$matmul", backend_config={"alpha_real":1}')
    out = _run(["benchmarks/probe_subnormal.py", "--summarize", str(dump)], tmp_path)
    assert "k.ptx: {'mul.rn.f32': 1, 'mul.rn.ftz.f32': 1}" in out, out
    assert "custom calls ['__cublas$lt$matmul'] alpha_real ['1']" in out, out


def test_probe_decode_plain_times_each_launch_beside_the_dispatcher(tmp_path):
    """The decode kernel's launch grid (CPU smoke: the interpreter on a tiny shape): a record
    per (splits, stages) beside bf16 and the dispatcher, none failed."""
    out_json = tmp_path / "grid.json"
    _run(["benchmarks/probe_decode_plain.py", "--grid", "1,2:2,4", "--reps", "1", "--out",
          str(out_json)], tmp_path)
    recs = json.loads(out_json.read_text())["records"]
    labels = {r["label"].split(":")[-1] for r in recs}
    assert labels == {"bf16", "pallas_fp8_w8a16", "plain_k1_st2", "plain_k1_st4",
                      "plain_k2_st2", "plain_k2_st4"}, labels
    assert not [r for r in recs if r.get("error")], [r["error"] for r in recs if r.get("error")]


def test_probe_decode_finish_runs_its_smoke(tmp_path):
    """The in-kernel finish probe (session 42) on CPU: bf16, the dispatcher and XLA's finish of
    the slabs per format (the interpreter has no clusters: no in-kernel op), in both modes
    (--det), none failed."""
    out_json = tmp_path / "finish.json"
    _run(["benchmarks/probe_decode_finish.py", "--m", "1", "--reps", "1", "--formats",
          "fp8_per_channel_a16,nvfp4_a16", "--det", "--out", str(out_json)],
         tmp_path)
    recs = json.loads(out_json.read_text())["records"]
    assert {r["label"] for r in recs} == {"bf16"} | {
        f"{fmt}:{op}{mode}" for fmt, k in (("fp8_per_channel_a16", "pallas_fp8_w8a16"),
                                           ("nvfp4_a16", "pallas_nvfp4"))
        for op in (k, "decode_slabs") for mode in ("", "[det]")}
    assert not [r for r in recs if r.get("error")], [r["error"] for r in recs if r.get("error")]


def test_probe_group_decode_plain_runs_its_smoke(tmp_path):
    """The plain-pipeline group decode probe (sessions 27-28) on CPU: a tiny interpreted run of
    bf16, the dispatcher's kernel, group_a16_mgpu and two explicit launches per weight-only
    format (W4A4: the first two only), each recorded without error."""
    out_json = tmp_path / "group.json"
    _run(["benchmarks/probe_group_decode_plain.py", "--m", "1", "--grid", "1,2:2",
          "--formats", "nvfp4_a16,mxfp4_a16,mxfp4", "--out", str(out_json)], tmp_path)
    recs = json.loads(out_json.read_text())["records"]
    labels = {r["label"] for r in recs}
    assert labels == {"bf16", "mxfp4:pallas_mxfp4", "mxfp4:group_a16_mgpu"} | {
        f"{f}:{op}" for f, k in (("nvfp4_a16", "pallas_nvfp4"), ("mxfp4_a16", "pallas_mxfp4"))
        for op in (k, "group_a16_mgpu", "plain_k1_st2_rule", "plain_k2_st2_rule")}, labels
    assert not [r for r in recs if r.get("error")], [r["error"] for r in recs if r.get("error")]


def test_jqlin_bench_runs_its_small_grid(tmp_path):
    """`python -m jqlin bench` (the small benchmark; on CPU a 512x512 smoke of the XLA paths):
    a table and a JSON record per op, bf16 among them."""
    out_json = tmp_path / "bench.json"
    out = _run(["-m", "jqlin", "bench", "--m", "1", "--modes", "default", "--reps", "1",
                "--json", str(out_json)], tmp_path)
    recs = json.loads(out_json.read_text())["records"]
    assert {r["label"] for r in recs} >= {"bf16"} and len(recs) >= 2, recs
    assert not [r for r in recs if r.get("error")] and "vs bf16" in out, out


def test_bench_out_dtype_times_each_variant(tmp_path):
    out = tmp_path / "od.json"
    _run(["benchmarks/bench_out_dtype.py", "--smoke", "--formats", "mxfp8_a16,fp8_ptpc",
          "--out", str(out)], tmp_path)
    recs = _strict_json(out.read_text())["records"]
    labels = {r["label"] for r in recs}
    assert labels == {"bf16"} | {f"{f}:{v}" for f in ("mxfp8_a16", "fp8_ptpc")
                                 for v in ("bf16_out", "f32_out", "f32_x", "f16_x")}, labels
    assert all(r["median_us"] > 0 for r in recs)


def test_probe_det_w8a8_mgpu_checks_rows_and_times_the_paths(tmp_path):
    """probe_det_w8a8_mgpu.py (session 48) on CPU: the interpreter's Mosaic rows are bitwise the
    rows alone, and a record per (M, op) -- bf16, the dispatcher in both modes, the Mosaic path
    forced -- none failed; with --spread, per format the deterministic config both ways."""
    out_json = tmp_path / "det_w8a8.json"
    _run(["benchmarks/probe_det_w8a8_mgpu.py", "--tiny", "--out", str(out_json)], tmp_path)
    d = _strict_json(out_json.read_text())
    assert [(b["M"], b["all_bitwise"]) for b in d["bitwise"]] == [(3, True)], d["bitwise"]
    assert sorted((r["M"], r["label"]) for r in d["records"]) == sorted(
        (1, label) for label in (
            "bf16", "fp8_block:pallas_fp8_block", "fp8_block:pallas_fp8_block[det]",
            "fp8_block:path_mgpu")), d["records"]
    assert not [r for r in d["records"] if r.get("error")]
    _run(["benchmarks/probe_det_w8a8_mgpu.py", "--tiny", "--spread", "--formats",
          "fp8_block,fp8_ptpc", "--out", str(out_json)], tmp_path)
    d = _strict_json(out_json.read_text())
    assert d["bitwise"] == [] and sorted((r["M"], r["label"]) for r in d["records"]) == sorted(
        [(1, "bf16")] + [
            (1, f"{fmt}:{op}")
            for fmt, kernel in (("fp8_block", "pallas_fp8_block"), ("fp8_ptpc", "pallas_fp8_w8a8"))
            for op in (kernel, f"{kernel}[det]", "det_in_program[det]", "det_spread[det]")]), \
        d["records"]
    assert not [r for r in d["records"] if r.get("error")]


def test_probe_det_block_mgpu_checks_the_launches_and_times_them(tmp_path):
    """probe_det_block_mgpu.py (session 49) on CPU: the interpreter's fp8_block_det launches
    bitwise each other and rows alone, and a record per (M, op), none failed."""
    out_json = tmp_path / "det_block.json"
    _run(["benchmarks/probe_det_block_mgpu.py", "--tiny", "--out", str(out_json)], tmp_path)
    d = _strict_json(out_json.read_text())
    assert [(b["M"], b["spread_eq_fold"], all(b["rows_alone_eq"])) for b in d["bitwise"]] == [
        (130, True, True)], d["bitwise"]
    assert sorted((r["M"], r["label"]) for r in d["records"]) == sorted(
        (1, label) for label in (
            "bf16", "fp8_block:pallas_fp8_block", "fp8_block:pallas_fp8_block[det]",
            "fp8_block:fold_b1[det]", "fp8_block:spread_b1[det]",
            "fp8_block:fold_park_b1[det]", "fp8_block:fold_park_b2[det]",
            "fp8_block:fold_park_b2_c96[det]")), d["records"]
    assert not [r for r in d["records"] if r.get("error")]


def test_probe_swap_ab_bits_compares_the_chains(tmp_path):
    """probe_swap_ab_bits.py (session 49) on CPU (the interpreter: its 8-wide dots round
    otherwise, so only the summary's shape is checked beside the wider widths' bits)."""
    out_json = tmp_path / "swap.json"
    _run(["benchmarks/probe_swap_ab_bits.py", "--seeds", "1", "--out", str(out_json)], tmp_path)
    d = _strict_json(out_json.read_text())
    assert d["cases"] == 6 and d["interpret"] is True
    assert d["by_width"]["16"] and d["by_width"]["64"], d["by_width"]
