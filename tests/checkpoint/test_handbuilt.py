"""Hand-built checkpoints for every format the shared fixtures lack (FORMATS.md secs. 3-5)."""


import jax.numpy as jnp
import numpy as np
import pytest

import jqlin
from jqlin import GlobalScale, Granularity as Gr, QuantKey, QuantSpec, ScaleRule
from jqlin.checkpoint import convert
import ckpt_builders as cb
from ckpt_builders import assert_same_checkpoint

E4M3, E2M1, E8M0 = "float8_e4m3fn", "float4_e2m1fn", "float8_e8m0fnu"
VLLM, CT, MO = ScaleRule.VLLM, ScaleRule.CT, ScaleRule.MODELOPT
ALL = sorted(cb.MODULES)


def _only(fn, modules):
    return lambda m, w: fn(w) if m in modules else None


# id -> (build kwargs maker, expected format, {module: expected spec}, ) ---------------------------
def hf_fp8_static():
    qc = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
    prod = lambda m, w: cb.fp8_tensor(w, static_input=())
    spec = QuantSpec(QuantKey(E4M3, Gr.TENSOR, rule=VLLM), QuantKey(E4M3, Gr.TENSOR, rule=VLLM))
    return dict(producer=prod, quantization_config=qc), "fp8/per_tensor", {m: spec for m in ALL}


def hf_fp8_dynamic():
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    prod = lambda m, w: cb.fp8_tensor(w, scale_shape=(1,))
    spec = QuantSpec(QuantKey(E4M3, Gr.TENSOR, rule=VLLM),
                     QuantKey(E4M3, Gr.TOKEN, dynamic=True, rule=VLLM))
    return dict(producer=prod, quantization_config=qc), "fp8/per_tensor_dynamic", {m: spec for m in ALL}


def _deepseek(scale_dtype):
    def make():
        qc = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
              "weight_block_size": [128, 128]}
        prod = lambda m, w: cb.fp8_block(w, scale_dtype=scale_dtype)
        spec = QuantSpec(QuantKey(E4M3, Gr.BLOCK, block=(128, 128), rule=VLLM),
                         QuantKey(E4M3, Gr.GROUP, dynamic=True, group_size=128, rule=VLLM))
        return dict(producer=prod, quantization_config=qc), "fp8/block", {m: spec for m in ALL}
    return make


def deepseek_v31_ue8m0():
    """DeepSeek-V3.1 on: `scale_fmt: "ue8m0"`, power-of-two activation scales (DeepSeek's rule)."""
    qc = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
          "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
    spec = QuantSpec(QuantKey(E4M3, Gr.BLOCK, block=(128, 128), rule=VLLM),
                     QuantKey(E4M3, Gr.GROUP, scale_dtype=E8M0, dynamic=True, group_size=128,
                              rule=ScaleRule.DEEPSEEK))
    return (dict(producer=lambda m, w: cb.fp8_block(w), quantization_config=qc),
            "fp8/block_ue8m0", {m: spec for m in ALL})


FBGEMM_KEPT = "model.layers.1.mlp.down_proj"


def fbgemm_fp8():
    """HF FbgemmFp8Config (e.g. Llama-3.1-405B-Instruct-FP8): per-row weight scales (N, 1),
    per-token activations whose amax is bounded by activation_scale_ub. Layer 1's down_proj
    stays bf16, named by an entry older transformers matched as a substring."""
    qc = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
          "modules_to_not_convert": ["lm_head", "layers.1.mlp.down_proj"]}
    spec = QuantSpec(QuantKey(E4M3, Gr.CHANNEL, rule=VLLM),
                     QuantKey(E4M3, Gr.TOKEN, dynamic=True, rule=VLLM, amax_bound=1200.0))
    prod = lambda m, w: None if m == FBGEMM_KEPT else cb.fp8_channel(w, scale_shape=(-1, 1))
    return (dict(producer=prod, quantization_config=qc, layers=2), "fbgemm_fp8/ptpc",
            {m: spec for m in cb.modules(2) if m != FBGEMM_KEPT})


