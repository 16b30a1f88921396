"""benchmarks/merge_lanes.py and report.current_records: the glue between device runs and the
committed results (pure Python, no device); jqlin.bench's op wrappers the scripts share."""

import json
import sys
import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import merge_lanes  # noqa: E402
import ncu_summary  # noqa: E402
import report  # noqa: E402


def _rec(k, n, m, label, us, frac, **kw):
    return dict(K=k, N=n, M=m, label=label, median_us=us, frac_copy_bw=frac,
                weight_bytes=k * n, speedup_vs_bf16=kw.pop("speedup", 1.0), **kw)


def test_merge_lanes_recovers_bandwidth_and_later_lanes_win(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    # weight bytes / time / fraction of copy bandwidth = the copy bandwidth of that lane
    a.write_text(json.dumps(_rec(2048, 4096, 1, "x", 4.0, 0.5)) + "\n" +
                 json.dumps(_rec(2048, 4096, 16, "x", 8.0, 0.5)) + "\n")
    b.write_text(json.dumps(_rec(2048, 4096, 1, "x", 2.0, 1.0)) + "\n")  # 8 MB / 2 us / 1.0
    out = tmp_path / "m.json"
    assert merge_lanes.main([str(out), str(a), str(b), "--command", "cmd"]) == 0
    d = json.loads(out.read_text())
    assert d["command"] == "cmd" and len(d["records"]) == 2
    assert {r["median_us"] for r in d["records"] if r["M"] == 1} == {2.0}
    bws = [lane["copy_bandwidth_Bps"] for lane in d["lanes"]]
    assert abs(bws[0] - 2048 * 4096 / (8e-6 * 0.5)) < 1  # the M=16 record of lane a
    assert abs(bws[1] - 2048 * 4096 / 2e-6) < 1  # lane b's M=1 record replaced lane a's


def test_current_records_takes_the_newest_run_per_m(tmp_path, monkeypatch):
    def write(name, recs):
        (tmp_path / name).write_text(json.dumps({"copy_bandwidth_Bps": 3e12, "records": recs}))
    write("old.json", [_rec(1, 1, 1, "k", 5.0, 1.0), _rec(1, 1, 1, "gone", 5.0, 1.0),
                       _rec(1, 1, 16, "k", 7.0, 1.0)])
    write("new.json", [_rec(1, 1, 1, "k", 3.0, 1.0), _rec(1, 1, 16, "k", 9.0, 1.0)])
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "CURRENT", (("old.json", None), ("new.json", (1,))))
    got = {(r["M"], r["label"]): (r["median_us"], r["source"]) for r in report.current_records()}
    # M=1: the new run replaces the old one, labels it lacks included; M=16: only old counts
    assert got == {(1, "k"): (3.0, "new.json"), (16, "k"): (7.0, "old.json")}


def test_ncu_summary_keeps_the_filtered_kernels(tmp_path):
    head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
            '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
            '"Metric Value","Rule Name","Rule Type","Rule Description"')  # rows stop short
    row = ('"{}","1","python3","h","{}","1","7","(128,1,1)","(64,1,1)","0","9.0","SOL","{}",'
           '"{}","{}",')
    path = tmp_path / "ncu.csv"
    path.write_text("\n".join(["==PROF== connected", head,
                               row.format(0, "fp8_w8a16", "Duration", "us", "24.5"),
                               row.format(0, "fp8_w8a16", "DRAM Throughput", "%", "71.2"),
                               row.format(0, "fp8_w8a16", "Not Kept", "", "1"),
                               row.format(1, "loop_fusion", "Duration", "us", "2.0")]))
    assert ncu_summary.summarize(str(path), "fp8_w8a") == [
        "0 fp8_w8a16\n    Duration=24.5us; DRAM Throughput=71.2%"]
    empty = tmp_path / "empty.csv"
    empty.write_text("==PROF== nothing profiled\n")
    assert "no ncu CSV header" in ncu_summary.summarize(str(empty))[0]


def test_two_rows_runs_one_row_as_two_and_keeps_row_0():
    import jax.numpy as jnp
    from jqlin import bench
    x, w = jnp.arange(6.0).reshape(1, 6), jnp.arange(18.0).reshape(3, 6)
    seen = []

    def fn(x2, w):
        seen.append(x2.shape)
        return x2 @ w.T
    for how in ("zeros", "broadcast"):
        np.testing.assert_array_equal(bench.two_rows(fn, how)(x, w), x @ w.T)
    assert seen == [(2, 6), (2, 6)]
    with pytest.raises(ValueError, match="how must be"):
        bench.two_rows(fn, "repeat")


def test_run_and_report_writes_the_header_with_partial_records(tmp_path, monkeypatch):
    """A run cut short keeps a file report.py can read: the partial JSON written after each
    record carries the device header (copy bandwidth included: NaN in a CPU smoke run) beside
    the records so far."""
    from jqlin import bench
    out = tmp_path / "run.json"
    seen = []
    real = bench._write_json

    def spy(path, obj):
        seen.append(json.loads(json.dumps(obj)))
        real(path, obj)
    monkeypatch.setattr(bench, "_write_json", spy)
    bench.run_and_report([("tiny", 256, 128)], (1,), [bench.bf16_op()], reps=1, out=str(out),
                         smoke=True)
    first = seen[0]
    assert first["partial"] and len(first["records"]) == 1
    assert "copy_bandwidth_Bps" in first and first["device"] and first["platform"] == "cpu"
    final = json.loads(out.read_text())
    assert "partial" not in final and final["records"][0]["label"] == "bf16"


def test_parse_launch_grid():
    from jqlin import bench
    assert bench.parse_launch_grid("1,2:2,4") == [(1, 2), (1, 4), (2, 2), (2, 4)]
    assert bench.parse_launch_grid("none") == []
    with pytest.raises(ValueError, match="SPLITS:STAGES"):
        bench.parse_launch_grid("1,2")
