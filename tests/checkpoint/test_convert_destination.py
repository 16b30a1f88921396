"""convert's destination and options: replacing a destination never deletes the source, an
unusable one or a failing write is a CheckpointError (the CLI prints it, no traceback) that
leaves nothing behind, and options that would do nothing are refused."""

import errno
import importlib
import shutil

import pytest

import jqlin
from jqlin.checkpoint import convert
from jqlin.cli import main
import ckpt_builders as cb

convert_module = importlib.import_module("jqlin.checkpoint.convert")


def _copy(fixtures_dir, tmp_path, folder="ct_mxfp8"):
    models = tmp_path / "models"
    shutil.copytree(fixtures_dir / folder, models / folder)
    (models / "notes.txt").write_text("kept")
    return models / folder


@pytest.mark.parametrize("where", ["itself", "its parent", "its grandparent"])
def test_a_destination_holding_the_source_is_refused(fixtures_dir, tmp_path, where):
    """dst == src or an ancestor, with overwrite: the source and its siblings were deleted."""
    src = _copy(fixtures_dir, tmp_path)
    dst = {"itself": src, "its parent": src.parent, "its grandparent": tmp_path}[where]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(jqlin.CheckpointError, match="would delete the source"):
        convert(src, dst, overwrite=True, progress=False)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_overwrite_replaces_only_a_checkpoint_or_an_empty_directory(fixtures_dir, tmp_path):
    """overwrite=True deleted whatever directory dst named (a mistyped home directory)."""
    dst = tmp_path / "precious"
    (dst / "docs").mkdir(parents=True)
    (dst / "docs" / "thesis.txt").write_text("keep me")
    with pytest.raises(jqlin.CheckpointError, match="holds none of config.json, jqlin_quant.json"):
        convert(fixtures_dir / "ct_mxfp8", dst, overwrite=True, progress=False)
    assert (dst / "docs" / "thesis.txt").read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    for _ in range(2):  # an empty directory, then the checkpoint written there
        convert(fixtures_dir / "ct_mxfp8", tmp_path / "empty", overwrite=True, progress=False)
    assert (tmp_path / "empty" / "jqlin_quant.json").is_file()


def test_an_unusable_destination_is_a_checkpoint_error(fixtures_dir, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(jqlin.CheckpointError, match="cannot create the destination's directory"):
        convert(fixtures_dir / "ct_mxfp8", tmp_path / "a_file" / "out", progress=False)
    assert main(["convert", str(fixtures_dir / "ct_mxfp8"), str(tmp_path / "a_file" / "out"),
                 "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "cannot create the destination's directory" in err and "Traceback" not in err
    with pytest.raises(jqlin.CheckpointError, match="not a directory"):
        convert(fixtures_dir / "ct_mxfp8", tmp_path / "a_file", overwrite=True, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_a_failing_write_leaves_nothing(fixtures_dir, tmp_path, monkeypatch):
    def full(self, name, array):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))
    monkeypatch.setattr(convert_module.ShardWriter, "write", full)
    with pytest.raises(jqlin.CheckpointError, match="No space left on device.*nothing was written"):
        convert(fixtures_dir / "ct_mxfp8", tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_failing_replace_keeps_the_old_destination(fixtures_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    convert(fixtures_dir / "ct_mxfp8", out, progress=False)
    rename = convert_module.os.rename

    def refuse_the_new_one(a, b):
        if ".tmp-" in str(a):
            raise OSError(errno.EACCES, "Permission denied")
        return rename(a, b)
    monkeypatch.setattr(convert_module.os, "rename", refuse_the_new_one)
    with pytest.raises(jqlin.CheckpointError, match="old one is left unchanged"):
        convert(fixtures_dir / "ct_fp8_block", out, overwrite=True, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert jqlin.load_checkpoint(out).source_format == "compressed-tensors/mxfp8"


def test_options_that_would_do_nothing_are_refused(tmp_path, rng, fixtures_dir, capsys):
    cb.build(tmp_path / "bf16", rng, lambda m, w: None)
    with pytest.raises(jqlin.CheckpointError, match="'*.mlp.down_projj' matches no module"):
        convert(tmp_path / "bf16", tmp_path / "q", quantize="fp8_ptpc",
                exclude=["*.mlp.down_projj"], progress=False)
    with pytest.raises(jqlin.CheckpointError, match="exclude= / --exclude is only used together with quantize="):
        convert(fixtures_dir / "ct_mxfp8", tmp_path / "q", exclude=["*.mlp.*"], progress=False)
    for bad in (0, -1, 1.5):
        with pytest.raises(jqlin.CheckpointError, match="max_shard_bytes must be a positive"):
            convert(fixtures_dir / "ct_mxfp8", tmp_path / "q", max_shard_bytes=bad, progress=False)
    with pytest.raises(SystemExit) as e:
        main(["convert", str(fixtures_dir / "ct_mxfp8"), str(tmp_path / "q"),
              "--max-shard-size", "0"])
    assert e.value.code == 2 and "a shard size must be positive" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bf16"]