def ct_fp8_tensor_static():
    g = cb.ct_group(cb.args(8, "tensor"), cb.args(8, "tensor"), "float-quantized")
    prod = lambda m, w: cb.fp8_tensor(w, scale_shape=(1,), static_input=(1,))
    spec = QuantSpec(QuantKey(E4M3, Gr.TENSOR, rule=CT), QuantKey(E4M3, Gr.TENSOR, rule=CT))
    return (dict(producer=prod, quantization_config=cb.ct_config({"group_0": g})),
            "compressed-tensors/fp8_per_tensor", {m: spec for m in ALL})


def ct_fp8_channel_f32():
    g = cb.ct_group(cb.args(8, "channel"), cb.args(8, "token", dynamic=True), "naive-quantized")
    spec = QuantSpec(QuantKey(E4M3, Gr.CHANNEL, rule=CT),
                     QuantKey(E4M3, Gr.TOKEN, dynamic=True, rule=CT))
    return (dict(producer=lambda m, w: cb.fp8_channel(w), quantization_config=cb.ct_config({"g": g})),
            "compressed-tensors/fp8_ptpc", {m: spec for m in ALL})


def ct_fp8_strategy_inferred():
    """Args without `strategy`, as compressed-tensors accepts them: group_size -1 is channel,
    none is tensor; strategy strings in any case."""
    g = cb.ct_group(cb.args(8, None, group_size=-1), cb.args(8, "TOKEN", dynamic=True),
                    "float-quantized", targets=["re:.*mlp\\..*_proj$"])
    t = cb.ct_group(cb.args(8, None), cb.args(8, None), "float-quantized",
                    targets=["re:.*self_attn\\..*_proj$"])

    def prod(m, w):
        if "self_attn" in m:
            return cb.fp8_tensor(w, scale_shape=(1,), static_input=(1,))
        return cb.fp8_channel(w)
    tensor = QuantSpec(QuantKey(E4M3, Gr.TENSOR, rule=CT), QuantKey(E4M3, Gr.TENSOR, rule=CT))
    channel = QuantSpec(QuantKey(E4M3, Gr.CHANNEL, rule=CT),
                        QuantKey(E4M3, Gr.TOKEN, dynamic=True, rule=CT))
    return (dict(producer=prod, quantization_config=cb.ct_config({"g": g, "t": t})),
            "compressed-tensors/mixed-precision",
            {m: tensor if "self_attn" in m else channel for m in ALL})


def ct_fp8_group():
    g = cb.ct_group(cb.args(8, "group", group_size=32),
                    cb.args(8, "tensor", dynamic=True), "float-quantized")
    spec = QuantSpec(QuantKey(E4M3, Gr.GROUP, group_size=32, rule=CT),
                     QuantKey(E4M3, Gr.TENSOR, dynamic=True, rule=CT))
    return (dict(producer=lambda m, w: cb.fp8_group(w, 32), quantization_config=cb.ct_config({"g": g})),
            "compressed-tensors/custom", {m: spec for m in ALL})


def ct_nvfp4_w4a4():
    nv = dict(group_size=16, scale_dtype="torch.float8_e4m3fn")
    g = cb.ct_group(cb.args(4, "tensor_group", **nv), cb.args(4, "tensor_group", dynamic="local", **nv),
                    "nvfp4-pack-quantized")
    kw = dict(scale_dtype=E4M3, group_size=16, rule=CT, global_scale=GlobalScale.DIVISOR)
    spec = QuantSpec(QuantKey(E2M1, Gr.GROUP, **kw), QuantKey(E2M1, Gr.GROUP, dynamic=True, **kw))
    prod = lambda m, w: cb.nvfp4_ct(w, input_global=448 * 6 / 3.5)
    return (dict(producer=prod, quantization_config=cb.ct_config({"group_0": g})),
            "compressed-tensors/nvfp4", {m: spec for m in ALL})


