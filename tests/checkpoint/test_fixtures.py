"""Every shared third-party fixture loads and dequantizes to its producer's own reference."""


import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jqlin
from jqlin import GlobalScale, Granularity, ScaleRule
from jqlin.checkpoint.safetensors_io import TensorStore

# folder -> (format, spec name, activation rule, reference rounded to bf16 by the tool)
FIXTURES = {
    "ct_fp8_dynamic": ("compressed-tensors/fp8_ptpc", "fp8_ptpc", ScaleRule.CT, False),
    "ct_fp8_block": ("compressed-tensors/fp8_block", "fp8_block", ScaleRule.CT, False),
    "ct_nvfp4a16": ("compressed-tensors/nvfp4_a16", "nvfp4_a16", None, True),
    "ct_mxfp8": ("compressed-tensors/mxfp8", "mxfp8", ScaleRule.CT, True),
    "modelopt_nvfp4": ("modelopt/NVFP4", "nvfp4", ScaleRule.MODELOPT, False),
    "modelopt_fp8_pb_wo": ("modelopt/FP8_PB_WO", "fp8_block_a16", None, False),
}
LINEARS = [f"model.layers.{i}.{m}" for i in range(2) for m in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
PLAIN = ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"] + [
    f"model.layers.{i}.{n}.weight" for i in range(2)
    for n in ("input_layernorm", "post_attention_layernorm")]


@pytest.mark.parametrize("folder", sorted(FIXTURES))
def test_fixture_dequantizes_to_reference(fixtures_dir, folder):
    fmt, name, rule, bf16_ref = FIXTURES[folder]
    ck = jqlin.load_checkpoint(fixtures_dir / folder)
    assert ck.format == fmt
    assert sorted(ck.layers) == sorted(LINEARS)
    assert sorted(ck.tensors) == sorted(PLAIN)
    ref = TensorStore(fixtures_dir / folder / "reference" / "dequant.safetensors")
    for module, qw in ck.layers.items():
        assert jqlin.formats.name_of(qw.spec) == name, module
        if rule is not None:
            assert qw.spec.activation.rule is rule
        assert qw.spec.weight.rule is (ScaleRule.MODELOPT if folder.startswith("modelopt")
                                       else ScaleRule.CT)
        got = np.asarray(qw.dequantize())
        want = ref.read(f"{module}.weight")
        assert got.shape == want.shape == qw.shape
        if bf16_ref:  # compressed-tensors decompresses NVFP4/MX to bf16 (fixture README)
            got = got.astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(got, want, err_msg=module)


def test_fixture_plain_tensors_are_unchanged(fixtures_dir):
    ck = jqlin.load_checkpoint(fixtures_dir / "ct_fp8_block")
    src = TensorStore(fixtures_dir / "ct_fp8_block")
    for name, arr in ck.tensors.items():
        assert arr.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(arr), src.read(name))
    assert ck.config["hidden_size"] == 320


def test_unquantized_fixture(fixtures_dir):
    ck = jqlin.load_checkpoint(fixtures_dir / "bf16")
    assert ck.format == "unquantized" and ck.layers == {}
    assert len(ck.tensors) == len(TensorStore(fixtures_dir / "bf16"))


def test_fixture_partial_blocks_pad_storage(fixtures_dir):
    """K = 320 and N = 64 are not multiples of 128: storage is padded, outputs trimmed."""
    ck = jqlin.load_checkpoint(fixtures_dir / "ct_fp8_block")
    qw = ck.layers["model.layers.0.self_attn.k_proj"]
    assert qw.shape == (64, 320) and qw.storage_shape == (128, 384)
    assert qw.scale.shape == (1, 3) and qw.scale.dtype == jnp.float32
    assert not np.asarray(qw.data[64:].astype(jnp.float32)).any()
    assert not np.asarray(qw.data[:, 320:].astype(jnp.float32)).any()


def test_fixture_nvfp4_globals_keep_their_direction(fixtures_dir):
    """CT stores a divisor (large), ModelOpt a multiplier (small): both as stored."""
    ct = jqlin.load_checkpoint(fixtures_dir / "ct_nvfp4a16").layers["model.layers.0.mlp.up_proj"]
    mo = jqlin.load_checkpoint(fixtures_dir / "modelopt_nvfp4").layers["model.layers.0.mlp.up_proj"]
    assert ct.spec.weight.global_scale is GlobalScale.DIVISOR and float(ct.global_scale) > 1
    assert mo.spec.weight.global_scale is GlobalScale.MULTIPLIER and float(mo.global_scale) < 1
    assert mo.spec.activation.global_scale is GlobalScale.MULTIPLIER
    src = TensorStore(fixtures_dir / "modelopt_nvfp4")
    assert float(mo.input_scale) == float(src.read("model.layers.0.mlp.up_proj.input_scale"))
    assert ct.scale.dtype == jnp.float8_e4m3fn and ct.data.dtype == jnp.uint8


def test_fixture_mx_scales_stay_exponent_bytes(fixtures_dir):
    qw = jqlin.load_checkpoint(fixtures_dir / "ct_mxfp8").layers["model.layers.1.mlp.down_proj"]
    src = TensorStore(fixtures_dir / "ct_mxfp8")
    assert qw.spec.weight.granularity is Granularity.GROUP and qw.scale.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(qw.scale),
                                  src.read("model.layers.1.mlp.down_proj.weight_scale"))


def test_fixture_matmul_uses_the_producers_activation_rule(fixtures_dir, rng):
    """CT FP8_DYNAMIC: per-token s = amax/448 (eps for a zero row), x' = e4m3(x/s)*s."""
    qw = jqlin.load_checkpoint(fixtures_dir / "ct_fp8_dynamic").layers[
        "model.layers.0.self_attn.o_proj"]
    x = rng.standard_normal((5, 320)).astype(np.float32)
    x[2] = 0.0
    s = np.abs(x).max(axis=1, keepdims=True) / np.float32(448)
    s = np.where(s == 0, np.finfo(np.float32).eps, s).astype(np.float32)
    xq = np.clip(x / s, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * s
    want = xq.astype(np.float64) @ np.asarray(qw.dequantize(), np.float64).T
    got = np.asarray(jqlin.matmul(jnp.asarray(x), qw, kernel="xla"))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not got[2].any()
