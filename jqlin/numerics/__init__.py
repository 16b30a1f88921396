"""Element-level numerics (fp8, e2m1, e8m0) and the per-QuantKey quantize/dequantize rules."""

from .fp8 import E4M3_MAX, cast_e4m3
from .fp4 import E2M1_MAX, cast_e2m1, pack_e2m1, unpack_e2m1
from .e8m0 import e8m0_to_f32, exponent_ct, exponent_deepseek, exponent_modelopt
from .weights import quantize_weight, dequantize_weight
from .activations import quantize_activation, fake_quantize_activation

__all__ = ["E4M3_MAX", "E2M1_MAX", "cast_e4m3", "cast_e2m1", "pack_e2m1", "unpack_e2m1",
           "e8m0_to_f32", "exponent_ct", "exponent_deepseek", "exponent_modelopt",
           "quantize_weight",
           "dequantize_weight", "quantize_activation", "fake_quantize_activation"]
