"""A compact Llama-family decoder on jqlin layers (the reference model).

RMSNorm, RoPE (theta and default / linear / llama3 scaling from the config), grouped-query
attention, SwiGLU MLP; every projection is an `nnx.Linear` (float, a plain matmul in the model
dtype) or a `jqlin.QuantDense`, with q/k/v and gate/up held in `FusedLinear`s. Logits are float32.

`deterministic=True` makes every row's result independent of the batch it is in: the quantized
matmuls run their batch-invariant kernels, float matmuls and norms are computed row by row, and
attention walks the KV cache in fixed 128-slot chunks with an online softmax, so slots past a
sequence's end (padding, a longer neighbour's tokens, a larger cache) add exact zeros. Prompts of
different lengths are right-padded: slot j of the cache holds position j of each sequence.
Two XLA habits would still leak the batch into a row's bits and are defused: a loop of one
iteration is inlined and fused differently (row maps always run >= 2 iterations, `seq_map`), and
a mul+add pair is contracted to an FMA or not depending on the surrounding fusion (RoPE rounds
both products before the sum).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ..nn.dense import QuantDense
from ..nn.fused import FusedLinear
from ..rowwise import rowwise, seq_map
from .rope import SUPPORTED_ROPE_TYPES, apply_rope, rope_cos_sin

__all__ = ["LlamaConfig", "Llama", "GenerateOutput", "from_checkpoint", "rowwise"]

HIGHEST = jax.lax.Precision.HIGHEST
F32 = jnp.float32
ATTN_CHUNK = 128  # cache slots per step of the deterministic attention loop


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # sorted items; None = default
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple "
                             f"of num_key_value_heads={self.num_key_value_heads}")

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "LlamaConfig":
        """From a Hugging Face `config.json` dict (transformers 4.x or 5.x rope keys)."""
        def need(key: str) -> Any:
            if key not in hf:
                raise ValueError(f"config.json lacks {key!r}, needed for a Llama model")
            return hf[key]
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise NotImplementedError(f"hidden_act {act!r} is not supported (Llama uses silu)")
        if hf.get("sliding_window") is not None and hf.get("use_sliding_window", True):
            raise NotImplementedError("sliding-window attention is not supported")
        if "rope_parameters" in hf and hf["rope_parameters"]:
            rope = dict(hf["rope_parameters"])
            theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
        else:
            rope = dict(hf.get("rope_scaling") or {})
            theta = hf.get("rope_theta", 10000.0)
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in SUPPORTED_ROPE_TYPES:
            raise NotImplementedError(f"rope_type {kind!r} is not supported "
                                      f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
        scaling = None if kind == "default" else tuple(sorted(rope.items()))
        heads = need("num_attention_heads")
        return cls(
            vocab_size=need("vocab_size"), hidden_size=need("hidden_size"),
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=need("num_hidden_layers"), num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or need("hidden_size") // heads,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
            rope_scaling=scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", False)),
            mlp_bias=bool(hf.get("mlp_bias", False)))


# -- row-local helpers (seq_map / rowwise live in jqlin.rowwise) ---------------------------------

def _dense_rowwise(layer: nnx.Linear, x: jax.Array) -> jax.Array:
    w = layer.kernel.get_value()
    dtype = jnp.result_type(x.dtype, w.dtype) if layer.dtype is None else layer.dtype
    xs, ws = x.astype(dtype), w.astype(dtype)
    y = rowwise(lambda r: jnp.dot(r, ws, precision=HIGHEST, preferred_element_type=F32), xs)
    y = y.astype(dtype)
    if layer.bias is not None:
        y = y + layer.bias.get_value().astype(dtype)
    return y


def apply_linear(layer: nnx.Module, x: jax.Array, deterministic: bool) -> jax.Array:
    if isinstance(layer, QuantDense):
        return layer(x, deterministic=deterministic)
    if isinstance(layer, nnx.Linear) and deterministic:
        return _dense_rowwise(layer, x)
    return layer(x)


def float_linear(in_features: int, out_features: int, *, dtype: Any, use_bias: bool = False,
                 rngs: nnx.Rngs, weight: jax.Array | None = None,
                 bias: jax.Array | None = None) -> nnx.Linear:
    """An nnx.Linear in `dtype` at HIGHEST precision; `weight` (out, in) as stored on disk."""
    kw: dict[str, Any] = {}
    if weight is not None:
        weight = jnp.asarray(weight)
        if weight.shape != (out_features, in_features):
            raise ValueError(f"weight has shape {weight.shape}; expected "
                             f"({out_features}, {in_features})")
        kw["kernel_init"] = lambda key, shape, dt: weight.T.astype(dt)
    if bias is not None:
        bias = jnp.asarray(bias)
        kw["bias_init"] = lambda key, shape, dt: bias.reshape(shape).astype(dt)
    return nnx.Linear(in_features, out_features, use_bias=use_bias, dtype=dtype, param_dtype=dtype,
                      precision=HIGHEST, rngs=rngs, **kw)


# -- modules ------------------------------------------------------------------------------------

class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype: Any):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x: jax.Array, deterministic: bool = False) -> jax.Array:
        xf = x.astype(F32)
        if deterministic:
            var = rowwise(lambda r: jnp.mean(r * r, keepdims=True), xf)
        else:
            var = jnp.mean(xf * xf, axis=-1, keepdims=True)
        normed = (xf * jax.lax.rsqrt(var + self.eps)).astype(x.dtype)
        return self.weight.get_value() * normed


class Attention(nnx.Module):
    def __init__(self, cfg: LlamaConfig, dtype: Any, rngs: nnx.Rngs):
        d, hd = cfg.hidden_size, cfg.head_dim
        nq, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
        lin = functools.partial(float_linear, dtype=dtype, use_bias=cfg.attention_bias, rngs=rngs)
        self.qkv = FusedLinear({"q_proj": lin(d, nq * hd), "k_proj": lin(d, nkv * hd),
                                "v_proj": lin(d, nkv * hd)})
        self.o_proj = float_linear(nq * hd, d, dtype=dtype, rngs=rngs)
        self.num_heads, self.num_kv_heads, self.head_dim = nq, nkv, hd

    def __call__(self, x, cos, sin, positions, kv, deterministic):
        b, t, _ = x.shape
        q, k, v = self.qkv(x, lambda layer, y: apply_linear(layer, y, deterministic))
        rope = functools.partial(apply_rope, cos=cos, sin=sin, separate_products=deterministic)
        q = rope(q.reshape(b, t, self.num_heads, self.head_dim))
        k = rope(k.reshape(b, t, self.num_kv_heads, self.head_dim))
        v = v.reshape(b, t, self.num_kv_heads, self.head_dim)
        if kv is not None:  # write this step's keys/values at their positions, attend the cache
            rows = jnp.arange(b)[:, None]
            k = kv[0].at[rows, positions].set(k.astype(kv[0].dtype))
            v = kv[1].at[rows, positions].set(v.astype(kv[1].dtype))
        attend = _attend_rowwise if deterministic else _attend
        out = attend(q, k, v, positions).reshape(b, t, self.num_heads * self.head_dim)
        return apply_linear(self.o_proj, out, deterministic), (k, v)


def _attend(q, k, v, q_pos):
    """q (B,T,H,d); k, v (B,S,KVH,d); slot j holds position j; query at p sees slots <= p."""
    b, t, h, d = q.shape
    kvh = k.shape[2]
    qg = q.reshape(b, t, kvh, h // kvh, d)
    s = jnp.einsum("btkgd,bskd->bkgts", qg, k, precision=HIGHEST, preferred_element_type=F32)
    s = s * (d ** -0.5)
    mask = jnp.arange(k.shape[1])[None, None, :] <= q_pos[:, :, None]  # (B, T, S)
    s = jnp.where(mask[:, None, None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    o = jnp.einsum("bkgts,bskd->btkgd", p, v, precision=HIGHEST, preferred_element_type=F32)
    return o.astype(q.dtype).reshape(b, t, h, d)


def _attend_rowwise(q, k, v, q_pos):
    """Batch-invariant attention: one query row at a time, over the cache in fixed chunks of
    ATTN_CHUNK slots with an online softmax. A chunk whose slots are all masked leaves the
    running max, sum and output exactly unchanged, so neither the cache size nor other rows
    can change a row's bits."""
    b, t, h, d = q.shape
    s_len, kvh = k.shape[1], k.shape[2]
    g = h // kvh
    pad = max(-s_len % ATTN_CHUNK, 2 * ATTN_CHUNK - s_len)  # >= 2 chunks: see seq_map
    if pad > 0:
        k = jnp.pad(k, ((0, 0), (0, pad), (0, 0), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, pad), (0, 0), (0, 0)))
    n_chunks = (s_len + pad) // ATTN_CHUNK
    scale = d ** -0.5

    def one_row(args):
        qr, pos, kb, vb = args  # (H, d), (), (S, KVH, d) x2
        qr = qr.reshape(kvh, g, d)

        def chunk(c, carry):
            m, l, acc = carry
            start = c * ATTN_CHUNK
            kc = jax.lax.dynamic_slice_in_dim(kb, start, ATTN_CHUNK, 0)
            vc = jax.lax.dynamic_slice_in_dim(vb, start, ATTN_CHUNK, 0)
            s = jnp.einsum("kgd,skd->kgs", qr, kc, precision=HIGHEST,
                           preferred_element_type=F32) * scale
            valid = (start + jnp.arange(ATTN_CHUNK)) <= pos
            s = jnp.where(valid, s, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            corr = jnp.exp(m - m_new)
            p = jnp.where(valid, jnp.exp(s - m_new[..., None]), 0.0)
            vc = jnp.where(valid[:, None, None], vc, 0).astype(F32)
            pv = jnp.einsum("kgs,skd->kgd", p, vc, precision=HIGHEST, preferred_element_type=F32)
            return m_new, l * corr + jnp.sum(p, axis=-1), acc * corr[..., None] + pv

        init = (jnp.full((kvh, g), -jnp.inf, F32), jnp.zeros((kvh, g), F32),
                jnp.zeros((kvh, g, d), F32))
        _, l, acc = jax.lax.fori_loop(0, n_chunks, chunk, init)
        return (acc * (1.0 / l)[..., None]).reshape(h, d)

    def one_sequence(args):
        qb, posb, kb, vb = args
        return seq_map(lambda a: one_row((a[0], a[1], kb, vb)), (qb, posb))

    return seq_map(one_sequence, (q, q_pos, k, v)).astype(q.dtype)


class MLP(nnx.Module):
    def __init__(self, cfg: LlamaConfig, dtype: Any, rngs: nnx.Rngs):
        d, f = cfg.hidden_size, cfg.intermediate_size
        lin = functools.partial(float_linear, dtype=dtype, use_bias=cfg.mlp_bias, rngs=rngs)
        self.gate_up = FusedLinear({"gate_proj": lin(d, f), "up_proj": lin(d, f)})
        self.down_proj = lin(f, d)

    def __call__(self, x, deterministic):
        gate, up = self.gate_up(x, lambda layer, y: apply_linear(layer, y, deterministic))
        return apply_linear(self.down_proj, jax.nn.silu(gate) * up, deterministic)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: LlamaConfig, dtype: Any, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = Attention(cfg, dtype, rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = MLP(cfg, dtype, rngs)

    def __call__(self, x, cos, sin, positions, kv, deterministic):
        a, kv = self.self_attn(self.input_layernorm(x, deterministic), cos, sin, positions, kv,
                               deterministic)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x, deterministic), deterministic), kv