def ct_mxfp4():
    mx = dict(group_size=32, scale_dtype="torch.uint8")
    g = cb.ct_group(cb.args(4, "group", **mx), cb.args(4, "group", dynamic=True, **mx),
                    "mxfp4-pack-quantized")
    kw = dict(scale_dtype=E8M0, group_size=32, rule=CT)
    spec = QuantSpec(QuantKey(E2M1, Gr.GROUP, **kw), QuantKey(E2M1, Gr.GROUP, dynamic=True, **kw))
    prod = lambda m, w: cb.mx(w, fp4=True, data_name="weight_packed")
    return (dict(producer=prod, quantization_config=cb.ct_config({"group_0": g})),
            "compressed-tensors/mxfp4", {m: spec for m in ALL})


def ct_old_mxfp4_alias():
    """compressed-tensors <= 0.12: MXFP4 written by the nvfp4 compressor, no scale_dtype key."""
    g = cb.ct_group(cb.args(4, "group", group_size=32), None, "nvfp4-pack-quantized")
    spec = QuantSpec(QuantKey(E2M1, Gr.GROUP, scale_dtype=E8M0, group_size=32, rule=CT))
    prod = lambda m, w: cb.mx(w, fp4=True, data_name="weight_packed")
    return (dict(producer=prod, quantization_config=cb.ct_config({"group_0": g})),
            "compressed-tensors/mxfp4_a16", {m: spec for m in ALL})


def ct_mixed_precision():
    """Two groups selected by `re:` targets; `re:` ignore keeps down_proj in bf16."""
    nv = dict(group_size=16, scale_dtype="torch.float8_e4m3fn")
    attn = cb.ct_group(cb.args(4, "tensor_group", **nv), None, "nvfp4-pack-quantized",
                       targets=["re:.*self_attn\\..*_proj$"])
    mlp = cb.ct_group(cb.args(8, "block", block=(128, 128)), cb.args(8, "group", dynamic=True, group_size=128),
                      "float-quantized", targets=["re:.*mlp\\..*_proj$"])
    qc = cb.ct_config({"group_0": attn, "group_1": mlp}, ignore=["lm_head", "re:.*down_proj$"])

    def prod(m, w):
        if "self_attn" in m:
            return cb.nvfp4_ct(w)
        if m.endswith("down_proj"):
            return None
        return cb.fp8_block(w, scale_name="weight_scale", scale_dtype=cb.BF16)
    nvfp4 = QuantSpec(QuantKey(E2M1, Gr.GROUP, scale_dtype=E4M3, group_size=16, rule=CT,
                               global_scale=GlobalScale.DIVISOR))
    block = QuantSpec(QuantKey(E4M3, Gr.BLOCK, block=(128, 128), rule=CT),
                      QuantKey(E4M3, Gr.GROUP, dynamic=True, group_size=128, rule=CT))
    specs = {m: nvfp4 if "self_attn" in m else block for m in ALL if not m.endswith("down_proj")}
    return dict(producer=prod, quantization_config=qc), "compressed-tensors/mixed-precision", specs


def ct_old_zero_points_and_shape():
    """Older compressed-tensors wrote all-zero symmetric zero points and `weight_shape`."""
    g = cb.ct_group(cb.args(8, "channel"), cb.args(8, "token", dynamic=True), "float-quantized")

    def prod(m, w):
        t, d = cb.fp8_channel(w)
        t["weight_zero_point"] = np.zeros((w.shape[0], 1), cb.E4M3)
        t["weight_shape"] = np.array(w.shape, np.int64)
        return t, d
    spec = QuantSpec(QuantKey(E4M3, Gr.CHANNEL, rule=CT), QuantKey(E4M3, Gr.TOKEN, dynamic=True, rule=CT))
    return dict(producer=prod, quantization_config=cb.ct_config({"g": g})), \
        "compressed-tensors/fp8_ptpc", {m: spec for m in ALL}


def mo_fp8():
    prod = lambda m, w: cb.fp8_tensor(w, static_input=())
    spec = QuantSpec(QuantKey(E4M3, Gr.TENSOR, rule=MO), QuantKey(E4M3, Gr.TENSOR, rule=MO))
    return dict(producer=prod, hf_quant_config=cb.modelopt_hq("FP8")), "modelopt/FP8", {m: spec for m in ALL}


