"""The reference Llama: config parsing, RoPE scaling, an independent float64 forward (GQA,
biases, llama3 RoPE, tied embeddings), KV-cache generation, batch invariance, strict loading,
quantize_model on a real checkpoint."""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jqlin
from jqlin.checkpoint import load_checkpoint
from jqlin.models import Llama, LlamaConfig, llama
from jqlin.models.rope import inv_frequencies
from jqlin.nn import linear_layers, quant_layers

HF_BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
               max_position_embeddings=64)
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=16)


def test_config_from_hf_rope_forms():
    v5 = LlamaConfig.from_hf({**HF_BASE, "rope_parameters": {"rope_theta": 5e5, **LLAMA3}})
    v4 = LlamaConfig.from_hf({**HF_BASE, "rope_theta": 5e5, "rope_scaling": dict(LLAMA3)})
    assert v5 == v4 and v5.rope_theta == 5e5 and dict(v5.rope_scaling)["factor"] == 8.0
    plain = LlamaConfig.from_hf({**HF_BASE, "rope_parameters": {"rope_theta": 1e4,
                                                                "rope_type": "default"}})
    assert plain.rope_scaling is None
    no_hd = {k: v for k, v in HF_BASE.items() if k != "head_dim"}
    assert LlamaConfig.from_hf(no_hd).head_dim == 8
    with pytest.raises(NotImplementedError, match="yarn"):
        LlamaConfig.from_hf({**HF_BASE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(NotImplementedError, match="gelu"):
        LlamaConfig.from_hf({**HF_BASE, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="vocab_size"):
        LlamaConfig.from_hf({k: v for k, v in HF_BASE.items() if k != "vocab_size"})
    with pytest.raises(ValueError, match="multiple"):
        LlamaConfig.from_hf({**HF_BASE, "num_key_value_heads": 3})


def test_rope_frequencies_default_linear_llama3():
    d, theta = 64, 5e5
    base = theta ** -(np.arange(0, d, 2) / d)
    np.testing.assert_allclose(inv_frequencies(d, theta), base, rtol=1e-6)
    np.testing.assert_allclose(inv_frequencies(d, theta, {"rope_type": "linear", "factor": 4.0}),
                               base / 4, rtol=1e-6)
    scaling = dict(LLAMA3, original_max_position_embeddings=8192)
    got = inv_frequencies(d, theta, scaling).astype(np.float64)
    wavelen = 2 * math.pi / base
    high, low = wavelen < 8192 / 4, wavelen > 8192 / 1
    assert high.any() and low.any() and (~high & ~low).any()
    np.testing.assert_allclose(got[high], base[high], rtol=1e-6)  # short wavelengths kept
    np.testing.assert_allclose(got[low], base[low] / 8, rtol=1e-6)  # long ones slowed by factor
    mid = ~high & ~low  # in between: strictly between the two, smoothly interpolated
    assert np.all(got[mid] < base[mid]) and np.all(got[mid] > base[mid] / 8)
    smooth = (8192 / wavelen[mid] - 1) / 3
    np.testing.assert_allclose(got[mid], (1 - smooth) * base[mid] / 8 + smooth * base[mid], rtol=1e-5)
    with pytest.raises(NotImplementedError, match="longrope"):
        inv_frequencies(d, theta, {"rope_type": "longrope"})


# -- an independent float64 forward -----------------------------------------------------------

def _np_forward(p, cfg, ids):
    hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    sc = dict(cfg.rope_scaling)
    inv = cfg.rope_theta ** -(np.arange(0, hd, 2) / hd)
    wl = 2 * np.pi / inv
    old = sc["original_max_position_embeddings"]
    lo_wl, hi_wl = old / sc["low_freq_factor"], old / sc["high_freq_factor"]
    s = (old / wl - sc["low_freq_factor"]) / (sc["high_freq_factor"] - sc["low_freq_factor"])
    inv = np.where(wl < hi_wl, inv, np.where(wl > lo_wl, inv / sc["factor"],
                                              (1 - s) * inv / sc["factor"] + s * inv))

    def norm(x, w):
        return w * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.rms_norm_eps)

    def rope(x):  # (B, T, H, d), HF rotate_half layout
        t = np.arange(x.shape[1])[:, None] * inv
        cos, sin = np.cos(np.concatenate([t, t], -1)), np.sin(np.concatenate([t, t], -1))
        rot = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos[None, :, None] + rot * sin[None, :, None]

    b, t = ids.shape
    x = p["embed"][ids]
    causal = np.tril(np.ones((t, t), bool))
    for lp in p["layers"]:
        h = norm(x, lp["ln1"])
        q = rope((h @ lp["q"][0].T + lp["q"][1]).reshape(b, t, nh, hd))
        k = rope((h @ lp["k"][0].T + lp["k"][1]).reshape(b, t, nkv, hd))
        v = (h @ lp["v"][0].T + lp["v"][1]).reshape(b, t, nkv, hd)
        k, v = np.repeat(k, nh // nkv, axis=2), np.repeat(v, nh // nkv, axis=2)  # repeat_kv
        sco = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd)
        sco = np.where(causal, sco, -np.inf)
        pr = np.exp(sco - sco.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        o = np.einsum("bhqk,bkhd->bqhd", pr, v).reshape(b, t, nh * hd)
        x = x + o @ lp["o"].T
        h = norm(x, lp["ln2"])
        g, u = h @ lp["gate"].T, h @ lp["up"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ lp["down"].T
    return norm(x, p["norm"]) @ p["embed"].T  # tied lm_head


def _random_tiny(rng):
    cfg = LlamaConfig.from_hf({**HF_BASE, "rope_theta": 500.0, "rope_scaling": dict(LLAMA3),
                               "tie_word_embeddings": True, "attention_bias": True})
    model = Llama(cfg, rngs=nnx.Rngs(int(rng.integers(1 << 30))))
    for _, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):  # non-trivial norms, biases
        v = var.get_value()
        var.set_value(v + jnp.asarray(rng.standard_normal(v.shape) * 0.3, v.dtype))
    f64 = lambda v: np.asarray(v.get_value(), np.float64)
    lin = lambda l: (f64(l.kernel).T, f64(l.bias) if l.bias is not None else 0.0)
    layers = []
    for layer in model.layers:
        parts = layer.self_attn.qkv.parts
        layers.append(dict(
            ln1=f64(layer.input_layernorm.weight), ln2=f64(layer.post_attention_layernorm.weight),
            q=lin(parts["q_proj"]), k=lin(parts["k_proj"]), v=lin(parts["v_proj"]),
            o=lin(layer.self_attn.o_proj)[0], gate=lin(layer.mlp.gate_up.parts["gate_proj"])[0],
            up=lin(layer.mlp.gate_up.parts["up_proj"])[0], down=lin(layer.mlp.down_proj)[0]))
    params = dict(embed=f64(model.embed_tokens.embedding), norm=f64(model.norm.weight), layers=layers)
    return model, cfg, params


@pytest.mark.slow
def test_forward_matches_independent_float64_model(rng):
    model, cfg, params = _random_tiny(rng)
    assert model.lm_head is None
    ids = rng.integers(0, cfg.vocab_size, (2, 20))  # beyond original_max_position_embeddings
    want = _np_forward(params, cfg, ids)
    for det in (False, True):
        got = np.asarray(model(ids, deterministic=det))
        assert got.dtype == np.float32
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def test_generate_uses_the_cache_consistently(rng):
    model, cfg, _ = _random_tiny(rng)
    a = rng.integers(0, cfg.vocab_size, 5).tolist()
    b = rng.integers(0, cfg.vocab_size, 9).tolist()
    out = model.generate([a, b], 6)
    assert out.tokens.shape == (2, 6) and out.logits.shape == (2, 6, cfg.vocab_size)
    for i, prompt in enumerate([a, b]):
        # teacher-forced full forward over prompt + generated tokens gives the same logits
        seq = np.array([prompt + np.asarray(out.tokens[i, :-1]).tolist()])
        full = np.asarray(model(seq))[0, len(prompt) - 1:]
        np.testing.assert_allclose(np.asarray(out.logits[i]), full, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(out.tokens[i]), full.argmax(-1))
    # a right-padded array with lengths= is the same request
    ids = np.zeros((2, 9), np.int32)
    ids[0, :5], ids[1] = a, b
    again = model.generate(ids, 6, lengths=[5, 9])
    np.testing.assert_array_equal(np.asarray(again.tokens), np.asarray(out.tokens))
    with pytest.raises(ValueError, match="cache_size"):
        model.generate([a], 6, cache_size=8)
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        model.generate([[1, 64]], 2)
    with pytest.raises(ValueError, match="lengths"):
        model.generate(ids, 2, lengths=[0, 9])


@pytest.mark.slow
def test_batch_invariance_end_to_end(fixtures_dir, rng):
    """deterministic=True: prompt A alone, again, and batched with a longer prompt B (before or
    after it) give identical tokens and bitwise identical logits for A over 48 greedy tokens."""
    model = llama.from_checkpoint(fixtures_dir / "ct_fp8_dynamic", deterministic=True)
    assert all(l.deterministic for l in quant_layers(model).values())
    a = rng.integers(3, 512, 7).tolist()
    b = rng.integers(3, 512, 23).tolist()
    runs = [model.generate([a], 48), model.generate([a], 48)]
    ab, ba = model.generate([a, b], 48), model.generate([b, a], 48)
    bits = lambda x: np.asarray(x, np.float32).view(np.uint32)
    for tokens, logits in [(r.tokens[0], r.logits[0]) for r in runs[1:]] + [
            (ab.tokens[0], ab.logits[0]), (ba.tokens[1], ba.logits[1])]:
        np.testing.assert_array_equal(np.asarray(tokens), np.asarray(runs[0].tokens[0]))
        np.testing.assert_array_equal(bits(logits), bits(runs[0].logits[0]))


def test_strict_loading_names_the_tensor(fixtures_dir):
    ck = load_checkpoint(fixtures_dir / "ct_fp8_block")
    missing = dataclasses.replace(ck, tensors={k: v for k, v in ck.tensors.items()
                                               if k != "model.layers.1.post_attention_layernorm.weight"})
    with pytest.raises(jqlin.CheckpointError, match="layers.1.post_attention_layernorm.weight"):
        llama.from_checkpoint(missing)
    extra = dataclasses.replace(ck, tensors={**ck.tensors, "model.layers.0.mlp.extra.weight": jnp.ones(3)})
    with pytest.raises(jqlin.CheckpointError, match="mlp.extra.weight"):
        llama.from_checkpoint(extra)
    bad = dict(ck.tensors)
    bad["model.norm.weight"] = jnp.ones(319)
    with pytest.raises(jqlin.CheckpointError, match=r"model.norm.weight.*\(319,\)"):
        llama.from_checkpoint(dataclasses.replace(ck, tensors=bad))
    layers = {k: v for k, v in ck.layers.items() if k != "model.layers.0.self_attn.k_proj"}
    with pytest.raises(jqlin.CheckpointError, match="self_attn.k_proj.weight"):
        llama.from_checkpoint(dataclasses.replace(ck, layers=layers))
    with pytest.raises(TypeError, match="checkpoint directory"):
        llama.from_checkpoint(42)


@pytest.mark.slow
def test_quantize_model_on_a_loaded_llama(fixtures_dir):
    ids = np.load(fixtures_dir / "bf16" / "reference" / "input_ids.npy")
    base = np.asarray(llama.from_checkpoint(fixtures_dir / "bf16")(ids))
    model = llama.from_checkpoint(fixtures_dir / "bf16")
    assert len(linear_layers(model)) == 15 and not quant_layers(model)
    jqlin.quantize_model(model, [("lm_head", None), ("*", "fp8_ptpc")])
    layers = quant_layers(model)
    assert set(layers) == {f"layers.{i}.{p}" for i in range(2) for p in (
        "self_attn.qkv.fused", "self_attn.o_proj", "mlp.gate_up.fused", "mlp.down_proj")}
    assert set(linear_layers(model)) == {"lm_head"}
    err = np.linalg.norm(np.asarray(model(ids)) - base) / np.linalg.norm(base)
    assert 1e-3 < err < 0.2  # quantized (not a no-op), and still the same model
    # the same model in bfloat16: float32 logits, close to the float32 model
    bf = llama.from_checkpoint(fixtures_dir / "bf16", dtype=jnp.bfloat16)
    got = np.asarray(bf(ids))
    assert got.dtype == np.float32
    assert np.linalg.norm(got - base) / np.linalg.norm(base) < 3e-2


def test_partly_quantized_projection_stays_unfused(fixtures_dir):
    """A layer left unquantized (mixed precision) runs as a float Linear beside quantized
    siblings; q/k/v cannot fuse there but still compute the same function."""
    ck = load_checkpoint(fixtures_dir / "ct_fp8_block")
    name = "model.layers.0.self_attn.k_proj"
    layers = dict(ck.layers)
    deq = layers.pop(name).dequantize()
    mixed = llama.from_checkpoint(dataclasses.replace(
        ck, layers=layers, tensors={**ck.tensors, f"{name}.weight": deq}), weight_only=True)
    qkv = mixed.layers[0].self_attn.qkv
    assert qkv.fused is None and isinstance(qkv.parts["k_proj"], nnx.Linear)
    assert isinstance(qkv.parts["q_proj"], jqlin.QuantDense)
    assert mixed.layers[1].self_attn.qkv.fused is not None
    ids = np.load(fixtures_dir / "ct_fp8_block" / "reference" / "input_ids.npy")
    want = np.asarray(llama.from_checkpoint(ck, weight_only=True)(ids))
    got = np.asarray(mixed(ids))
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


@pytest.mark.slow
def test_deterministic_rows_do_not_see_the_cache_size(rng):
    model, cfg, _ = _random_tiny(rng)
    a = rng.integers(0, cfg.vocab_size, 3).tolist()
    b = rng.integers(0, cfg.vocab_size, 30).tolist()
    base = model.generate([a], 5, deterministic=True)
    bits = lambda x: np.asarray(x, np.float32).view(np.uint32)
    for out in (model.generate([a], 5, cache_size=300, deterministic=True).logits[0],
                model.generate([b, a], 5, deterministic=True).logits[1]):
        np.testing.assert_array_equal(bits(out), bits(base.logits[0]))
