"""Table-driven corruptions: each gives a CheckpointError naming the tensor / config key at fault,
and `inspect` lists the same problem without raising."""

import json
import struct

import numpy as np
import pytest

import jqlin
from jqlin.checkpoint import inspect
import ckpt_builders as cb

Q = f"{cb.ATTN}.q_proj"
K_ = f"{cb.ATTN}.k_proj"


# -- base checkpoints ---------------------------------------------------------------------------
def _nv_args(**kw):
    return cb.args(4, "tensor_group", group_size=16, scale_dtype="torch.float8_e4m3fn", **kw)


BASES = {
    "ct_nvfp4": lambda: dict(
        producer=lambda m, w: cb.nvfp4_ct(w, input_global=448 * 6 / 3.0),
        quantization_config=cb.ct_config({"group_0": cb.ct_group(
            _nv_args(), _nv_args(dynamic="local"), "nvfp4-pack-quantized")})),
    "ct_channel": lambda: dict(
        producer=lambda m, w: cb.fp8_channel(w),
        quantization_config=cb.ct_config({"group_0": cb.ct_group(
            cb.args(8, "channel"), cb.args(8, "token", dynamic=True), "float-quantized")})),
    "ct_mx": lambda: dict(
        producer=lambda m, w: cb.mx(w, fp4=True, data_name="weight_packed"),
        quantization_config=cb.ct_config({"group_0": cb.ct_group(
            cb.args(4, "group", group_size=32, scale_dtype="torch.uint8"), None,
            "mxfp4-pack-quantized")})),
    "ds_block": lambda: dict(
        producer=lambda m, w: cb.fp8_block(w),
        quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic",
                             "weight_block_size": [128, 128]}),
    "fbgemm": lambda: dict(
        producer=lambda m, w: cb.fp8_channel(w, scale_shape=(-1, 1)),
        quantization_config={"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                             "modules_to_not_convert": ["lm_head"]}),
    "hf_static": lambda: dict(
        producer=lambda m, w: cb.fp8_tensor(w, static_input=()),
        quantization_config={"quant_method": "fp8", "activation_scheme": "static"}),
    "mo_nvfp4": lambda: dict(
        producer=lambda m, w: cb.nvfp4_modelopt(w, input_scale=0.002),
        hf_quant_config=cb.modelopt_hq("NVFP4", group_size=16)),
}


class Ckpt:
    """A built checkpoint whose tensors and configs a corruption edits."""

    def __init__(self, path, tensors):
        self.path, self.tensors = path, dict(tensors)

    def set(self, name, arr):
        self.tensors[name] = arr

    def poke(self, name, index, byte):
        arr = np.array(self.tensors[name])
        arr.reshape(-1).view(np.uint8)[index] = byte
        self.tensors[name] = arr

    def drop(self, name):
        del self.tensors[name]

    def config(self, fn, file="config.json"):
        p = self.path / file
        data = json.loads(p.read_text())
        fn(data)
        p.write_text(json.dumps(data))

    def qc(self, fn):
        self.config(lambda c: fn(c["quantization_config"]))

    def save(self):
        for p in self.path.glob("model*.safetensors*"):
            p.unlink()
        cb.write_tensors(self.path, self.tensors)


def _f32(name, value):
    def mutate(c):
        arr = np.array(c.tensors[name], np.float32)
        arr.reshape(-1)[0] = value
        c.set(name, arr)
    return mutate


def _set(c, **changes):
    return lambda q: q.update(changes)


def _group_weights(**changes):
    return lambda c: c.qc(lambda q: q["config_groups"]["group_0"]["weights"].update(changes))


# id -> (base, corruption, substrings the message must contain)
CASES = {
    "missing_block_scale": ("ds_block", lambda c: c.drop(f"{Q}.weight_scale_inv"),
                            [f"'{Q}.weight_scale_inv'", "missing"]),
    "missing_weight_packed": ("ct_nvfp4", lambda c: c.drop(f"{Q}.weight_packed"),
                              [f"'{Q}.weight_packed'", "missing"]),
    "missing_weight_global_scale": ("ct_nvfp4", lambda c: c.drop(f"{Q}.weight_global_scale"),
                                    [f"'{Q}.weight_global_scale'"]),
    "missing_input_global_scale": ("ct_nvfp4", lambda c: c.drop(f"{Q}.input_global_scale"),
                                   [f"'{Q}.input_global_scale'"]),
    "missing_static_input_scale": ("hf_static", lambda c: c.drop(f"{Q}.input_scale"),
                                   [f"'{Q}.input_scale'"]),
    "missing_weight_scale_2": ("mo_nvfp4", lambda c: c.drop(f"{Q}.weight_scale_2"),
                               [f"'{Q}.weight_scale_2'"]),
    "unexpected_input_scale": ("ds_block", lambda c: c.set(f"{Q}.input_scale", np.float32([1.0])),
                               [f"'{Q}.input_scale'", "unexpected"]),
    "quant_tensor_on_ignored_module": (
        "ct_nvfp4", lambda c: c.set("lm_head.weight_scale", np.ones((64, 10), cb.E4M3)),
        ["'lm_head'", "ignore"]),
    "scale_wrong_dtype": ("ct_nvfp4", lambda c: c.set(
        f"{Q}.weight_scale", np.array(c.tensors[f"{Q}.weight_scale"], np.float32)),
        [f"'{Q}.weight_scale'", "F8_E4M3", "F32"]),
    "weight_wrong_dtype": ("ds_block", lambda c: c.set(
        f"{Q}.weight", np.array(c.tensors[f"{Q}.weight"], cb.BF16)),
        [f"'{Q}.weight'", "F8_E4M3", "BF16"]),
    "mx_scale_dtype_f32": ("ct_mx", lambda c: c.set(
        f"{Q}.weight_scale", np.array(c.tensors[f"{Q}.weight_scale"], np.float32)),
        [f"'{Q}.weight_scale'", "U8"]),
    "block_scale_wrong_shape": ("ds_block", lambda c: c.set(
        f"{Q}.weight_scale_inv", np.ones((2, 1), np.float32)),
        [f"'{Q}.weight_scale_inv'", "[2, 2]", "[2, 1]"]),
    "group_scale_wrong_shape": ("ct_mx", lambda c: c.set(
        f"{Q}.weight_scale", np.full((160, 4), 120, np.uint8)),
        [f"'{Q}.weight_scale'", "[160, 5]"]),
    "transposed_channel_scale": ("ct_channel", lambda c: c.set(
        f"{Q}.weight_scale", np.array(c.tensors[f"{Q}.weight_scale"]).reshape(1, -1)),
        [f"'{Q}.weight_scale'", "[160, 1]"]),
    "nan_scale": ("ds_block", _f32(f"{Q}.weight_scale_inv", np.nan),
                  [f"'{Q}.weight_scale_inv'", "NaN"]),
    "inf_scale": ("ds_block", _f32(f"{Q}.weight_scale_inv", np.inf),
                  [f"'{Q}.weight_scale_inv'", "infinite"]),
    "zero_scale": ("ds_block", _f32(f"{Q}.weight_scale_inv", 0.0),
                   [f"'{Q}.weight_scale_inv'", "zero"]),
    "negative_scale": ("ct_channel", _f32(f"{Q}.weight_scale", -0.5),
                       [f"'{Q}.weight_scale'", "negative"]),
    "nan_e4m3_scale": ("ct_nvfp4", lambda c: c.poke(f"{Q}.weight_scale", 7, 0x7F),
                       [f"'{Q}.weight_scale'", "NaN", "(0, 7)"]),
    "zero_e4m3_scale": ("mo_nvfp4", lambda c: c.poke(f"{Q}.weight_scale", 3, 0x00),
                        [f"'{Q}.weight_scale'", "zero"]),
    "negative_e4m3_scale": ("ct_nvfp4", lambda c: c.poke(f"{Q}.weight_scale", 0, 0xB8),
                            [f"'{Q}.weight_scale'", "negative"]),
    "nan_e8m0_scale": ("ct_mx", lambda c: c.poke(f"{Q}.weight_scale", 11, 0xFF),
                       [f"'{Q}.weight_scale'", "NaN"]),
    "nan_fp8_weight": ("ds_block", lambda c: c.poke(f"{Q}.weight", 5, 0xFF),
                       [f"'{Q}.weight'", "NaN"]),
    "zero_global_scale": ("ct_nvfp4", _f32(f"{Q}.weight_global_scale", 0.0),
                          [f"'{Q}.weight_global_scale'", "zero"]),
    "nan_weight_scale_2": ("mo_nvfp4", _f32(f"{Q}.weight_scale_2", np.nan),
                           [f"'{Q}.weight_scale_2'", "NaN"]),
    "negative_input_scale": ("hf_static", _f32(f"{Q}.input_scale", -1.0),
                             [f"'{Q}.input_scale'", "negative"]),
    "input_scale_wrong_shape": ("hf_static", lambda c: c.set(f"{Q}.input_scale", np.ones(3, np.float32)),
                                [f"'{Q}.input_scale'", "[3]"]),
    "nonzero_zero_point": ("ct_channel", lambda c: c.set(
        f"{Q}.weight_zero_point", np.ones((160, 1), cb.E4M3)), [f"'{Q}.weight_zero_point'", "zero point"]),
    "weight_shape_mismatch": ("ct_channel", lambda c: c.set(
        f"{Q}.weight_shape", np.array([160, 161], np.int64)), [f"'{Q}.weight_shape'", "161"]),
    "unknown_quant_method": ("ds_block", lambda c: c.qc(lambda q: q.update(quant_method="awq")),
                             ["quant_method", "'awq'"]),
    "fbgemm_without_bound": ("fbgemm", lambda c: c.qc(lambda q: q.pop("activation_scale_ub")),
                             ["'activation_scale_ub' must be set", "None"]),
    "fbgemm_bad_bound": ("fbgemm", lambda c: c.qc(lambda q: q.update(activation_scale_ub=-1)),
                         ["'activation_scale_ub' must be a finite positive number", "-1"]),
    "fbgemm_bad_skip_regex": ("fbgemm", lambda c: c.qc(
        lambda q: q.update(modules_to_not_convert=["lm_head("])), ["'modules_to_not_convert'",
                                                                    "lm_head("]),
    "fbgemm_row_scale_wrong_shape": ("fbgemm", lambda c: c.set(
        f"{Q}.weight_scale", np.ones((1, 1), np.float32)), [f"'{Q}.weight_scale'", "[1, 1]"]),
    "gpt_oss_mxfp4_says_why": ("ds_block", lambda c: c.qc(lambda q: q.update(quant_method="mxfp4")),
                               ["'mxfp4' is not supported: gpt-oss", "mixture-of-experts"]),
    "ct_int_scheme": ("ct_channel", _group_weights(type="int"),
                      ["int-quantized", "config group 'group_0'", "layer 'model.layers.0."]),
    "ct_asymmetric": ("ct_channel", _group_weights(symmetric=False), ["asymmetric", "layer '"]),
    "ct_unknown_format": ("ct_channel", lambda c: c.qc(lambda q: q.update(format="marlin-24")),
                          ["'format'", "marlin-24"]),
    "ct_no_group_targets": ("ct_channel", lambda c: c.qc(
        lambda q: q["config_groups"]["group_0"].update(targets=["re:.*mlp.*"])),
        [f"'{K_}'", "no config group"]),
    "ct_name_target_unquantized": ("ct_channel", lambda c: c.qc(
        lambda q: q["config_groups"]["group_0"].update(targets=["Linear", "lm_head"]) or
        q.update(ignore=[])), ["'lm_head'", "unquantized"]),
    "ct_not_compressed": ("ct_channel", lambda c: c.qc(
        lambda q: q.update(quantization_status="frozen")), ["quantization_status", "frozen"]),
    "fp8_block_static": ("ds_block", lambda c: c.qc(lambda q: q.update(activation_scheme="static")),
                         ["activation_scheme"]),
    "fp8_ue8m0_per_tensor": ("hf_static", lambda c: c.qc(lambda q: q.update(scale_fmt="ue8m0")),
                             ["scale_fmt", "only with weight_block_size"]),
    "fp8_scale_fmt_unknown": ("ds_block", lambda c: c.qc(lambda q: q.update(scale_fmt="ue4m3")),
                              ["scale_fmt", "'ue4m3'"]),
    "fp8_ignored_but_quantized": ("hf_static", lambda c: c.qc(
        lambda q: q.update(ignored_layers=["lm_head", Q])), [f"'{Q}'", "ignored_layers"]),
    "modelopt_unknown_algo": ("mo_nvfp4", lambda c: c.config(
        lambda h: h["quantization"].update(quant_algo="INT4_AWQ"), "hf_quant_config.json"),
        ["quant_algo", "INT4_AWQ"]),
    "modelopt_excluded_but_quantized": ("mo_nvfp4", lambda c: c.config(
        lambda h: h["quantization"].update(exclude_modules=["lm_head", "*.q_proj"]),
        "hf_quant_config.json"), [f"'{Q}'", "exclude_modules"]),
    "modelopt_bad_group_size": ("mo_nvfp4", lambda c: c.config(
        lambda h: h["quantization"].update(group_size=32), "hf_quant_config.json"), ["group_size", "32"]),
    "modelopt_mixed_missing_layer": ("mo_nvfp4", lambda c: c.config(
        lambda h: h["quantization"].update(quant_algo="MIXED_PRECISION", quantized_layers={
            m: {"quant_algo": "NVFP4", "group_size": 16} for m in cb.MODULES if m != Q}),
        "hf_quant_config.json"), [f"'{Q}'", "quantized_layers"]),
    "modelopt_configs_disagree": ("mo_nvfp4", lambda c: c.config(
        lambda cfg: cfg.update(quantization_config={"quant_method": "modelopt", "quant_algo": "FP8"})),
        ["disagrees", "NVFP4", "FP8"]),
    # finite scales whose dequantized values overflow float32: the tensor and the bound
    "overflow_weight_scale_2": ("mo_nvfp4", _f32(f"{Q}.weight_scale_2", 1e37),
                                [f"'{Q}.weight_scale_2'", "above 1.266e+35", "6 · 448 · scale"]),
    "overflow_weight_global_scale": ("ct_nvfp4", _f32(f"{Q}.weight_global_scale", 1e-37),
                                     [f"'{Q}.weight_global_scale'", "below 7.899e-36",
                                      "6 · 448 / scale"]),
    "overflow_block_scale": ("ds_block", _f32(f"{Q}.weight_scale_inv", 1e37),
                             [f"'{Q}.weight_scale_inv'", "above 7.596e+35", "448 · scale"]),
    "overflow_static_input_scale": ("hf_static", _f32(f"{Q}.input_scale", 1e36),
                                    [f"'{Q}.input_scale'", "above 7.596e+35"]),
    "overflow_nvfp4_input_global_scale": ("ct_nvfp4", _f32(f"{Q}.input_global_scale", 1e-37),
                                          [f"'{Q}.input_global_scale'", "below 7.899e-36"]),
    "overflow_e8m0_scale": ("ct_mx", lambda c: c.poke(f"{Q}.weight_scale", 4, 254),
                            [f"'{Q}.weight_scale'", "above 5.671e+37", "(0, 4)"]),
    # DeepSeek-style tensors under a config that lost weight_block_size: say so
    "block_scale_without_block_size": ("ds_block", lambda c: c.qc(
        lambda q: q.pop("weight_block_size")),
        ["stores 'weight_scale_inv'", "no 'weight_block_size'", "[128, 128] fits"]),
    # W4A16 drops an exported input_scale, but only a valid one
    "modelopt_w4a16_dropped_input_scale_nan": ("mo_nvfp4", lambda c: c.config(
        lambda h: h["quantization"].update(quant_algo="W4A16_NVFP4"), "hf_quant_config.json")
        or _f32(f"{Q}.input_scale", np.nan)(c), [f"'{Q}.input_scale'", "NaN", "dropped"]),
}


def _build(tmp_path, rng, base):
    kw = BASES[base]()
    _, _, tensors = cb.build(tmp_path, rng, kw.pop("producer"), **kw)
    return Ckpt(tmp_path, tensors)


@pytest.mark.parametrize("case", sorted(CASES))
def test_corruption_raises_checkpoint_error(tmp_path, rng, case):
    base, corrupt, needles = CASES[case]
    c = _build(tmp_path, rng, base)
    corrupt(c)
    c.save()
    with pytest.raises(jqlin.CheckpointError) as info:
        jqlin.load_checkpoint(tmp_path)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    report = inspect(tmp_path)
    assert not report.ok
    assert any(all(n in p for n in needles) for p in report.problems), report.problems


def test_every_base_is_valid(tmp_path, rng):
    for base in BASES:
        c = _build(tmp_path / base, rng, base)
        assert jqlin.load_checkpoint(c.path).layers and inspect(c.path).ok


def test_unexpected_tensor_allowed_when_not_strict(tmp_path, rng):
    c = _build(tmp_path, rng, "ds_block")
    c.set(f"{Q}.input_scale", np.float32([1.0]))
    c.save()
    with pytest.warns(UserWarning, match="unexpected tensor"):
        ck = jqlin.load_checkpoint(tmp_path, strict=False)
    assert f"{Q}.input_scale" in ck.tensors and Q in ck.layers


def test_inspect_lists_every_problem(tmp_path, rng):
    c = _build(tmp_path, rng, "ds_block")
    c.drop(f"{Q}.weight_scale_inv")
    c.poke(f"{K_}.weight", 0, 0x7F)
    c.set(f"{cb.MLP}.up_proj.input_scale", np.float32([1.0]))
    c.save()
    report = inspect(tmp_path)
    text = "\n".join(report.problems)
    assert len(report.problems) == 3, text
    for needle in (f"'{Q}.weight_scale_inv'", f"'{K_}.weight'", f"'{cb.MLP}.up_proj.input_scale'"):
        assert needle in text
    assert "PROBLEMS (3)" in report.render()


# -- file-level corruption ----------------------------------------------------------------------
def _header(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw, n, json.loads(raw[8:8 + n])


def test_truncated_file_names_the_tensor(tmp_path, rng):
    _build(tmp_path, rng, "ds_block")
    f = tmp_path / "model.safetensors"
    raw, n, header = _header(f)
    header.pop("__metadata__", None)
    last = max(header, key=lambda t: header[t]["data_offsets"][1])
    f.write_bytes(raw[:-10])
    with pytest.raises(jqlin.CheckpointError, match="truncated") as info:
        jqlin.load_checkpoint(tmp_path)
    assert f"'{last}'" in str(info.value) and "model.safetensors" in str(info.value)
    assert inspect(tmp_path).problems == [str(info.value)]


def test_garbage_header_names_the_file(tmp_path, rng):
    _build(tmp_path, rng, "ds_block")
    f = tmp_path / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[8:20] = b"\x00garbage!!\xff\xfe\x01"
    f.write_bytes(bytes(raw))
    with pytest.raises(jqlin.CheckpointError, match="model.safetensors.*header"):
        jqlin.load_checkpoint(tmp_path)


def test_header_dtype_inconsistent_with_offsets(tmp_path, rng):
    _build(tmp_path, rng, "ds_block")
    f = tmp_path / "model.safetensors"
    raw, n, header = _header(f)
    header[f"{Q}.weight_scale_inv"]["dtype"] = "F16"  # half the bytes its offsets span
    new = json.dumps(header, separators=(",", ":")).encode()
    assert len(new) <= n
    f.write_bytes(raw[:8] + new.ljust(n) + raw[8 + n:])
    with pytest.raises(jqlin.CheckpointError, match=f"'{Q}.weight_scale_inv'.*offsets"):
        jqlin.load_checkpoint(tmp_path)


def test_sharded_index_errors(tmp_path, rng):
    kw = BASES["ct_channel"]()
    cb.build(tmp_path, rng, kw.pop("producer"), shards=2, **kw)
    index = tmp_path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    assert jqlin.load_checkpoint(tmp_path).layers
    # a tensor mapped to the wrong shard
    name = next(n for n, f in data["weight_map"].items() if f.startswith("model-00001"))
    bad = dict(data, weight_map=dict(data["weight_map"], **{name: "model-00002-of-00002.safetensors"}))
    index.write_text(json.dumps(bad))
    with pytest.raises(jqlin.CheckpointError, match=f"'{name}'"):
        jqlin.load_checkpoint(tmp_path)
    # a shard that does not exist
    index.write_text(json.dumps(data))
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(jqlin.CheckpointError, match="model-00002-of-00002.safetensors.*does not exist"):
        jqlin.load_checkpoint(tmp_path)


def test_missing_files(tmp_path, rng):
    with pytest.raises(jqlin.CheckpointError, match="not a checkpoint directory"):
        jqlin.load_checkpoint(tmp_path / "nope")
    _build(tmp_path, rng, "ds_block")
    (tmp_path / "model.safetensors").rename(tmp_path / "weights.safetensors")
    with pytest.raises(jqlin.CheckpointError, match="model.safetensors"):
        jqlin.load_checkpoint(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(jqlin.CheckpointError, match="config.json"):
        jqlin.load_checkpoint(tmp_path)


MALFORMED = {
    "ct_groups_list": ("ct_channel", lambda c: c.qc(lambda q: q.update(config_groups=[1, 2])),
                       "config_groups"),
    "ct_weights_string": ("ct_channel", lambda c: c.qc(
        lambda q: q["config_groups"]["group_0"].update(weights="fp8")), "weights"),
    "ct_targets_int": ("ct_channel", lambda c: c.qc(
        lambda q: q["config_groups"]["group_0"].update(targets=3)), "targets"),
    "ct_no_strategy_group_size_zero": ("ct_channel", lambda c: c.qc(
        lambda q: q["config_groups"]["group_0"]["weights"].update(strategy=None, group_size=0)),
        r"group_0\.weights\.group_size.*-1 \(channel\)"),
    "ct_ignore_string": ("ct_channel", lambda c: c.qc(lambda q: q.update(ignore=7)), "ignore"),
    "fp8_block_size_string": ("ds_block", lambda c: c.qc(lambda q: q.update(weight_block_size="128")),
                              "weight_block_size"),
    "fp8_ignored_dict": ("hf_static", lambda c: c.qc(lambda q: q.update(ignored_layers={"a": 1})),
                         "ignored_layers"),
    "qc_not_object": ("ds_block", lambda c: c.config(lambda cfg: cfg.update(quantization_config=[1])),
                      "quantization_config"),
    "modelopt_quantization_list": ("mo_nvfp4", lambda c: c.config(
        lambda h: h.update(quantization=[]), "hf_quant_config.json"), "quantization"),
    "modelopt_producer_string": ("mo_nvfp4", lambda c: c.config(
        lambda h: h.update(producer="someone"), "hf_quant_config.json"), "producer"),
    "modelopt_algo_number": ("mo_nvfp4", lambda c: c.config(
        lambda h: h["quantization"].update(quant_algo=4), "hf_quant_config.json"), "quant_algo"),
    "modelopt_layers_list": ("mo_nvfp4", lambda c: c.config(
        lambda h: h["quantization"].update(quant_algo="MIXED_PRECISION", quantized_layers=[]),
        "hf_quant_config.json"), "quantized_layers"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_config_is_a_checkpoint_error(tmp_path, rng, case):
    base, corrupt, needle = MALFORMED[case]
    c = _build(tmp_path, rng, base)
    corrupt(c)
    with pytest.raises(jqlin.CheckpointError, match=needle):
        jqlin.load_checkpoint(tmp_path)
