"""Llama.from_checkpoint: a checkpoint (any format jqlin.checkpoint reads) -> a Llama.

Quantized projections become QuantDense holding the weights as stored; unquantized ones an
nnx.Linear in the model dtype. q/k/v and gate/up are fused with `jqlin.fuse` where their specs
agree. Loading is strict: every tensor the model needs must be there with its shape, and every
tensor in the checkpoint must be used.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ..checkpoint import Checkpoint, load_checkpoint
from ..errors import CheckpointError
from ..nn.dense import QuantDense
from ..nn.fused import FusedLinear
from . import llama as L

__all__ = ["from_checkpoint"]

_IGNORABLE_SUFFIXES = (".rotary_emb.inv_freq",)  # recomputed from the config


def _load(source: Any):
    if isinstance(source, Checkpoint):
        return source
    if isinstance(source, (str, os.PathLike)):
        return load_checkpoint(source)
    raise TypeError(f"from_checkpoint takes a checkpoint directory or a jqlin Checkpoint, "
                    f"got {type(source).__name__}")


def from_checkpoint(source: Any, *, dtype: Any = jnp.float32, weight_only: bool = False,
                    deterministic: bool = False, kernel: str = "auto", fuse: bool = True,
                    strict: bool = True) -> "L.Llama":
    """Build a Llama from a checkpoint directory or a loaded `jqlin.checkpoint.Checkpoint`.

    dtype: the model dtype (activations, unquantized weights); float32 reproduces a reference
    float32 forward. weight_only / deterministic / kernel are set on every QuantDense
    (weight_only=True runs specs that quantize activations with float activations; explicit).
    """
    ck = _load(source)
    cfg = L.LlamaConfig.from_hf(ck.config)
    tensors: dict[str, Any] = dict(ck.tensors)
    qlayers: dict[str, Any] = dict(ck.layers)
    used_t: set[str] = set()
    used_l: set[str] = set()
    rngs = nnx.Rngs(0)
    opts = dict(kernel=kernel, deterministic=deterministic, weight_only=weight_only)

    def tensor(name: str, shape: tuple[int, ...]) -> jax.Array:
        if name not in tensors:
            raise CheckpointError(f"checkpoint lacks tensor {name!r} (expected shape {shape})")
        arr = tensors[name]
        if tuple(arr.shape) != shape:
            raise CheckpointError(f"tensor {name!r} has shape {tuple(arr.shape)}; "
                                  f"expected {shape}")
        used_t.add(name)
        return jnp.asarray(arr).astype(dtype)

    def linear(name: str, k: int, n: int, bias: bool) -> nnx.Module:
        b = tensor(f"{name}.bias", (n,)) if bias else None
        if name in qlayers:
            qw = qlayers[name]
            if tuple(qw.shape) != (n, k):
                raise CheckpointError(f"quantized layer {name!r} has shape {qw.shape}; "
                                      f"expected ({n}, {k})")
            if f"{name}.weight" in tensors:
                raise CheckpointError(f"layer {name!r} is both quantized and unquantized")
            used_l.add(name)
            return QuantDense.from_quantized(qw, b, **opts)
        return L.float_linear(k, n, dtype=dtype, use_bias=bias, rngs=rngs,
                              weight=tensor(f"{name}.weight", (n, k)), bias=b)

    model = nnx.eval_shape(lambda: L.Llama(cfg, rngs=nnx.Rngs(0), dtype=dtype,
                                           deterministic=deterministic))
    d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nq, nkv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    model.embed_tokens.embedding.set_value(tensor("model.embed_tokens.weight", (cfg.vocab_size, d)))
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}"
        layer.input_layernorm.weight.set_value(tensor(f"{p}.input_layernorm.weight", (d,)))
        layer.post_attention_layernorm.weight.set_value(
            tensor(f"{p}.post_attention_layernorm.weight", (d,)))
        ab, mb = cfg.attention_bias, cfg.mlp_bias
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv = FusedLinear({"q_proj": linear(f"{p}.self_attn.q_proj", d, nq, ab),
                                "k_proj": linear(f"{p}.self_attn.k_proj", d, nkv, ab),
                                "v_proj": linear(f"{p}.self_attn.v_proj", d, nkv, ab)})
        attn.o_proj = linear(f"{p}.self_attn.o_proj", nq, d, False)
        mlp.gate_up = FusedLinear({"gate_proj": linear(f"{p}.mlp.gate_proj", d, f, mb),
                                   "up_proj": linear(f"{p}.mlp.up_proj", d, f, mb)})
        mlp.down_proj = linear(f"{p}.mlp.down_proj", f, d, mb)
        if fuse:
            attn.qkv.fuse()
            mlp.gate_up.fuse()
    model.norm.weight.set_value(tensor("model.norm.weight", (d,)))
    if cfg.tie_word_embeddings:
        if "lm_head.weight" in tensors:  # some writers store the tied copy
            used_t.add("lm_head.weight")
    else:
        model.lm_head = linear("lm_head", d, cfg.vocab_size, False)

    if strict:
        extra = sorted(n for n in set(tensors) - used_t if not n.endswith(_IGNORABLE_SUFFIXES))
        extra += sorted(set(qlayers) - used_l)
        if extra:
            raise CheckpointError(f"checkpoint has tensors/layers a Llama does not use: "
                                  f"{extra[:8]}{' ...' if len(extra) > 8 else ''}")
    missing = [".".join(map(str, path)) for path, v in nnx.to_flat_state(nnx.state(model))
               if isinstance(v.get_value(), jax.ShapeDtypeStruct)]
    if missing:
        raise CheckpointError(f"parameters not loaded from the checkpoint: {missing}")
    return model