def mo_fp8_pcpt():
    prod = lambda m, w: cb.fp8_channel(w, scale_shape=(w.shape[0],))
    spec = QuantSpec(QuantKey(E4M3, Gr.CHANNEL, rule=MO), QuantKey(E4M3, Gr.TOKEN, dynamic=True, rule=MO))
    return (dict(producer=prod, hf_quant_config=cb.modelopt_hq("FP8_PER_CHANNEL_PER_TOKEN")),
            "modelopt/FP8_PER_CHANNEL_PER_TOKEN", {m: spec for m in ALL})


def mo_nvfp4_w4a16():
    spec = QuantSpec(QuantKey(E2M1, Gr.GROUP, scale_dtype=E4M3, group_size=16, rule=MO,
                              global_scale=GlobalScale.MULTIPLIER))
    hq = cb.modelopt_hq("W4A16_NVFP4", group_size=16)
    return (dict(producer=lambda m, w: cb.nvfp4_modelopt(w), hf_quant_config=hq),
            "modelopt/W4A16_NVFP4", {m: spec for m in ALL})


def mo_mxfp8():
    kw = dict(scale_dtype=E8M0, group_size=32, rule=MO)
    spec = QuantSpec(QuantKey(E4M3, Gr.GROUP, **kw), QuantKey(E4M3, Gr.GROUP, dynamic=True, **kw))
    return (dict(producer=lambda m, w: cb.mx(w, fp4=False, data_name="weight"),
                 hf_quant_config=cb.modelopt_hq("MXFP8")), "modelopt/MXFP8", {m: spec for m in ALL})


def mo_fp8_pb_wo_2d_scale():
    """FP8_PB_WO with its block scales as a plain (N/128, K/128) grid (build.py accepts it
    beside the exporter's 4-D (N/128, 1, K/128, 1))."""
    spec = QuantSpec(QuantKey(E4M3, Gr.BLOCK, block=(128, 128), rule=MO))
    return (dict(producer=lambda m, w: cb.fp8_block(w, scale_name="weight_scale"),
                 hf_quant_config=cb.modelopt_hq("FP8_PB_WO")), "modelopt/FP8_PB_WO",
            {m: spec for m in ALL})


def mo_mixed():
    layers = {m: ({"quant_algo": "FP8"} if "self_attn" in m else
                  {"quant_algo": "NVFP4", "group_size": 16}) for m in ALL if "down_proj" not in m}
    hq = cb.modelopt_hq("MIXED_PRECISION", quantized_layers=layers)
    del hq["quantization"]["exclude_modules"]

    def prod(m, w):
        if m not in layers:
            return None
        if "self_attn" in m:
            return cb.fp8_tensor(w, static_input=())
        return cb.nvfp4_modelopt(w, input_scale=2.0 / 2688)
    fp8 = QuantSpec(QuantKey(E4M3, Gr.TENSOR, rule=MO), QuantKey(E4M3, Gr.TENSOR, rule=MO))
    kw = dict(scale_dtype=E4M3, group_size=16, rule=MO, global_scale=GlobalScale.MULTIPLIER)
    nv = QuantSpec(QuantKey(E2M1, Gr.GROUP, **kw), QuantKey(E2M1, Gr.GROUP, dynamic=True, **kw))
    return (dict(producer=prod, hf_quant_config=hq), "modelopt/MIXED_PRECISION",
            {m: fp8 if "self_attn" in m else nv for m in layers})


def mo_lowercase_algo_in_config_json():
    """No hf_quant_config.json: config.json quant_method modelopt, lower-case algo, `ignore`
    wildcards, and CT-like config_groups that must not be read as compressed-tensors."""
    qc = {"quant_method": "modelopt", "quant_algo": "fp8_pb_wo",
          "ignore": ["lm_head", "model.embed_tokens", "*.mlp.up_*"],
          "producer": {"name": "modelopt", "version": "0.47.0"},
          "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"},
                                        "targets": ["Linear"]}}}

    def prod(m, w):
        if m.endswith("up_proj"):
            return None
        return cb.fp8_block(w, scale_name="weight_scale", four_d=True)
    spec = QuantSpec(QuantKey(E4M3, Gr.BLOCK, block=(128, 128), rule=MO))
    return (dict(producer=prod, quantization_config=qc), "modelopt/FP8_PB_WO",
            {m: spec for m in ALL if not m.endswith("up_proj")})


