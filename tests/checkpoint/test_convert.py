"""convert: jqlin checkpoints reload bitwise identical, without source-format logic; online
quantization for every registered format; streaming, atomic, sharded output."""

import json
import tracemalloc

import jax.numpy as jnp
import numpy as np
import pytest

import jqlin
from jqlin.checkpoint import convert
from jqlin.checkpoint import native
from jqlin.checkpoint.safetensors_io import ShardWriter, TensorStore
import ckpt_builders as cb
from ckpt_builders import assert_same_checkpoint, assert_same_weight

FIXTURE_FOLDERS = ["bf16", "ct_fp8_dynamic", "ct_fp8_block", "ct_nvfp4a16", "ct_mxfp8",
                   "modelopt_nvfp4", "modelopt_fp8_pb_wo"]


@pytest.mark.parametrize("folder", FIXTURE_FOLDERS)
def test_fixture_round_trip_is_bitwise(fixtures_dir, tmp_path, folder):
    src = jqlin.load_checkpoint(fixtures_dir / folder)
    dst = convert(fixtures_dir / folder, tmp_path / "out", progress=False)
    out = jqlin.load_checkpoint(dst)
    assert out.format == "jqlin" and out.source_format == src.format
    assert_same_checkpoint(src, out)
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "jqlin"
    assert cfg["hidden_size"] == 320 and (dst / "tokenizer.json").is_file()
    assert not (dst / "hf_quant_config.json").exists()


def test_handbuilt_round_trips(tmp_path, rng):
    """Mixed precision, bf16 block scales and a sharded source; and jqlin -> jqlin again."""
    nv = dict(group_size=16, scale_dtype="torch.float8_e4m3fn")
    qc = cb.ct_config({
        "a": cb.ct_group(cb.args(4, "tensor_group", **nv),
                         cb.args(4, "tensor_group", dynamic="local", **nv), "nvfp4-pack-quantized",
                         targets=["re:.*self_attn.*"]),
        "b": cb.ct_group(cb.args(8, "block", block=(128, 128)),
                         cb.args(8, "group", dynamic=True, group_size=128), "float-quantized",
                         targets=["re:.*mlp.*"])})

    def prod(m, w):
        if "self_attn" in m:
            return cb.nvfp4_ct(w, input_global=900.0)
        return cb.fp8_block(w, scale_name="weight_scale", scale_dtype=cb.BF16)
    cb.build(tmp_path / "src", rng, prod, quantization_config=qc, shards=2)
    src = jqlin.load_checkpoint(tmp_path / "src")
    once = jqlin.load_checkpoint(convert(tmp_path / "src", tmp_path / "a", progress=False))
    twice = jqlin.load_checkpoint(convert(tmp_path / "a", tmp_path / "b", progress=False))
    assert_same_checkpoint(src, once)
    assert_same_checkpoint(src, twice)
    assert once.source_format == twice.source_format == "compressed-tensors/mixed-precision"


def _amax(modules, rng):
    return {m: float(rng.uniform(0.5, 8.0)) for m in modules}


@pytest.mark.parametrize("fmt", jqlin.formats.names())
def test_quantize_round_trip_every_format(tmp_path, rng, fmt):
    _, plain, _ = cb.build(tmp_path / "bf16", rng, lambda m, w: None)
    spec = jqlin.formats.get(fmt)
    static = spec.activation is not None and (not spec.activation.dynamic
                                              or spec.activation.global_scale is not None)
    amax = _amax(cb.MODULES, rng) if static else None
    dst = convert(tmp_path / "bf16", tmp_path / "q", quantize=fmt, input_amax=amax, progress=False)
    ck = jqlin.load_checkpoint(dst)
    assert ck.format == "jqlin" and ck.source_format == f"jqlin.quantize/{fmt}"
    assert sorted(ck.layers) == sorted(cb.MODULES)
    # lm_head, embeddings and norms are left alone, as producers do
    assert sorted(ck.tensors) == sorted(n for n in plain if n.rpartition(".")[0] not in cb.MODULES)
    for name in ck.tensors:
        np.testing.assert_array_equal(np.asarray(ck.tensors[name]), plain[name])
    for m, qw in ck.layers.items():
        w = jnp.asarray(plain[f"{m}.weight"])
        kw = {}
        if static:
            kw["input_scale"] = jqlin.calibrate_input_scale(spec.activation, jnp.float32(amax[m]))
        assert_same_weight(qw, jqlin.quantize(w, fmt, **kw), m)


