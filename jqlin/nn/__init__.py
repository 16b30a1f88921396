"""Flax modules: QuantDense (NNX) and its Linen counterpart, FusedLinear, quantize_model,
tensor-parallel sharding of quantized layers."""

from .dense import QuantDense, QuantizedParam
from .fused import FusedLinear
from .quantize_model import configure, explain_model, linear_layers, quant_layers, quantize_model
from .sharding import TensorParallel, shard_layer, sharded_matmul, weight_partition_specs

__all__ = ["QuantDense", "QuantizedParam", "FusedLinear", "quantize_model", "quant_layers",
           "linear_layers", "configure", "explain_model", "TensorParallel", "shard_layer",
           "sharded_matmul", "weight_partition_specs", "linen"]


def __getattr__(name: str):
    if name == "linen":  # flax.linen is imported only by those who use it
        import importlib
        return importlib.import_module(".linen", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