CASES = {
    "hf_fp8_per_tensor_static": hf_fp8_static,
    "hf_fp8_per_tensor_dynamic": hf_fp8_dynamic,
    "deepseek_block_f32_scale_inv": _deepseek(np.float32),
    "deepseek_block_bf16_scale_inv": _deepseek(cb.BF16),
    "deepseek_v31_ue8m0": deepseek_v31_ue8m0,
    "fbgemm_fp8": fbgemm_fp8,
    "ct_fp8_tensor_static": ct_fp8_tensor_static,
    "ct_fp8_channel_f32": ct_fp8_channel_f32,
    "ct_fp8_group": ct_fp8_group,
    "ct_fp8_strategy_inferred": ct_fp8_strategy_inferred,
    "ct_nvfp4_w4a4": ct_nvfp4_w4a4,
    "ct_mxfp4": ct_mxfp4,
    "ct_old_mxfp4_alias": ct_old_mxfp4_alias,
    "ct_mixed_precision": ct_mixed_precision,
    "ct_old_zero_points": ct_old_zero_points_and_shape,
    "modelopt_fp8": mo_fp8,
    "modelopt_fp8_per_channel_per_token": mo_fp8_pcpt,
    "modelopt_w4a16_nvfp4": mo_nvfp4_w4a16,
    "modelopt_mxfp8": mo_mxfp8,
    "modelopt_fp8_pb_wo_2d_scale": mo_fp8_pb_wo_2d_scale,
    "modelopt_mixed_precision": mo_mixed,
    "modelopt_lowercase_config_json": mo_lowercase_algo_in_config_json,
}


def make_case(name, tmp_path, rng, shards=1):
    kw, fmt, specs = CASES[name]()
    path = tmp_path / name
    expected, plain, raw = cb.build(path, rng, kw.pop("producer"), shards=shards, **kw)
    assert sorted(expected) == sorted(specs)
    return path, fmt, specs, expected, plain, raw


def check_loaded(ck, fmt, specs, expected, plain, raw):
    assert ck.format == fmt
    assert sorted(ck.layers) == sorted(specs)
    for module, qw in ck.layers.items():
        assert qw.spec == specs[module], module
        np.testing.assert_array_equal(np.asarray(qw.dequantize()), expected[module], err_msg=module)
        if qw.input_scale is not None:
            name = f"{module}.input_global_scale" if f"{module}.input_global_scale" in raw else \
                f"{module}.input_scale"
            assert float(qw.input_scale) == float(np.asarray(raw[name]).reshape(()))
        if qw.spec.weight.scale_dtype == "float32":
            assert qw.scale.dtype == jnp.float32
    assert sorted(ck.tensors) == sorted(plain)
    for name, arr in plain.items():
        np.testing.assert_array_equal(np.asarray(ck.tensors[name]), arr)


@pytest.mark.parametrize("case", sorted(CASES))
def test_handbuilt_loads_and_dequantizes(tmp_path, rng, case):
    path, fmt, specs, expected, plain, raw = make_case(case, tmp_path, rng)
    check_loaded(jqlin.load_checkpoint(path), fmt, specs, expected, plain, raw)


@pytest.mark.parametrize("case", sorted(CASES))
def test_handbuilt_converts_and_reloads_bitwise(tmp_path, rng, case):
    """Every converter path (each source format's planner) into a jqlin checkpoint, reloaded
    without source-format logic: the same specs and bits, the source format recorded."""
    path, fmt, *_ = make_case(case, tmp_path, rng)
    src = jqlin.load_checkpoint(path)
    out = jqlin.load_checkpoint(convert(path, tmp_path / "out", progress=False))
    assert out.format == "jqlin" and out.source_format == fmt
    assert_same_checkpoint(src, out)


