"""quantize_model: path rules, per-rule formats, fusion afterwards, static-scale calibration."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jqlin
from jqlin.nn import FusedLinear, configure, explain_model, linear_layers, quant_layers


class Block(nnx.Module):
    def __init__(self, d: int, rngs: nnx.Rngs):
        self.attn = FusedLinear({"q_proj": nnx.Linear(d, d, rngs=rngs),
                                 "k_proj": nnx.Linear(d, 16, rngs=rngs)})
        self.out = nnx.Linear(d + 16, d, rngs=rngs)

    def __call__(self, x):
        q, k = self.attn(x)
        return x + self.out(jnp.concatenate([q, k], axis=-1))


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, d: int = 64):
        self.blocks = nnx.List([Block(d, rngs) for _ in range(2)])
        self.lm_head = nnx.Linear(d, 24, rngs=rngs)

    def __call__(self, x):
        for b in self.blocks:
            x = b(x)
        return self.lm_head(x)


def _net(rng):
    net = Net(nnx.Rngs(int(rng.integers(1 << 30))))
    for lin in linear_layers(net).values():  # non-zero biases, uneven rows
        lin.bias.set_value(jnp.asarray(rng.standard_normal(lin.out_features), jnp.float32))
        k = lin.kernel.get_value()
        lin.kernel.set_value(k * jnp.exp(jnp.asarray(rng.standard_normal((1, k.shape[1])), jnp.float32)))
    return net


def _float_weights(net):
    return {p: (np.asarray(l.kernel.get_value()).T, np.asarray(l.bias.get_value()))
            for p, l in linear_layers(net).items()}


def _forward64(weights, x):
    """float64 forward of Net from {path: (W (out,in), b)}."""
    def lin(p, v):
        w, b = weights[p]
        return v @ np.asarray(w, np.float64).T + b
    x = np.asarray(x, np.float64)
    for i in range(2):
        q, k = lin(f"blocks.{i}.attn.parts.q_proj", x), lin(f"blocks.{i}.attn.parts.k_proj", x)
        x = x + lin(f"blocks.{i}.out", np.concatenate([q, k], axis=-1))
    return lin("lm_head", x)


def test_rules_select_layers_and_formats(rng):
    net = _net(rng)
    floats = _float_weights(net)
    assert set(floats) == {"lm_head", *(f"blocks.{i}.{n}" for i in range(2) for n in
                                        ("attn.parts.q_proj", "attn.parts.k_proj", "out"))}
    rules = [("lm_head", None), (r"re:^blocks\.0\.", "fp8_block_a16"), ("*", "nvfp4_a16")]
    jqlin.quantize_model(net, rules)
    layers = quant_layers(net)
    assert set(layers) == {"blocks.0.attn.fused", "blocks.0.out", "blocks.1.attn.fused", "blocks.1.out"}
    assert isinstance(net.lm_head, nnx.Linear)
    for path, layer in layers.items():
        fmt = "fp8_block_a16" if path.startswith("blocks.0") else "nvfp4_a16"
        assert layer.spec == jqlin.formats.get(fmt)
    # each quantized layer holds exactly jqlin.quantize of the float weight (fused: per part)
    for i, fmt in enumerate(["fp8_block_a16", "nvfp4_a16"]):
        parts = [jqlin.quantize(floats[f"blocks.{i}.attn.parts.{n}"][0], fmt) for n in ("q_proj", "k_proj")]
        expect = jqlin.fuse(parts)
        got = net.blocks[i].attn.fused.qweight
        assert got.shape == expect.shape and got.segments == expect.segments
        np.testing.assert_array_equal(np.asarray(got.data).view(np.uint8), np.asarray(expect.data).view(np.uint8))
        np.testing.assert_array_equal(np.asarray(got.scale).view(np.uint8), np.asarray(expect.scale).view(np.uint8))
    # the quantized model computes the float64 forward of the dequantized weights
    deq = {p: (np.asarray(jqlin.quantize(w, "fp8_block_a16" if p.startswith("blocks.0") else "nvfp4_a16")
                          .dequantize()) if p != "lm_head" else w, b) for p, (w, b) in floats.items()}
    x = jnp.asarray(rng.standard_normal((3, 64)), jnp.float32)
    ref = _forward64(deq, x)
    np.testing.assert_allclose(np.asarray(net(x)), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_one_format_for_everything_and_options(rng):
    net = jqlin.quantize_model(_net(rng), "fp8_ptpc", deterministic=True, fuse=False)
    layers = quant_layers(net)
    assert len(layers) == 7 and not linear_layers(net)
    assert all(l.deterministic and l.spec == jqlin.formats.get("fp8_ptpc") for l in layers.values())
    assert net.blocks[0].attn.fused is None  # fuse=False leaves the parts
    configure(net, weight_only=True, kernel="xla")
    assert all(l.weight_only and l.kernel == "xla" for l in layers.values())
    exps = explain_model(net, m=4)
    assert set(exps) == set(layers) and all(e.chosen == "xla" for e in exps.values())
    with pytest.raises(TypeError, match="unknown options"):
        configure(net, precision="high")


def test_bad_rules_leave_the_model_untouched(rng):
    net = _net(rng)
    with pytest.raises(jqlin.UnknownFormatError):
        jqlin.quantize_model(net, [("lm_head", None), ("*", "fp8_blocky")])
    with pytest.raises(TypeError, match="rules"):
        jqlin.quantize_model(net, [("*",)])
    with pytest.raises(ValueError, match="static activation scale"):
        jqlin.quantize_model(net, [("lm_head", None), ("*", "fp8_per_tensor")])
    with pytest.raises(ValueError, match="no rule quantizes"):
        jqlin.quantize_model(net, "fp8_per_tensor", input_scales={"nope": 1.0})
    path = sorted(linear_layers(net))[0]
    with pytest.raises(ValueError, match=f"needs no static activation scale: \\['{path}'\\]"):
        jqlin.quantize_model(net, "fp8_ptpc", input_scales={path: 0.05})  # (was dropped)
    with pytest.raises(ValueError, match="rules\\[0\\]: 're:\\[' is not a regular expression"):
        jqlin.quantize_model(net, [("re:[", "fp8_ptpc")])
    # a layer failing to quantize (a NaN weight, the last one in path order): named, and the
    # layers before it are not swapped
    last = sorted(linear_layers(net))[-1]
    w = linear_layers(net)[last].kernel
    w.set_value(w.get_value().at[0, 0].set(jnp.nan))
    with pytest.raises(ValueError, match=f"layer {last}: weight holds 1 NaN"):
        jqlin.quantize_model(net, "fp8_ptpc")
    assert len(linear_layers(net)) == 7 and not quant_layers(net)


def test_static_scales_by_calibration_and_by_name(rng):
    net = _net(rng)
    floats = _float_weights(net)
    x_cal = jnp.asarray(rng.standard_normal((5, 64)) * 3, jnp.float32)
    # float64 inputs of each layer on the calibration batch
    x0 = np.asarray(x_cal, np.float64)
    def lin(p, v):
        w, b = floats[p]
        return v @ w.T.astype(np.float64) + b
    q, k = lin("blocks.0.attn.parts.q_proj", x0), lin("blocks.0.attn.parts.k_proj", x0)
    out_in = np.concatenate([q, k], axis=-1)
    jqlin.quantize_model(net, [("lm_head", None), ("blocks.0.*", "fp8_per_tensor"), ("*", None)],
                         calibrate=lambda m: m(x_cal))
    assert isinstance(net.blocks[1].out, nnx.Linear)
    s_attn = float(net.blocks[0].attn.fused.input_scale.get_value())
    s_out = float(net.blocks[0].out.input_scale.get_value())
    np.testing.assert_allclose(s_attn, np.abs(x0).max() / 448, rtol=1e-6)
    np.testing.assert_allclose(s_out, np.abs(out_in).max() / 448, rtol=1e-5)
    # given by name instead (the convention of the spec: fp8 multiplier)
    net2 = jqlin.quantize_model(_net(rng), [("blocks.1.out", "fp8_per_tensor")],
                                input_scales={"blocks.1.out": 0.25})
    assert float(net2.blocks[1].out.input_scale.get_value()) == 0.25
    assert len(quant_layers(net2)) == 1


def test_calibration_inputs_holding_nan_are_an_error_naming_the_layer(rng):
    """A NaN in a layer's calibration inputs is an error that names the layer (a max reduction
    may pass over NaN -- XLA:CPU's does at some shapes -- and the scale would come out of the
    finite values); the model is left untouched."""
    net = _net(rng)
    x_cal = np.asarray(rng.standard_normal((13, 64)), np.float32)
    x_cal[3, 5] = np.nan
    with pytest.raises(ValueError, match=r"calibration of blocks\.0\.attn.*NaN or inf"):
        jqlin.quantize_model(net, [("blocks.0.*", "fp8_per_tensor")],
                             calibrate=lambda m: m(jnp.asarray(x_cal)))
    assert not quant_layers(net)
