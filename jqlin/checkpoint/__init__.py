"""Checkpoint reading and conversion: HF fp8 / fbgemm_fp8, compressed-tensors and ModelOpt
safetensors -> jqlin.

load_checkpoint(path) -> Checkpoint reads a checkpoint strictly (jqlin.CheckpointError names the
file, tensor or config key at fault); convert(src, dst) writes a jqlin checkpoint that reloads
without source-format logic; inspect(path) describes one and lists every problem it finds.
One module per source ecosystem maps configs and tensor names to QuantSpecs: hf_fp8,
fbgemm_fp8, compressed_tensors, modelopt (and native for jqlin's own format).
"""

from .convert import convert
from .fusion import fuse_layers, fuse_projections
from .loader import Checkpoint, load_checkpoint
from .report import Report, inspect

__all__ = ["Checkpoint", "load_checkpoint", "convert", "inspect", "Report", "fuse_layers",
           "fuse_projections"]