def test_deepseek_ue8m0_layers_run_deepseeks_activation_rule(tmp_path, rng):
    """A `scale_fmt: "ue8m0"` layer's product: the stored weight times activations quantized
    by DeepSeek's power-of-two rule (the NumPy oracle), to float32 accumulation; the
    activations' codes are not the vLLM rule's. The Pallas FP8 block kernel takes the rule
    (its scales as float32 powers of two; interpret mode here) to the same product; the MX
    kernels, which compute the CT / ModelOpt rules, refuse it."""
    import oracle
    from jqlin import registered_kernels
    path, _, specs, expected, *_ = make_case("deepseek_v31_ue8m0", tmp_path, rng)
    module = f"{cb.MLP}.down_proj"
    qw = jqlin.load_checkpoint(path).layers[module]
    n, k = qw.shape
    x = (rng.standard_normal((5, k)) * np.exp2(rng.uniform(-8, 8, (5, 1)))).astype(np.float32)
    kp = qw.storage_shape[1]
    deq, _ = oracle.act_fp8_ue8m0(oracle.pad_to(x, 5, kp))
    ref = deq[:, :k] @ expected[module].astype(np.float64).T
    for kernel in ("auto", "pallas_fp8_block"):
        y = np.asarray(jqlin.matmul(x, qw, out_dtype=jnp.float32, kernel=kernel))
        assert np.linalg.norm(y - ref) <= 1e-6 * np.linalg.norm(ref), kernel
    vllm = oracle.act_fp8_dynamic(oracle.pad_to(x, 5, kp), 128, vllm=True)[:, :k]
    moved = vllm @ expected[module].astype(np.float64).T - ref  # (the rule matters)
    assert np.linalg.norm(moved) > 1e-4 * np.linalg.norm(ref)
    kernels = registered_kernels()
    assert kernels["pallas_fp8_block"].spec_mismatch(qw.spec) is None
    mx = jqlin.formats.get("mxfp8")
    act32 = QuantKey(E4M3, Gr.GROUP, scale_dtype=E8M0, dynamic=True, group_size=32,
                     rule=ScaleRule.DEEPSEEK)
    assert "rule='deepseek'" in kernels["pallas_mxfp8"].spec_mismatch(QuantSpec(mx.weight, act32))
    assert kernels["pallas_mxfp8"].spec_mismatch(mx) is None


def test_fbgemm_layers_bound_the_activation_amax(tmp_path, rng):
    """An fbgemm_fp8 layer's product: the stored weight times activations quantized per token
    with the amax bounded by activation_scale_ub (the NumPy oracle: values past the bound
    saturate at +-448), to float32 accumulation -- on the XLA reference and the Pallas W8A8
    kernel (interpret mode). Without the bound the product moves."""
    import oracle
    path, _, specs, expected, *_ = make_case("fbgemm_fp8", tmp_path, rng)
    module = f"{cb.MLP}.up_proj"
    qw = jqlin.load_checkpoint(path).layers[module]
    assert qw.spec == specs[module]
    n, k = qw.shape
    x = (rng.standard_normal((6, k)) * np.exp2(rng.uniform(-4, 4, (6, 1)))).astype(np.float32)
    x[:3, 5] = [2500.0, -1e4, 1200.5]  # rows whose amax passes the bound
    ref = oracle.act_fp8_dynamic(x, vllm=True, amax_bound=1200.0) @ expected[module].T
    for kernel in ("auto", "xla", "pallas_fp8_w8a8"):
        y = np.asarray(jqlin.matmul(x, qw, out_dtype=jnp.float32, kernel=kernel))
        assert np.linalg.norm(y - ref) <= 1e-6 * np.linalg.norm(ref), kernel
    unbounded = oracle.act_fp8_dynamic(x, vllm=True) @ expected[module].T
    moved = np.linalg.norm(unbounded[:3] - ref[:3], axis=1)
    assert (moved[:2] > 1e-2 * np.linalg.norm(ref[:2], axis=1)).all()  # (the bound matters,
    assert moved[2] > 0  # a little just past it,
    np.testing.assert_array_equal(unbounded[3:], ref[3:])  # and not below it)


