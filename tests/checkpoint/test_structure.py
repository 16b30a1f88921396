"""What the tensors alone cannot say: a quantized config over unquantized weights, a layer left
unquantized among quantized siblings, shard files the index leaves out, overflowing scales at the
bound, and config settings jqlin reads but does not apply (KV-cache quantization)."""

import json
import warnings

import numpy as np
import pytest

import jqlin
from jqlin.checkpoint import convert, inspect
import ckpt_builders as cb

O_PROJ0 = "model.layers.0.self_attn.o_proj"
O_PROJ1 = "model.layers.1.self_attn.o_proj"
INDEX = "model.safetensors.index.json"


def _load_problem(path, *needles):
    """The load's CheckpointError (holding every needle) and inspect's report of `path`."""
    with pytest.raises(jqlin.CheckpointError) as info:
        jqlin.load_checkpoint(path)
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, msg
    return msg, inspect(path)


def _ct_block(ignore=("lm_head",), targets=("Linear",)):
    g = cb.ct_group(cb.args(8, "block", block=(128, 128)),
                    cb.args(8, "group", dynamic=True, group_size=128), "float-quantized",
                    targets=targets)
    return dict(quantization_config=cb.ct_config({"group_0": g}, ignore=ignore))


def _fp8_block(**extra):
    return dict(quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128], **extra})


def _mo_nvfp4(**extra):
    return dict(hf_quant_config=cb.modelopt_hq("NVFP4", group_size=16, **extra))


# ecosystem -> (build kwargs, producer of a quantized module)
ECOSYSTEMS = {
    "compressed-tensors": (_ct_block, lambda w: cb.fp8_block(w, scale_name="weight_scale")),
    "fp8": (_fp8_block, cb.fp8_block),
    "modelopt": (_mo_nvfp4, lambda w: cb.nvfp4_modelopt(w, input_scale=0.002)),
}


# -- a quantized config whose checkpoint stores no quantized layer ------------------------------
DECLARED = {
    "compressed-tensors": (_ct_block(), "compressed-tensors/none", "config.json"),
    "fp8": (_fp8_block(), "fp8/block", "config.json"),
    "modelopt_hf_quant_config": (_mo_nvfp4(), "modelopt/NVFP4", "hf_quant_config.json"),
    "modelopt_config_json": (dict(quantization_config={"quant_method": "modelopt",
                                                       "quant_algo": "FP8"}),
                             "modelopt/FP8", "config.json"),
}


@pytest.mark.parametrize("case", sorted(DECLARED))
def test_quantized_config_over_unquantized_weights_is_an_error(tmp_path, rng, case):
    kw, fmt, file = DECLARED[case]
    src = tmp_path / "src"
    cb.build(src, rng, lambda m, w: None, **kw)
    msg, report = _load_problem(src, file, f"({fmt})", "no layer is stored quantized")
    assert report.format == fmt and report.problems == [msg]
    with pytest.raises(jqlin.CheckpointError, match="no layer is stored quantized"):
        convert(src, tmp_path / "dst", progress=False)
    assert not (tmp_path / "dst").exists()


def test_unquantized_checkpoint_without_config_still_loads(tmp_path, rng):
    cb.build(tmp_path, rng, lambda m, w: None)
    ck = jqlin.load_checkpoint(tmp_path)
    assert ck.format == "unquantized" and not ck.layers and inspect(tmp_path).ok


# -- a module unquantized while the same module of another layer is quantized --------------------
def _one_unquantized(ecosystem, tmp_path, rng, **kw_changes):
    make_kw, quantize = ECOSYSTEMS[ecosystem]
    kw = make_kw(**kw_changes)
    cb.build(tmp_path, rng, lambda m, w: None if m == O_PROJ0 else quantize(w), layers=2, **kw)
    return tmp_path


@pytest.mark.parametrize("ecosystem", sorted(ECOSYSTEMS))
def test_unquantized_layer_among_quantized_siblings_is_a_problem(tmp_path, rng, ecosystem):
    path = _one_unquantized(ecosystem, tmp_path, rng)
    msg, report = _load_problem(path, f"module '{O_PROJ0}'", "unquantized (BF16)", f"'{O_PROJ1}'")
    assert report.problems == [msg] and len(report.rows) == 13
    with pytest.raises(jqlin.CheckpointError, match=f"'{O_PROJ0}'"):
        convert(path, tmp_path / "dst", progress=False)