class GenerateOutput(NamedTuple):
    tokens: jax.Array  # (B, max_new_tokens) int32, greedy
    logits: jax.Array  # (B, max_new_tokens, vocab) float32: the logits each token was chosen from


class Llama(nnx.Module):
    """Llama decoder. `model(input_ids)` -> float32 logits (B, T, vocab);
    `model.generate(input_ids, max_new_tokens)` -> greedy tokens with a KV cache."""

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs, dtype: Any = jnp.float32,
                 deterministic: bool = False):
        self.config = config
        self.dtype = dtype
        self.deterministic = deterministic
        self.embed_tokens = nnx.Embed(config.vocab_size, config.hidden_size, dtype=dtype,
                                      param_dtype=dtype, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(config, dtype, rngs)
                                for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.lm_head = nnx.data(None) if config.tie_word_embeddings else float_linear(
            config.hidden_size, config.vocab_size, dtype=dtype, rngs=rngs)

    # -- forward -------------------------------------------------------------------------------
    def _det(self, deterministic: bool | None) -> bool:
        return self.deterministic if deterministic is None else deterministic

    def hidden(self, input_ids: jax.Array, positions: jax.Array, cache: list | None,
               deterministic: bool) -> tuple[jax.Array, list | None]:
        """Final-norm hidden states (B, T, D) and the updated cache (None without a cache)."""
        cfg = self.config
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        x = self.embed_tokens(input_ids)
        new_cache = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, positions, None if cache is None else cache[i],
                          deterministic)
            new_cache.append(kv)
        return self.norm(x, deterministic), (new_cache if cache is not None else None)

    def logits(self, h: jax.Array, deterministic: bool) -> jax.Array:
        """float32 logits of final hidden states."""
        if self.lm_head is not None:
            y = apply_linear(self.lm_head, h, deterministic)
        else:
            e = self.embed_tokens.embedding.get_value().astype(h.dtype)
            dot = lambda r: jnp.dot(r, e.T, precision=HIGHEST, preferred_element_type=F32)
            y = rowwise(dot, h) if deterministic else dot(h)
        return y.astype(F32)

    def __call__(self, input_ids: jax.Array, *, deterministic: bool | None = None) -> jax.Array:
        """Logits (B, T, vocab) float32 of a batch of equal-length (or right-padded) prompts."""
        ids = _check_ids(input_ids, self.config.vocab_size)
        positions = jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), ids.shape)
        h, _ = self.hidden(ids, positions, None, self._det(deterministic))
        return self.logits(h, self._det(deterministic))

    # -- generation ----------------------------------------------------------------------------
    def init_cache(self, batch: int, size: int) -> list[tuple[jax.Array, jax.Array]]:
        cfg = self.config
        shape = (batch, size, cfg.num_key_value_heads, cfg.head_dim)
        return [(jnp.zeros(shape, self.dtype), jnp.zeros(shape, self.dtype))
                for _ in range(cfg.num_hidden_layers)]

    def generate(self, input_ids: Any, max_new_tokens: int, *,
                 lengths: Sequence[int] | jax.Array | None = None, cache_size: int | None = None,
                 deterministic: bool | None = None, pad_id: int = 0) -> GenerateOutput:
        """Greedy decoding of exactly `max_new_tokens` tokens per prompt (no stop token).

        input_ids: (B, T) ids, or a list of prompts of different lengths (right-padded with
        pad_id here); `lengths` gives each row's prompt length for a right-padded array.
        cache_size: KV-cache slots (default: longest prompt + max_new_tokens, rounded up to 128).
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        ids, lens = _pad_prompts(input_ids, lengths, pad_id)
        ids = _check_ids(ids, self.config.vocab_size)
        b, t = ids.shape
        need = int(np.max(np.asarray(lens))) + max_new_tokens
        size = cache_size if cache_size is not None else -(-max(need, t) // 128) * 128
        if size < max(need, t):
            raise ValueError(f"cache_size={size} is too small: prompts of up to {t} tokens plus "
                             f"{max_new_tokens} new tokens need {max(need, t)} slots")
        det = self._det(deterministic)
        cache = self.init_cache(b, size)
        logits, cache = _prefill(self, ids, lens, cache, det)
        tokens, all_logits = [], []
        pos = lens
        for step in range(max_new_tokens):
            tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            tokens.append(tok)
            all_logits.append(logits)
            if step + 1 < max_new_tokens:
                logits, cache = _decode(self, tok, pos, cache, det)
                pos = pos + 1
        return GenerateOutput(jnp.stack(tokens, axis=1), jnp.stack(all_logits, axis=1))


@nnx.jit(static_argnames=("deterministic",))
def _prefill(model: Llama, ids, lens, cache, deterministic: bool):
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1], dtype=jnp.int32), ids.shape)
    h, cache = model.hidden(ids, positions, cache, deterministic)
    last = h[jnp.arange(ids.shape[0]), lens - 1]  # each prompt's own last position
    return model.logits(last, deterministic), cache


@nnx.jit(static_argnames=("deterministic",))
def _decode(model: Llama, tok, pos, cache, deterministic: bool):
    h, cache = model.hidden(tok[:, None], pos[:, None], cache, deterministic)
    return model.logits(h[:, 0], deterministic), cache


def _check_ids(ids: Any, vocab: int) -> jax.Array:
    arr = jnp.asarray(ids)
    if arr.ndim != 2 or not jnp.issubdtype(arr.dtype, jnp.integer):
        raise ValueError(f"input_ids must be an integer (batch, seq) array, got {arr.dtype} "
                         f"{arr.shape}")
    if arr.shape[1] == 0:
        raise ValueError("input_ids has no tokens")
    if not isinstance(arr, jax.core.Tracer):
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"input_ids must lie in [0, {vocab}), got values in [{lo}, {hi}]")
    return arr.astype(jnp.int32)


def _pad_prompts(input_ids: Any, lengths: Any, pad_id: int) -> tuple[jax.Array, jax.Array]:
    if isinstance(input_ids, (list, tuple)) and input_ids and not np.isscalar(input_ids[0]):
        seqs = [np.asarray(s, np.int64).reshape(-1) for s in input_ids]
        if lengths is not None:
            raise ValueError("lengths= is for a right-padded array; a list of prompts has its own")
        if any(len(s) == 0 for s in seqs):
            raise ValueError("every prompt needs at least one token")
        t = max(len(s) for s in seqs)
        ids = np.full((len(seqs), t), pad_id, np.int64)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = s
        return jnp.asarray(ids, jnp.int32), jnp.asarray([len(s) for s in seqs], jnp.int32)
    ids = jnp.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if lengths is None:
        return ids, jnp.full((ids.shape[0],), ids.shape[1], jnp.int32)
    lens = jnp.asarray(lengths, jnp.int32).reshape(-1)
    if lens.shape[0] != ids.shape[0] or int(lens.min()) < 1 or int(lens.max()) > ids.shape[1]:
        raise ValueError(f"lengths must be one value in [1, {ids.shape[1]}] per row of "
                         f"input_ids {ids.shape}, got {np.asarray(lens).tolist()}")
    return ids, lens


# -- loading ------------------------------------------------------------------------------------

from .loading import from_checkpoint  # noqa: E402  (uses the classes above)
Llama.from_checkpoint = staticmethod(from_checkpoint)
