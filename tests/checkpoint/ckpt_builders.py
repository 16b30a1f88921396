"""Hand-built checkpoints in the layouts of FORMATS.md, written with safetensors.numpy.

Written from the format descriptions, independently of jqlin's loader: codes, scales and the
nibble packing are produced here in NumPy (ml_dtypes casts), and every builder returns the
dequantized weight the producer itself would compute, in the producer's float32 order of ops.
The model is a tiny Llama-like block whose widths are not multiples of 128 (partial blocks).
"""

from __future__ import annotations

import json
import pathlib
from typing import Callable

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

F32 = np.float32
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E2M1 = ml_dtypes.float4_e2m1fn

H, I, V = 160, 96, 64  # hidden, intermediate, vocab
ATTN = "model.layers.0.self_attn"
MLP = "model.layers.0.mlp"


def modules(layers: int = 1) -> dict[str, tuple[int, int]]:
    """The Linears of `layers` decoder layers: {module: (N, K)}."""
    out = {}
    for i in range(layers):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        out.update({f"{a}.q_proj": (H, H), f"{a}.k_proj": (32, H), f"{a}.v_proj": (32, H),
                    f"{a}.o_proj": (H, H), f"{m}.gate_proj": (I, H), f"{m}.up_proj": (I, H),
                    f"{m}.down_proj": (H, I)})
    return out


MODULES: dict[str, tuple[int, int]] = modules(1)
PLAIN = {"model.embed_tokens.weight": (V, H), "model.layers.0.input_layernorm.weight": (H,),
         "model.norm.weight": (H,), "lm_head.weight": (V, H)}
BASE_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
               "intermediate_size": I, "vocab_size": V, "num_hidden_layers": 1}


