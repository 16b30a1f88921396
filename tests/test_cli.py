"""The README's demo command end to end (small sizes), as a user runs it."""

import pytest
import subprocess
import sys


@pytest.mark.slow
def test_demo_runs_every_format_and_the_shipped_checkpoint():
    out = subprocess.run([sys.executable, "-m", "jqlin", "demo", "--m", "2", "--n", "64", "--k", "96"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    import jqlin
    for name in jqlin.formats.names():
        assert f"\n{name} " in out.stdout
    assert "converting" in out.stdout and "generated:" in out.stdout
    assert "relative Frobenius error" in out.stdout and "top-1 agreement" in out.stdout


def test_bench_bad_arguments_are_one_line_errors(capsys):
    """Each bad bench argument is named before any work: exit 2, no traceback, no NaN rows."""
    from jqlin.cli import main
    for argv, needle in [(["--m", "0"], "--m: expected a positive integer, got '0'"),
                         (["--m", "1,,2"], "--m: expected a comma-separated list"),
                         (["--m", "x"], "--m: expected a positive integer, got 'x'"),
                         (["--formats", "bogus"], "--formats: unknown format 'bogus'"),
                         (["--kernels", "bogus"], "--kernels: unknown kernel 'bogus'"),
                         (["--kernels", "pallas_nvfp4"], "--kernels pallas_nvfp4: handles none"),
                         (["--shapes", "foo"], "--shapes: shape 'foo'"),
                         (["--shapes", "0x64"], "--shapes: shape '0x64': K and N must be positive"),
                         (["--modes", "bogus"], "--modes: expected 'default' and/or 'det'"),
                         (["--xla-ref-max-m", "-1"], "--xla-ref-max-m: expected >= 0"),
                         (["--json", "/nonexistent/dir/x.json"], "--json /nonexistent/dir/x.json")]:
        assert main(["bench", "--formats", "fp8_ptpc", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"jqlin bench: error: {needle}"), (argv, err)
        assert len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as e:  # (argparse's own type check: usage, then the error)
        main(["bench", "--reps", "0"])
    assert e.value.code == 2
    assert "argument --reps: expected a positive integer, got '0'" in capsys.readouterr().err


def test_bench_matmul_script_refuses_an_unknown_mode(capsys):
    """benchmarks/bench_matmul.py --modes deterministic (not 'det') ran a second default op
    under the same label (session 47); now argparse's error names the argument, and build_ops
    itself refuses it."""
    import importlib.util
    import pathlib
    from jqlin import bench
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_matmul.py"
    spec = importlib.util.spec_from_file_location("bench_matmul_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    with pytest.raises(SystemExit) as e:
        script.main(["--modes", "default,deterministic", "--formats", "fp8_ptpc"])
    assert e.value.code == 2
    assert "--modes: expected 'default' and/or 'det', got 'default,deterministic'" in (
        capsys.readouterr().err)
    with pytest.raises(ValueError, match="modes: expected 'default' and/or 'det'"):
        bench.build_ops(["fp8_ptpc"], None, modes=("deterministic",))


def test_bench_keeps_an_explicit_shape_and_fails_on_error_rows(monkeypatch, capsys):
    """--shapes 4096x4096 given on a CPU is timed as asked (it was silently shrunk to 512x512,
    the default's CPU stand-in); a run with ERROR rows exits 1; no 'nan' in the table."""
    import math
    from jqlin import bench
    from jqlin.cli import main
    seen = {}

    def fake(shapes, ms, ops, reps, out):
        seen.update(shapes=shapes, ms=ms)
        return {"records": [{"error": "boom"}, {}]}
    monkeypatch.setattr(bench, "run_and_report", fake)
    assert main(["bench", "--shapes", "4096x4096", "--m", "1,3", "--formats", "fp8_ptpc"]) == 1
    assert seen == {"shapes": [("llama3-8b", 4096, 4096)], "ms": [1, 3]}
    assert "1 of 2 case(s) failed" in capsys.readouterr().err
    row = dict(model="m", K=1, N=1, M=1, label="bf16", median_us=1.0, time_basis="wall",
               tflops=0.0, frac_copy_bw=math.nan, speedup_vs_bf16=1.0)
    assert "nan" not in bench.format_table([row])


def test_deliberate_errors_of_any_subcommand_have_no_traceback(tmp_path, monkeypatch, capsys):
    """demo --checkpoint MISSING raised a CheckpointError traceback (after part 1's table)."""
    from jqlin import demo
    from jqlin.cli import main
    monkeypatch.setattr(demo, "format_table", lambda *a, **k: [])
    assert main(["demo", "--checkpoint", str(tmp_path / "missing")]) == 2  # (before part 1)
    err = capsys.readouterr().err
    assert err.startswith("jqlin demo: error: --checkpoint") and "not a directory" in err
    (tmp_path / "empty").mkdir()  # a directory, but no checkpoint: the loader's error
    assert main(["demo", "--checkpoint", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("jqlin demo: error:") and "Traceback" not in err
    for argv in (["--m", "0"], ["--n", "-4"], ["--k", "x"]):  # (a ValueError deep in part 1)
        with pytest.raises(SystemExit) as e:
            main(["demo", *argv])
        assert e.value.code == 2
        assert f"argument {argv[0]}: expected a positive integer" in capsys.readouterr().err