FBGEMM_SKIP_CASES = {  # modules_to_not_convert -> None (loads) or the error it must raise
    "exact": (["model.layers.1.mlp.down_proj"], None),
    "substring": (["layers.1.mlp.down"], None),  # (older transformers: `key in name`)
    "regex_prefix": ([r"model\.layers\.1\.mlp"], None),  # (later: re.match)
    "suffix": (["1.mlp.down_proj"], None),  # (later: name.endswith(key))
    "not_named": (["lm_head"], f"'{FBGEMM_KEPT}' stores its weight unquantized"
                               ".*'modules_to_not_convert'"),
    "quantized_named": (["lm_head", "model.layers.0.mlp.up_proj"],
                        "'model.layers.0.mlp.up_proj' matches modules_to_not_convert entry"),
}


@pytest.mark.parametrize("case", sorted(FBGEMM_SKIP_CASES))
def test_fbgemm_modules_to_not_convert(tmp_path, rng, case):
    """A bf16 Linear whose sibling is quantized loads when modules_to_not_convert names it the
    way some transformers version matches (exactly, substring, regex prefix, suffix), and is
    an error naming the module otherwise; a quantized module named by an entry is an error."""
    from jqlin.errors import CheckpointError
    entries, error = FBGEMM_SKIP_CASES[case]
    kw, *_ = fbgemm_fp8()
    prod, qc = kw.pop("producer"), kw.pop("quantization_config")
    cb.build(tmp_path, rng, prod, quantization_config={**qc, "modules_to_not_convert": entries},
             **kw)
    if error is not None:
        with pytest.raises(CheckpointError, match=error):
            jqlin.load_checkpoint(tmp_path)
    else:
        ck = jqlin.load_checkpoint(tmp_path)
        assert FBGEMM_KEPT not in ck.layers and f"{FBGEMM_KEPT}.weight" in ck.tensors


def test_sharded_index(tmp_path, rng):
    path, fmt, specs, expected, plain, raw = make_case("ct_nvfp4_w4a4", tmp_path, rng, shards=3)
    assert (path / "model.safetensors.index.json").is_file()
    assert not (path / "model.safetensors").exists()
    check_loaded(jqlin.load_checkpoint(path), fmt, specs, expected, plain, raw)


def test_deepseek_partial_blocks_storage(tmp_path, rng):
    path, *_ = make_case("deepseek_block_bf16_scale_inv", tmp_path, rng)
    qw = jqlin.load_checkpoint(path).layers[f"{cb.MLP}.down_proj"]  # (160, 96)
    assert qw.shape == (160, 96) and qw.storage_shape == (256, 128)
    assert qw.scale.shape == (2, 1) and qw.scale.dtype == jnp.float32


def test_hf_fp8_static_input_scale_is_scalar_f32(tmp_path, rng):
    path, *_ = make_case("hf_fp8_per_tensor_static", tmp_path, rng)
    qw = jqlin.load_checkpoint(path).layers[f"{cb.ATTN}.q_proj"]
    assert qw.input_scale.shape == () and qw.input_scale.dtype == jnp.float32
    assert qw.scale.shape == (1, 1)


def test_modelopt_w4a16_tolerates_an_input_scale(tmp_path, rng):
    """Some exports write input_scale for W4A16_NVFP4; vLLM ignores it, so does jqlin."""
    def prod(m, w):
        return cb.nvfp4_modelopt(w, input_scale=0.01)
    cb.build(tmp_path, rng, prod, hf_quant_config=cb.modelopt_hq("W4A16_NVFP4", group_size=16))
    ck = jqlin.load_checkpoint(tmp_path)
    assert all(qw.input_scale is None and qw.spec.activation is None for qw in ck.layers.values())
    assert not any(n.endswith("input_scale") for n in ck.tensors)


def test_modelopt_config_json_and_hf_quant_config_agree(tmp_path, rng):
    hq = cb.modelopt_hq("nvfp4", group_size=16)
    qc = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    cb.build(tmp_path, rng, lambda m, w: cb.nvfp4_modelopt(w, input_scale=0.01),
             hf_quant_config=hq, quantization_config=qc)
    assert jqlin.load_checkpoint(tmp_path).format == "modelopt/NVFP4"