def test_quantize_needs_static_scales_and_an_unquantized_source(tmp_path, rng, fixtures_dir):
    cb.build(tmp_path / "bf16", rng, lambda m, w: None)
    with pytest.raises(jqlin.CheckpointError, match="input_amax has no entry"):
        convert(tmp_path / "bf16", tmp_path / "x", quantize="fp8_per_tensor", progress=False)
    with pytest.raises(jqlin.CheckpointError, match="unknown format"):
        convert(tmp_path / "bf16", tmp_path / "x", quantize="int4", progress=False)
    with pytest.raises(jqlin.CheckpointError, match="already quantized"):
        convert(fixtures_dir / "ct_mxfp8", tmp_path / "x", quantize="mxfp8", progress=False)
    assert not (tmp_path / "x").exists()


def test_quantize_exclude_patterns(tmp_path, rng):
    cb.build(tmp_path / "bf16", rng, lambda m, w: None)
    ck = jqlin.load_checkpoint(convert(tmp_path / "bf16", tmp_path / "q", quantize="fp8_ptpc",
                                       exclude=["*.mlp.*"], progress=False))
    assert sorted(ck.layers) == sorted(m for m in cb.MODULES if ".mlp." not in m)
    assert f"{cb.MLP}.up_proj.weight" in ck.tensors


