"""Fused q/k/v and gate/up built from loaded layers: lossless, per FORMATS.md sec. 6."""

import jax.numpy as jnp
import numpy as np
import pytest

import jqlin
from jqlin import GlobalScale, Granularity
import ckpt_builders as cb

QKV = [f"{cb.ATTN}.{p}_proj" for p in "qkv"]


def _deq(qw):
    return np.asarray(qw.dequantize())


def test_per_tensor_shards_become_per_channel(tmp_path, rng):
    amax = {m: a for m, a in zip(cb.MODULES, (1.0, 3.0, 2.0, 1.0, 1.0, 1.0, 1.0))}

    def prod(m, w):
        t, d = cb.fp8_tensor(w)
        t["input_scale"] = np.array(np.float32(amax[m]) / np.float32(448), np.float32)
        return t, d
    cb.build(tmp_path, rng, prod, quantization_config={"quant_method": "fp8",
                                                       "activation_scheme": "static"})
    ck = jqlin.load_checkpoint(tmp_path)
    assert len({float(ck.layers[m].scale.reshape(())) for m in QKV}) == 3
    with pytest.warns(UserWarning, match="input scales of the fused parts differ"):
        fused = ck.fuse(QKV)
    assert fused.spec.weight.granularity is Granularity.CHANNEL
    assert fused.shape == (224, 160) and fused.scale.shape == (224, 1)
    np.testing.assert_array_equal(_deq(fused), np.concatenate([_deq(ck.layers[m]) for m in QKV]))
    assert float(fused.input_scale) == np.float32(3.0) / np.float32(448)


def test_block_fixture_projections(fixtures_dir, rng):
    ck = jqlin.load_checkpoint(fixtures_dir / "ct_fp8_block")
    fused = ck.fused_projections()
    assert sorted(fused) == [f"model.layers.{i}.{n}" for i in range(2)
                             for n in ("mlp.gate_up_proj", "self_attn.qkv_proj")]
    qkv = fused["model.layers.1.self_attn.qkv_proj"]
    parts = [ck.layers[f"model.layers.1.self_attn.{p}_proj"] for p in "qkv"]
    assert qkv.shape == (448, 320) and qkv.segments  # 64-row k/v keep their block padding
    np.testing.assert_array_equal(_deq(qkv), np.concatenate([_deq(p) for p in parts]))
    x = jnp.asarray(rng.standard_normal((3, 320)).astype(np.float32))
    want = np.concatenate([np.asarray(jqlin.matmul(x, p, kernel="xla")) for p in parts], axis=-1)
    np.testing.assert_allclose(np.asarray(jqlin.matmul(x, qkv, kernel="xla")), want,
                               rtol=1e-6, atol=1e-6)


def test_nvfp4_shards_with_different_globals(tmp_path, rng):
    cb.build(tmp_path, rng, lambda m, w: cb.nvfp4_modelopt(w, input_scale=0.003),
             hf_quant_config=cb.modelopt_hq("NVFP4", group_size=16))
    ck = jqlin.load_checkpoint(tmp_path)
    fused = ck.fuse([f"{cb.MLP}.gate_proj", f"{cb.MLP}.up_proj"])
    assert fused.spec.weight.global_scale is GlobalScale.MULTIPLIER
    assert fused.global_scale.shape == (192,)  # per-row globals: nothing requantized
    np.testing.assert_array_equal(_deq(fused), np.concatenate(
        [_deq(ck.layers[f"{cb.MLP}.{p}_proj"]) for p in ("gate", "up")]))


def test_inconsistent_shards(tmp_path, rng):
    layers = {QKV[0]: {"quant_algo": "FP8"}, QKV[1]: {"quant_algo": "NVFP4", "group_size": 16},
              QKV[2]: {"quant_algo": "FP8"}, f"{cb.MLP}.gate_proj": {"quant_algo": "FP8"}}
    hq = cb.modelopt_hq("MIXED_PRECISION", quantized_layers=layers)

    def prod(m, w):
        algo = layers.get(m, {}).get("quant_algo")
        if algo == "FP8":
            return cb.fp8_tensor(w, static_input=())
        return cb.nvfp4_modelopt(w, input_scale=0.01) if algo else None
    cb.build(tmp_path, rng, prod, hf_quant_config=hq)
    ck = jqlin.load_checkpoint(tmp_path)
    with pytest.raises(jqlin.CheckpointError, match="inconsistent fused shards.*k_proj"):
        ck.fuse(QKV)
    with pytest.raises(jqlin.CheckpointError, match="gate_up_proj.*up_proj"):
        jqlin.checkpoint.fuse_projections({m: ck.layers[m] for m in ck.layers if "self_attn" not in m})
    with pytest.raises(jqlin.CheckpointError, match="no quantized layer named"):
        ck.fuse([QKV[0], f"{cb.MLP}.up_proj"])