# -- weights and element casts --------------------------------------------------------------
def rand_weight(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Random weight with strongly varying row and column magnitudes (mis-tiled scales show)."""
    w = rng.standard_normal((n, k)) * np.exp(rng.uniform(-2, 2, (n, 1))) * np.exp(
        rng.uniform(-1, 1, (1, k)))
    return (0.02 * w).astype(BF16).astype(F32)


def e4m3(x) -> np.ndarray:
    return np.clip(np.asarray(x, F32), -448, 448).astype(E4M3)


def e2m1(x) -> np.ndarray:
    return np.clip(np.asarray(x, F32), -6, 6).astype(E2M1)


def pack_fp4(q: np.ndarray) -> np.ndarray:
    """(N, K) e2m1 codes -> (N, K/2) uint8, element 2j in the low nibble (FORMATS.md sec. 1)."""
    codes = q.view(np.uint8) & 0x0F
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def expand(s: np.ndarray, n: int, k: int, tr: int, tc: int) -> np.ndarray:
    """Broadcast a scale grid of (tr, tc) tiles over (n, k); partial edge tiles are cropped."""
    return np.repeat(np.repeat(np.asarray(s), tr, 0), tc, 1)[:n, :k]


def tile_amax(w: np.ndarray, tr: int, tc: int) -> np.ndarray:
    n, k = w.shape
    rows, cols = -(-n // tr) * tr, -(-k // tc) * tc
    p = np.zeros((rows, cols), F32)
    p[:n, :k] = np.abs(w)  # zero padding only for the amax, as DeepSeek / CT do
    return p.reshape(rows // tr, tr, cols // tc, tc).max(axis=(1, 3))


# -- producers: each returns ({suffix: array}, expected float32 dequantized weight) -----------
def fp8_tensor(w, *, scale_shape=(), static_input=None, scale_name="weight_scale"):
    s = F32(np.abs(w).max() / F32(448))
    q = e4m3(w / s)
    t = {"weight": q, scale_name: np.full(scale_shape, s, F32)}
    if static_input is not None:
        t["input_scale"] = np.full(static_input, F32(0.75) / F32(448), F32)
    return t, q.astype(F32) * s


def fp8_channel(w, *, scale_shape=None, scale_dtype=F32):
    s = (np.abs(w).max(axis=1, keepdims=True) / F32(448)).astype(scale_dtype).astype(F32)
    q = e4m3(w / s)
    stored = s.astype(scale_dtype)
    if scale_shape is not None:
        stored = stored.reshape(scale_shape)
    return {"weight": q, "weight_scale": stored}, q.astype(F32) * s


def fp8_block(w, block=(128, 128), *, scale_dtype=F32, scale_name="weight_scale_inv", four_d=False):
    n, k = w.shape
    s = (tile_amax(w, *block) / F32(448)).astype(scale_dtype).astype(F32)
    full = expand(s, n, k, *block)
    q = e4m3(w / full)
    stored = s.astype(scale_dtype)
    if four_d:
        stored = stored.reshape(s.shape[0], 1, s.shape[1], 1)
    return {"weight": q, scale_name: stored}, q.astype(F32) * full


def fp8_group(w, g):
    n, k = w.shape
    s = tile_amax(w, 1, g) / F32(448)
    full = expand(s, n, k, 1, g)
    q = e4m3(w / full)
    return {"weight": q, "weight_scale": s}, q.astype(F32) * full


def nvfp4_ct(w, *, input_global=None):
    """compressed-tensors: weight_global_scale is a divisor (448*6/amax)."""
    n, k = w.shape
    g = F32(448 * 6) / F32(np.abs(w).max())
    sb = e4m3(g * tile_amax(w, 1, 16) / F32(6))
    t = expand(sb.astype(F32), n, k, 1, 16) / g
    q = e2m1(w / t)
    out = {"weight_packed": pack_fp4(q), "weight_scale": sb,
           "weight_global_scale": np.array([g], F32)}
    if input_global is not None:
        out["input_global_scale"] = np.array([input_global], F32)
    return out, q.astype(F32) * t


def nvfp4_modelopt(w, *, input_scale=None):
    """ModelOpt: weight_scale_2 is a multiplier (amax/2688), stored 0-d."""
    n, k = w.shape
    ws2 = F32(np.abs(w).max()) / F32(6 * 448)
    sb = e4m3(np.maximum(tile_amax(w, 1, 16) / (F32(6) * ws2), F32(2.0 ** -9)))
    t = expand(sb.astype(F32), n, k, 1, 16) * ws2
    q = e2m1(w / t)
    out = {"weight": pack_fp4(q), "weight_scale": sb, "weight_scale_2": np.array(ws2, F32)}
    if input_scale is not None:
        out["input_scale"] = np.array(input_scale, F32)
    return out, q.astype(F32) * t


def mx(w, *, fp4: bool, data_name: str):
    """MX: e8m0 exponent bytes per 32 along K; u = 127 + floor(log2 amax) - emax."""
    n, k = w.shape
    amax = tile_amax(w, 1, 32)
    emax = 2 if fp4 else 8
    u = np.clip(127 + np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax, 0, 254).astype(np.uint8)
    s = np.ldexp(F32(1), u.astype(np.int32) - 127).astype(F32)
    full = expand(s, n, k, 1, 32)
    if fp4:
        q = e2m1(w / full)
        data = pack_fp4(q)
    else:
        q = e4m3(w / full)
        data = q
    return {data_name: data, "weight_scale": u}, q.astype(F32) * full


# -- writing ----------------------------------------------------------------------------------
Producer = Callable[[str, np.ndarray], tuple[dict, np.ndarray] | None]


def build(path: pathlib.Path, rng: np.random.Generator, producer: Producer, *,
          quantization_config: dict | None = None, hf_quant_config: dict | None = None,
          config_extra: dict | None = None, shards: int = 1, layers: int = 1):
    """Write a checkpoint of `layers` decoder layers; `producer(module, w)` returns (tensors by
    suffix, dequant) or None to keep the module in bf16. Returns (expected dequant by module,
    plain tensors by name, raw tensors by name)."""
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    expected: dict[str, np.ndarray] = {}
    plain: dict[str, np.ndarray] = {}
    for name, shape in PLAIN.items():
        arr = (rng.standard_normal(shape) * 0.1 + (1 if len(shape) == 1 else 0)).astype(BF16)
        tensors[name] = plain[name] = arr
    for module, (n, k) in modules(layers).items():
        w = rand_weight(rng, n, k)
        out = producer(module, w)
        if out is None:
            tensors[f"{module}.weight"] = plain[f"{module}.weight"] = w.astype(BF16)
            continue
        parts, deq = out
        for suffix, arr in parts.items():
            tensors[f"{module}.{suffix}"] = arr
        expected[module] = deq.astype(F32)
    config = {**BASE_CONFIG, "num_hidden_layers": layers, **(config_extra or {})}
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (path / "config.json").write_text(json.dumps(config, indent=1))
    if hf_quant_config is not None:
        (path / "hf_quant_config.json").write_text(json.dumps(hf_quant_config, indent=1))
    write_tensors(path, tensors, shards=shards)
    return expected, plain, tensors


def write_tensors(path: pathlib.Path, tensors: dict[str, np.ndarray], *, shards: int = 1) -> None:
    names = sorted(tensors)
    if shards == 1:
        save_file({n: tensors[n] for n in names}, str(path / "model.safetensors"),
                  metadata={"format": "pt"})
        return
    weight_map = {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: tensors[n] for n in part}, str(path / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))


def ct_group(weights: dict | None, inputs: dict | None, fmt: str, targets=("Linear",)) -> dict:
    return {"targets": list(targets), "weights": weights, "input_activations": inputs,
            "output_activations": None, "format": fmt}


def ct_config(groups: dict, *, ignore=("lm_head",), fmt: str | None = None) -> dict:
    fmts = {g["format"] for g in groups.values()}
    return {"quant_method": "compressed-tensors", "config_groups": groups,
            "format": fmt or (fmts.pop() if len(fmts) == 1 else "mixed-precision"),
            "ignore": list(ignore), "quantization_status": "compressed", "kv_cache_scheme": None,
            "sparsity_config": {}, "transform_config": {}, "version": "0.20.1"}


def args(num_bits, strategy, *, dynamic=False, group_size=None, block=None, scale_dtype=None,
         type_="float", symmetric=True) -> dict:
    d = {"num_bits": num_bits, "type": type_, "strategy": strategy, "dynamic": dynamic,
         "group_size": group_size, "symmetric": symmetric}
    if strategy is None:  # compressed-tensors infers it from group_size
        del d["strategy"]
    if block is not None:
        d["block_structure"] = list(block)
    if scale_dtype is not None:
        d["scale_dtype"] = scale_dtype
    return d


def modelopt_hq(algo: str, *, exclude=("lm_head", "model.embed_tokens"), **extra) -> dict:
    q = {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": list(exclude), **extra}
    return {"producer": {"name": "modelopt", "version": "0.47.0"}, "quantization": q}


# -- comparing checkpoints bit for bit ------------------------------------------------------
def _bits(a):
    a = np.asarray(a)
    return a.reshape(-1).view(np.uint8), a.shape, a.dtype


def assert_same_weight(a, b, name=""):
    assert a.spec == b.spec and a.shape == b.shape and a.segments == b.segments, name
    assert a.layout == b.layout
    for field in ("data", "scale", "global_scale", "input_scale"):
        x, y = getattr(a, field), getattr(b, field)
        assert (x is None) == (y is None), (name, field)
        if x is not None:
            bx, sx, dx = _bits(x)
            by, sy, dy = _bits(y)
            assert sx == sy and dx == dy, (name, field, sx, sy, dx, dy)
            np.testing.assert_array_equal(bx, by, err_msg=f"{name}.{field}")


def assert_same_checkpoint(a, b):
    assert sorted(a.layers) == sorted(b.layers)
    for m in a.layers:
        assert_same_weight(a.layers[m], b.layers[m], m)
    assert sorted(a.tensors) == sorted(b.tensors)
    for n in a.tensors:
        np.testing.assert_array_equal(_bits(a.tensors[n])[0], _bits(b.tensors[n])[0], err_msg=n)
        assert a.tensors[n].dtype == b.tensors[n].dtype