# the config says the layer is left unquantized: loads, with the layer as a plain tensor
LISTED = {
    "ct_ignore_name": ("compressed-tensors", dict(ignore=["lm_head", O_PROJ0])),
    "ct_ignore_regex": ("compressed-tensors",
                        dict(ignore=["lm_head", r"re:.*layers\.0\.self_attn\.o_proj$"])),
    "ct_not_targeted": ("compressed-tensors",  # regex targets that skip layer 0's o_proj
                        dict(targets=[r"re:.*layers\.1\..*",
                                      r"re:.*layers\.0\.(?!self_attn\.o_proj).*"])),
    "fp8_ignored_layers": ("fp8", dict(ignored_layers=["lm_head", O_PROJ0])),
    "fp8_ignored_parent": ("fp8", dict(modules_to_not_convert=["model.layers.0.self_attn"])),
    "modelopt_exclude": ("modelopt", dict(exclude=["lm_head", "model.embed_tokens",
                                                   "model.layers.0.*.o_proj"])),
    # old exports, matched by vLLM as a substring: not flagged (it is no quantized module)
    "modelopt_exclude_substring": ("modelopt", dict(exclude=["lm_head", "model.embed_tokens",
                                                             "layers.0.self_attn.o_proj"])),
}


@pytest.mark.parametrize("case", sorted(LISTED))
def test_unquantized_layer_listed_in_the_config_loads(tmp_path, rng, case):
    ecosystem, changes = LISTED[case]
    if case == "fp8_ignored_parent":  # every module of layer 0's attention in bf16
        kw = _fp8_block(**changes)
        cb.build(tmp_path, rng, lambda m, w: None if m.startswith("model.layers.0.self_attn")
                 else cb.fp8_block(w), layers=2, **kw)
    else:
        _one_unquantized(ecosystem, tmp_path, rng, **changes)
    ck = jqlin.load_checkpoint(tmp_path)
    assert O_PROJ0 not in ck.layers and O_PROJ1 in ck.layers
    assert f"{O_PROJ0}.weight" in ck.tensors and inspect(tmp_path).ok


def test_modelopt_mixed_precision_leaves_unlisted_layers_unquantized(tmp_path, rng):
    layers = {m: {"quant_algo": "FP8"} for m in cb.modules(2) if m != O_PROJ0}
    hq = cb.modelopt_hq("MIXED_PRECISION", quantized_layers=layers)
    del hq["quantization"]["exclude_modules"]
    cb.build(tmp_path, rng, lambda m, w: cb.fp8_tensor(w, static_input=()) if m in layers else None,
             hf_quant_config=hq, layers=2)
    ck = jqlin.load_checkpoint(tmp_path)
    assert sorted(ck.layers) == sorted(layers) and inspect(tmp_path).ok


def test_every_fixture_passes_the_structure_checks(fixtures_dir):
    for d in sorted(p for p in fixtures_dir.iterdir() if (p / "config.json").is_file()):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fixture sets a KV-cache scheme
            ck = jqlin.load_checkpoint(d)
        report = inspect(d)
        assert report.ok and not report.notes, (d.name, report.problems)
        assert len(ck.layers) == (0 if d.name == "bf16" else 14), d.name


# -- shards the index leaves out ----------------------------------------------------------------
def _sharded(tmp_path, rng):
    kw = _ct_block()
    cb.build(tmp_path, rng, lambda m, w: cb.fp8_block(w, scale_name="weight_scale"), shards=2, **kw)
    index = tmp_path / INDEX
    return index, json.loads(index.read_text())


def test_index_omitting_a_present_shard_is_a_problem(tmp_path, rng):
    dst, tmp_path = tmp_path / "dst", tmp_path / "src"
    index, data = _sharded(tmp_path, rng)
    second = "model-00002-of-00002.safetensors"
    data["weight_map"] = {n: f for n, f in data["weight_map"].items() if f != second}
    index.write_text(json.dumps(data))
    msg, report = _load_problem(tmp_path, INDEX, f"'{second}'", "maps no tensor to it")
    assert report.problems[0] == msg  # a file problem is listed first, beside the layer table
    assert report.rows
    with pytest.raises(jqlin.CheckpointError, match=second):
        convert(tmp_path, dst, progress=False)
    assert not dst.exists()


def test_files_of_another_shard_set_are_not_the_index_business(tmp_path, rng):
    _sharded(tmp_path, rng)
    # e.g. Mistral repos ship consolidated weights beside the HF shards; never read
    (tmp_path / "consolidated.safetensors").write_bytes(b"")
    (tmp_path / "model-00001-of-00003.safetensors").write_bytes(b"")
    assert jqlin.load_checkpoint(tmp_path).layers and inspect(tmp_path).ok


