"""`jqlin inspect` / `jqlin convert`: tables, exit codes, and no tracebacks on bad checkpoints."""

import json
import subprocess
import sys

import numpy as np

import jqlin
from jqlin.cli import main
import ckpt_builders as cb


def test_inspect_fixture(fixtures_dir, capsys):
    assert main(["inspect", str(fixtures_dir / "modelopt_nvfp4")]) == 0
    out = capsys.readouterr().out
    assert "format: modelopt/NVFP4" in out and "no problems found" in out
    row = next(l for l in out.splitlines() if l.startswith("model.layers.0.mlp.down_proj"))
    assert "nvfp4" in row and "320x768" in row and "F8_E4M3[320, 48]" in row
    assert "global=" in row and "input=" in row


def test_inspect_bad_checkpoint_lists_problems(tmp_path, rng, capsys):
    _, _, tensors = cb.build(tmp_path, rng, lambda m, w: cb.fp8_block(w), quantization_config={
        "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})
    q = f"{cb.ATTN}.q_proj.weight_scale_inv"
    tensors[q] = np.full_like(tensors[q], -1.0)
    del tensors[f"{cb.MLP}.down_proj.weight_scale_inv"]
    (tmp_path / "model.safetensors").unlink()
    cb.write_tensors(tmp_path, tensors)
    assert main(["inspect", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "PROBLEMS (2)" in out and f"'{q}'" in out and "down_proj.weight_scale_inv" in out


def test_inspect_unreadable(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{not json")
    assert main(["inspect", str(tmp_path)]) == 1
    assert "config.json: invalid JSON" in capsys.readouterr().out


def test_convert_and_quantize(tmp_path, rng, fixtures_dir, capsys):
    assert main(["convert", str(fixtures_dir / "ct_mxfp8"), str(tmp_path / "a"),
                 "--no-progress"]) == 0
    assert jqlin.load_checkpoint(tmp_path / "a").source_format == "compressed-tensors/mxfp8"
    cb.build(tmp_path / "bf16", rng, lambda m, w: None)
    amax = tmp_path / "amax.json"
    amax.write_text(json.dumps({m: 2.0 for m in cb.MODULES}))
    assert main(["convert", str(tmp_path / "bf16"), str(tmp_path / "q"), "--quantize", "nvfp4",
                 "--input-amax", str(amax), "--max-shard-size", "20KB", "--no-progress"]) == 0
    ck = jqlin.load_checkpoint(tmp_path / "q")
    assert len(ck.layers) == 7 and (tmp_path / "q" / "model.safetensors.index.json").is_file()
    assert float(ck.layers[f"{cb.ATTN}.q_proj"].input_scale) == np.float32(448 * 6) / np.float32(2)


def test_convert_errors_are_messages(tmp_path, fixtures_dir, capsys):
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "out"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("jqlin convert: error:") and "not a checkpoint directory" in err
    assert main(["convert", str(fixtures_dir / "ct_mxfp8"), str(tmp_path / "o"), "--quantize",
                 "fp8_block", "--no-progress"]) == 1
    assert "already quantized" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_module_entry_point_has_no_traceback(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "awq"}}))
    (tmp_path / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    r = subprocess.run([sys.executable, "-m", "jqlin", "convert", str(tmp_path), str(tmp_path / "o"),
                        "--no-progress"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "quant_method 'awq' is not supported" in r.stderr


def test_convert_overwrite_refuses_a_directory_that_is_no_checkpoint(tmp_path, fixtures_dir,
                                                                    capsys):
    """--overwrite into a non-empty directory without config.json deleted all of it (a typo'd
    DST such as a home directory); an empty directory or a checkpoint is still replaced."""
    dst = tmp_path / "precious"
    (dst / "docs").mkdir(parents=True)
    (dst / "docs" / "thesis.txt").write_text("keep me")
    assert main(["convert", str(fixtures_dir / "ct_mxfp8"), str(dst), "--overwrite",
                 "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"{dst}: overwrite replaces a checkpoint directory" in err and "refusing" in err
    assert "Traceback" not in err
    assert (dst / "docs" / "thesis.txt").read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    assert main(["convert", str(fixtures_dir / "ct_mxfp8"), str(tmp_path / "empty"),
                 "--overwrite", "--no-progress"]) == 0


def test_convert_flag_conflicts_name_the_flags(tmp_path, fixtures_dir, capsys):
    """The messages named the Python API (`quantize=`, `input_amax`) instead of the flags."""
    amax = tmp_path / "amax.json"
    amax.write_text("{}")
    src, dst = str(fixtures_dir / "bf16"), str(tmp_path / "o")
    for argv, needle in [(["--input-amax", str(amax)], "input_amax= / --input-amax is only used "
                                                       "together with quantize= / --quantize"),
                         (["--exclude", "*q_proj"], "exclude= / --exclude is only used together"),
                         (["--quantize", "fp8_block", "--input-amax", str(amax)],
                          "input_amax= / --input-amax given, but fp8_block's activations need "
                          "no static scale (formats that do: fp8_per_tensor, nvfp4)")]:
        assert main(["convert", src, dst, "--no-progress", *argv]) == 1, argv
        assert capsys.readouterr().err.startswith(f"jqlin convert: error: {needle}"), argv
    assert not (tmp_path / "o").exists()


def test_convert_says_how_many_layers_it_quantized(tmp_path, fixtures_dir, capsys):
    """A bf16 source without --quantize is copied in jqlin's layout: say so (it printed only
    'wrote DST'); excluding every Linear weight is an error, not an unquantized copy."""
    assert main(["convert", str(fixtures_dir / "bf16"), str(tmp_path / "a"), "--no-progress"]) == 0
    assert "no quantized layer: the source holds none; --quantize FORMAT" in capsys.readouterr().out
    assert main(["convert", str(fixtures_dir / "ct_mxfp8"), str(tmp_path / "b"),
                 "--no-progress"]) == 0
    assert "(14 quantized layers)" in capsys.readouterr().out
    assert main(["convert", str(fixtures_dir / "bf16"), str(tmp_path / "c"), "--quantize",
                 "fp8_ptpc", "--exclude", "*", "--no-progress"]) == 1
    assert "no weight to quantize (every Linear weight is excluded" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