def test_failure_leaves_no_partial_destination(tmp_path, rng):
    def prod(m, w):
        t, d = cb.fp8_block(w)
        if m.endswith("v_proj"):  # the last layer written (sorted): earlier ones are on disk
            t["weight_scale_inv"] = np.full_like(t["weight_scale_inv"], np.nan)
        return t, d
    cb.build(tmp_path / "src", rng, prod, quantization_config={
        "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})
    out = tmp_path / "out"
    with pytest.raises(jqlin.CheckpointError, match="v_proj.weight_scale_inv"):
        convert(tmp_path / "src", out, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_overwrite(tmp_path, fixtures_dir):
    out = tmp_path / "out"
    convert(fixtures_dir / "ct_mxfp8", out, progress=False)
    with pytest.raises(jqlin.CheckpointError, match="already exists"):
        convert(fixtures_dir / "ct_fp8_block", out, progress=False)
    convert(fixtures_dir / "ct_fp8_block", out, overwrite=True, progress=False)
    assert jqlin.load_checkpoint(out).source_format == "compressed-tensors/fp8_block"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_output_shards_and_index(tmp_path, fixtures_dir):
    dst = convert(fixtures_dir / "ct_fp8_block", tmp_path / "out", progress=False,
                  max_shard_bytes=600_000)
    shards = sorted(p.name for p in dst.glob("*.safetensors"))
    assert len(shards) > 2 and (dst / "model.safetensors.index.json").is_file()
    assert all(p.stat().st_size <= 600_000 + 1_000_000 for p in dst.glob("*.safetensors"))
    assert_same_checkpoint(jqlin.load_checkpoint(fixtures_dir / "ct_fp8_block"),
                           jqlin.load_checkpoint(dst))


def test_streaming_memory_stays_near_one_tensor(tmp_path):
    """Host allocations during convert stay near the largest tensor, not the model's total."""
    src = tmp_path / "big"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cb.BASE_CONFIG))
    one = 1 << 20
    cb.write_tensors(src, {f"t{i}": np.full(one // 4, i, np.float32) for i in range(16)}, shards=2)
    tracemalloc.start()
    try:
        convert(src, tmp_path / "out", progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * one, f"peak {peak} bytes for 1 MiB tensors, 16 MiB in all"
    store = TensorStore(tmp_path / "out")
    assert len(store) == 16 and float(store.read("t7")[3]) == 7.0


def test_native_checkpoint_keeps_fused_segments(tmp_path, fixtures_dir):
    """A fused block weight with partial blocks (row segments) survives the jqlin format."""
    ck = jqlin.load_checkpoint(fixtures_dir / "ct_fp8_block")
    fused = ck.fuse([f"model.layers.0.self_attn.{p}_proj" for p in "qkv"])
    assert fused.segments  # 320 + 64 + 64 rows, each part padded to whole 128-row blocks
    out = tmp_path / "fused"
    out.mkdir()
    writer = ShardWriter(out)
    for role, arr in (("data", fused.data), ("scale", fused.scale)):
        writer.write(native.tensor_names("attn.qkv", fused)[role], np.asarray(arr))
    writer.close()
    (out / native.METADATA_FILE).write_text(json.dumps({
        "format_version": 1, "source_format": "test",
        "layers": {"attn.qkv": native.layer_entry("attn.qkv", fused)}}))
    (out / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "jqlin"}}))
    back = jqlin.load_checkpoint(out).layers["attn.qkv"]
    assert_same_weight(fused, back)
    np.testing.assert_array_equal(np.asarray(back.dequantize()), np.concatenate(
        [np.asarray(ck.layers[f"model.layers.0.self_attn.{p}_proj"].dequantize()) for p in "qkv"]))


def test_native_metadata_errors(tmp_path, fixtures_dir):
    dst = convert(fixtures_dir / "ct_nvfp4a16", tmp_path / "out", progress=False)
    meta_path = dst / native.METADATA_FILE
    meta = json.loads(meta_path.read_text())
    layer = "model.layers.0.mlp.up_proj"
    bad = json.loads(json.dumps(meta))
    bad["layers"][layer]["spec"]["weight"]["group_size"] = 0
    meta_path.write_text(json.dumps(bad))
    with pytest.raises(jqlin.CheckpointError, match=f"layers.{layer}.spec"):
        jqlin.load_checkpoint(dst)
    bad = json.loads(json.dumps(meta))
    bad["layers"][layer]["shape"] = [768, 400]  # K larger than what is stored
    meta_path.write_text(json.dumps(bad))
    with pytest.raises(jqlin.CheckpointError, match=f"'{layer}.weight'"):
        jqlin.load_checkpoint(dst)
    meta_path.unlink()
    with pytest.raises(jqlin.CheckpointError, match=native.METADATA_FILE):
        jqlin.load_checkpoint(dst)


def test_quantize_names_a_weight_holding_nan(tmp_path, rng):
    """A NaN in a bf16 weight being quantized is a CheckpointError naming the tensor, and
    nothing is written."""
    target = f"{cb.MLP}.up_proj"

    def prod(m, w):
        if m == target:
            w[3, 5] = np.nan
    cb.build(tmp_path / "bf16", rng, prod)
    with pytest.raises(jqlin.CheckpointError,
                       match=rf"tensor '{target}\.weight': weight holds 1 NaN or inf"):
        convert(tmp_path / "bf16", tmp_path / "q", quantize="fp8_ptpc", progress=False)
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("edit,words", [
    (lambda e: e.update(shape=[e["shape"][0] // 2, e["shape"][1]]), "stored rows"),
    (lambda e: e.update(shape=[e["shape"][0], e["shape"][1] - 20]), "stored columns"),
    (lambda e: e.update(segments=[[0, e["shape"][0] // 2]] * 2), "non-overlapping"),
    (lambda e: e.update(segments=[[-10, e["shape"][0]]]), "non-overlapping"),
    (lambda e: e.update(segments=[[0, 8], [16, e["shape"][0] - 8]]), "reach row"),
])
def test_native_metadata_must_match_the_arrays(fixtures_dir, tmp_path, edit, words):
    """jqlin_quant.json's shape and segments were trusted: a smaller shape dropped stored rows
    or columns silently, overlapping segments duplicated rows."""
    dst = convert(fixtures_dir / "modelopt_nvfp4", tmp_path / "out", progress=False)
    meta_file = dst / native.METADATA_FILE
    meta = json.loads(meta_file.read_text())
    module = "model.layers.0.mlp.down_proj"
    edit(meta["layers"][module])
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(jqlin.CheckpointError, match=f"layer '{module}'.*{words}"):
        jqlin.load_checkpoint(dst)