def test_total_size_is_not_compared(tmp_path, rng):
    """Writers compute metadata.total_size differently (torch storage sizes, shared storage
    counted once) or hand-write it; a mismatch alone is not evidence of a missing tensor."""
    index, data = _sharded(tmp_path, rng)
    data["metadata"] = {"total_size": 12345}
    index.write_text(json.dumps(data))
    assert jqlin.load_checkpoint(tmp_path).layers


def test_empty_weight_map_is_an_error(tmp_path, rng):
    index, data = _sharded(tmp_path, rng)
    index.write_text(json.dumps(dict(data, weight_map={})))
    with pytest.raises(jqlin.CheckpointError, match="'weight_map' is empty"):
        jqlin.load_checkpoint(tmp_path)
    assert "'weight_map' is empty" in inspect(tmp_path).problems[0]


# -- overflow bounds are not stricter than float32 -----------------------------------------------
def test_a_large_global_scale_below_the_bound_dequantizes_finitely(tmp_path, rng):
    name = f"{cb.ATTN}.q_proj.weight_scale_2"
    _, _, tensors = cb.build(tmp_path, rng, lambda m, w: cb.nvfp4_modelopt(w, input_scale=0.002),
                             **_mo_nvfp4())
    tensors[name] = np.array(1.2e35, np.float32)  # bound: f32 max / (6 * 448) = 1.266e35
    tensors[f"{cb.ATTN}.q_proj.weight_scale"] = np.full_like(
        tensors[f"{cb.ATTN}.q_proj.weight_scale"], 448.0)
    cb.write_tensors(tmp_path, tensors)
    w = np.asarray(jqlin.load_checkpoint(tmp_path).layers[f"{cb.ATTN}.q_proj"].dequantize())
    assert np.isfinite(w).all() and np.abs(w).max() > 3e38


# -- KV-cache quantization is read but not applied -----------------------------------------------
KV = {
    "compressed-tensors": (dict(kv_cache_scheme={"num_bits": 8, "type": "float",
                                                 "strategy": "tensor", "dynamic": False,
                                                 "symmetric": True}), "kv_cache_scheme"),
    "modelopt": (dict(kv_cache_quant_algo="FP8"), "kv_cache_quant_algo is 'FP8'"),
    "fp8": (dict(kv_cache_scheme="static"), "kv_cache_scheme is 'static'"),  # AutoFP8
}


@pytest.mark.parametrize("ecosystem", sorted(KV))
def test_kv_cache_quantization_warns_that_it_is_not_applied(tmp_path, rng, ecosystem):
    dst, tmp_path = tmp_path / "dst", tmp_path / "src"
    extra, needle = KV[ecosystem]
    make_kw, quantize = ECOSYSTEMS[ecosystem]
    kw = make_kw()
    if ecosystem == "modelopt":
        kw["hf_quant_config"]["quantization"].update(extra)
    else:
        kw["quantization_config"].update(extra)
    cb.build(tmp_path, rng, lambda m, w: quantize(w), **kw)
    with pytest.warns(UserWarning, match="KV-cache quantization is not applied") as rec:
        ck = jqlin.load_checkpoint(tmp_path)
    assert ck.layers and needle in str(rec[0].message)
    assert rec[0].filename == __file__  # points at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = inspect(tmp_path)  # a note in the report, not a warning
    assert report.ok and any(needle in n for n in report.notes)
    assert "note: " in report.render()
    with pytest.warns(UserWarning, match="KV-cache quantization is not applied"):
        convert(tmp_path, dst, progress=False)


@pytest.mark.parametrize("ecosystem", sorted(ECOSYSTEMS))
def test_kv_cache_scales_without_a_config_key_warn_too(tmp_path, rng, ecosystem):
    """KV-cache scale tensors (AutoFP8's k_proj / v_proj `output_scale`, FORMATS.md 3a) with no
    KV-cache setting in the config: still a KV-cache scheme jqlin does not apply, so still
    said, whichever planner reads the checkpoint."""
    make_kw, quantize = ECOSYSTEMS[ecosystem]

    def prod(m, w):
        t, deq = quantize(w)
        if m.endswith(("k_proj", "v_proj")):
            t["output_scale"] = np.array(0.05, np.float32)
        return t, deq
    cb.build(tmp_path, rng, prod, **make_kw())
    with pytest.warns(UserWarning, match="KV-cache quantization is not applied") as rec:
        ck = jqlin.load_checkpoint(tmp_path)
    assert len(rec) == 1 and "k_proj.output_scale' and 1 more" in str(rec[0].message)
    assert sorted(n for n in ck.tensors if n.endswith("output_scale")) == [
        f"{cb.ATTN}.k_proj.output_scale", f"{cb.ATTN}.v_proj.output_scale"]
