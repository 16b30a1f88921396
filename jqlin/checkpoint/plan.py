"""What an ecosystem module hands the loader: per-layer QuantSpecs and the tensor names to read.

An ecosystem module (hf_fp8, compressed_tensors, modelopt) sees only configs and the header
(names, dtypes, shapes) of the tensors; it never reads tensor data. Its answer is a `Plan`; the
strict loader turns each `LayerPlan` into a QuantizedWeight and checks everything it reads.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Any, Callable, Collection

from ..errors import CheckpointError
from ..spec import QuantSpec
from .safetensors_io import TensorInfo, TensorStore

__all__ = ["NativeLayout", "LayerPlan", "Plan", "Source", "QUANT_SUFFIXES", "split_name", "quantized_modules",
           "module_tensors", "linear_modules", "config_error", "file_problem_key",
           "add_unquantized_siblings"]

# Tensor suffixes that only exist on quantized modules; left unconsumed they are "unexpected".
QUANT_SUFFIXES = frozenset({
    "weight_scale", "weight_scale_inv", "weight_scale_2", "weight_packed", "weight_global_scale",
    "input_scale", "input_global_scale", "weight_zero_point", "input_zero_point", "weight_shape",
    "weight_g_idx",
})
# On-disk element dtypes that mean "this weight is quantized"
QUANT_WEIGHT_DTYPES = frozenset({"F8_E4M3", "F8_E5M2", "U8", "I8"})
# On-disk dtypes of a weight left unquantized
FLOAT_WEIGHT_DTYPES = frozenset({"F32", "BF16", "F16", "F64"})
# A numbered path component (layer, expert): "model.layers.3.mlp" and "model.layers.7.mlp" are
# the same module of different layers
_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")


@dataclasses.dataclass(frozen=True)
class NativeLayout:
    """What a jqlin checkpoint records beyond the spec: logical shape, row segments, layout."""

    shape: tuple[int, int]
    segments: tuple[tuple[int, int], ...] = ()
    layout: str = "nk"


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """How one quantized Linear is stored. Tensor names are full names in the checkpoint."""

    module: str
    spec: QuantSpec
    data: str
    scale: str
    global_scale: str | None = None  # NVFP4 second-level scale (direction in spec.weight)
    input_scale: str | None = None  # static activation scale / NVFP4 activation global
    block_scale_4d: bool = False  # ModelOpt FP8_PB_WO scale (N/bn, 1, K/bk, 1)
    zero_points: tuple[str, ...] = ()  # symmetric zero points stored by old CT: must be all 0
    shape_tensor: str | None = None  # CT `weight_shape`: must equal the logical (N, K)
    ignorable: tuple[str, ...] = ()  # documented tensors the format allows and jqlin drops
    native: "NativeLayout | None" = None  # jqlin checkpoints: data stored padded, as in memory

    @property
    def tensor_names(self) -> tuple[str, ...]:
        names = [self.data, self.scale, self.global_scale, self.input_scale, self.shape_tensor,
                 *self.zero_points, *self.ignorable]
        return tuple(n for n in names if n)


@dataclasses.dataclass
class Plan:
    format: str  # e.g. "compressed-tensors/fp8_block", "modelopt/NVFP4", "fp8/per_tensor"
    layers: dict[str, LayerPlan]
    # module (or file_problem_key(...)) -> why it cannot be loaded; the loader raises the first
    # by key, `inspect` lists them all
    problems: dict[str, str] = dataclasses.field(default_factory=dict)
    source_format: str | None = None  # jqlin checkpoints: the format they were converted from
    # config settings jqlin reads but does not apply (e.g. KV-cache quantization): the loader
    # warns, `inspect` shows them as notes
    warnings: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Source:
    """An opened checkpoint directory: configs and the tensor headers."""

    path: pathlib.Path
    config: dict
    hf_quant_config: dict | None
    store: TensorStore

    @property
    def quantization_config(self) -> dict | None:
        qc = self.config.get("quantization_config")
        if qc is not None and not isinstance(qc, dict):
            raise config_error("config.json", "quantization_config", "a JSON object", qc)
        return qc


# KV-cache scale tensors: AutoFP8's k_proj / v_proj `output_scale`, the attention's k_scale /
# v_scale (vLLM's names, compressed-tensors)
_KV_SCALE_SUFFIXES = (".k_proj.output_scale", ".v_proj.output_scale", ".k_scale", ".v_scale")


def kv_cache_warnings(where: str, key: str, value: Any, store: TensorStore) -> list[str]:
    """The note that KV-cache quantization is read but not applied: for the config's setting
    (`key` in `where`, when set), else for KV-cache scale tensors stored without one."""
    if value:
        return [f"{where}: {key} is {value!r} but KV-cache quantization is not applied: jqlin "
                "runs the KV cache in the model dtype (k/v scale tensors, if any, are kept as "
                "ordinary tensors)"]
    scales = sorted(n for n in store.names() if n.endswith(_KV_SCALE_SUFFIXES))
    if not scales:
        return []
    more = f" and {len(scales) - 1} more" if len(scales) > 1 else ""
    return [f"the checkpoint stores KV-cache scales ({scales[0]!r}{more}) but KV-cache "
            "quantization is not applied: jqlin runs the KV cache in the model dtype (the "
            "scales are kept as ordinary tensors)"]


def ignored_entry(module: str, entries: list[str]) -> str | None:
    """The entry of an ignore list that names `module` or a parent of it, if any."""
    for entry in entries:
        if module == entry or module.startswith(entry + "."):
            return entry
    return None


def split_ignored(quantized: dict[str, dict], entries: list[str], list_name: str, where: str
                  ) -> tuple[dict[str, dict], dict[str, str]]:
    """The quantized modules no entry of the ignore list names (ignored_entry), and a problem
    for each one named (excluded by the config, yet stored quantized)."""
    kept, problems = {}, {}
    for module, tensors in quantized.items():
        hit = ignored_entry(module, entries)
        if hit is None:
            kept[module] = tensors
        else:
            problems[module] = excluded_but_quantized(module, tensors,
                                                      f"{list_name} entry {hit!r}", where)
    return kept, problems


def excluded_but_quantized(module: str, tensors: Collection[str], entry: str, where: str) -> str:
    """The problem of a module that the config excludes from quantization (`entry`: which list
    entry, in `where`) but whose stored tensors are quantized."""
    return (f"module '{module}' matches {entry} in {where} but stores quantization tensors "
            f"({', '.join(sorted(tensors))})")


def config_error(file: str, key: str, expected: str, got: Any) -> CheckpointError:
    return CheckpointError(f"{file}: '{key}' must be {expected}, got {got!r}")


def file_problem_key(name: str) -> str:
    """Key of a problem about a file or the whole config: sorts before every module name, so
    that the loader raises it first (a missing shard explains missing layers, not the reverse)."""
    return "\x00" + name


def split_name(name: str) -> tuple[str, str]:
    """'a.b.q_proj.weight_scale' -> ('a.b.q_proj', 'weight_scale')."""
    module, _, suffix = name.rpartition(".")
    return module, suffix


def module_tensors(store: TensorStore) -> dict[str, dict[str, TensorInfo]]:
    """module -> {suffix: info} for every tensor name."""
    out: dict[str, dict[str, TensorInfo]] = {}
    for name in store.names():
        module, suffix = split_name(name)
        out.setdefault(module, {})[suffix] = store.info(name)
    return out


def quantized_modules(store: TensorStore) -> dict[str, dict[str, TensorInfo]]:
    """Modules whose tensors say they are quantized: a quantization suffix, a packed
    `weight_packed`, or a `weight` stored in an 8-bit element dtype."""
    out = {}
    for module, tensors in module_tensors(store).items():
        w = tensors.get("weight")
        if (QUANT_SUFFIXES & tensors.keys()) or (
                w is not None and len(w.shape) == 2 and w.dtype in QUANT_WEIGHT_DTYPES):
            out[module] = tensors
    return out


def linear_modules(store: TensorStore) -> list[str]:
    """Modules with a 2-D `weight` (Linear-like; embeddings look the same on disk)."""
    return sorted(m for m, t in module_tensors(store).items()
                  if ("weight" in t and len(t["weight"].shape) == 2) or "weight_packed" in t)


def add_unquantized_siblings(problems: dict[str, str], store: TensorStore,
                             quantized: Collection[str], expected: Callable[[str], bool],
                             listed_in: str) -> None:
    """Add to `problems` (where a module has none yet) every module whose 2-D weight is stored
    unquantized although the same module of another layer (same name up to the layer / expert
    numbers) is quantized and the config would quantize it (`expected`: not ignored /
    excluded, targeted).

    Without the architecture the loader cannot know which Linears a model has; a quantized
    sibling is the evidence that this one was meant to be quantized too. A layer deliberately
    left in bf16 is listed in the config (`listed_in`), which `expected` honours.
    """
    example: dict[str, str] = {}
    for m in sorted(quantized):
        role = _INDEX.sub("*", m)
        if role != m:
            example.setdefault(role, m)
    for module, tensors in module_tensors(store).items():
        w = tensors.get("weight")
        if (module in quantized or w is None or len(w.shape) != 2
                or w.dtype not in FLOAT_WEIGHT_DTYPES):
            continue
        sibling = example.get(_INDEX.sub("*", module))
        if sibling is not None and module not in problems and expected(module):
            problems[module] = (
                f"module '{module}' stores its weight unquantized ({w.dtype}) but the same module "
                f"of another layer, '{sibling}', is quantized, and {listed_in} does not exclude "
                "it: the export is incomplete, or the config must list the layer as unquantized")
