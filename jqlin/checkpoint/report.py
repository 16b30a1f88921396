"""inspect: the detected format and a per-layer table, listing every problem instead of stopping at one."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import warnings

import numpy as np

from .. import formats
from ..errors import CheckpointError
from .build import build_layer
from .checks import shape_str
from .detect import open_source, plan_for
from .loader import unexpected_tensors
from .plan import LayerPlan
from .safetensors_io import TensorStore

__all__ = ["inspect", "Report", "LayerRow"]


@dataclasses.dataclass(frozen=True)
class LayerRow:
    name: str
    spec: str  # registered format name, else the spec's description
    shape: tuple[int, int] | None  # logical (N, K)
    storage: tuple[int, int] | None  # padded (rows, K) in memory
    scale: str  # on-disk scale dtype and shape
    scale_range: tuple[float, float] | None  # min / max of the stored scale values (e8m0 decoded)
    extra: str  # global / static input scale
    error: str | None = None


@dataclasses.dataclass
class Report:
    path: pathlib.Path
    format: str
    rows: list[LayerRow]
    n_tensors: int  # tensors that are not part of a quantized layer
    problems: list[str]
    source_format: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)  # settings jqlin does not apply

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        lines = [f"{self.path}", f"format: {self.format}"
                 + (f" (converted from {self.source_format})" if self.source_format else "")]
        head = ("layer", "spec", "shape", "storage", "scale", "scale range", "global / input")
        body = []
        for r in self.rows:
            rng = f"{r.scale_range[0]:.4g} .. {r.scale_range[1]:.4g}" if r.scale_range else "-"
            body.append((r.name, r.spec, "x".join(map(str, r.shape)) if r.shape else "-",
                         "x".join(map(str, r.storage)) if r.storage else "-", r.scale, rng,
                         r.extra if r.error is None else "ERROR (see problems)"))
        if body:
            widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
            for row in (head, *body):
                lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        lines.append(f"{len(self.rows)} quantized layer(s), {self.n_tensors} other tensor(s)")
        lines.extend(f"note: {n}" for n in self.notes)
        if self.problems:
            lines.append(f"PROBLEMS ({len(self.problems)}):")
            lines.extend(f"  - {p}" for p in self.problems)
        else:
            lines.append("no problems found")
        return "\n".join(lines)


def _scale_values(store: TensorStore, lp: LayerPlan) -> np.ndarray:
    arr = store.read(lp.scale)
    if lp.spec.weight.scale_dtype == "float8_e8m0fnu":
        return np.ldexp(1.0, arr.view(np.uint8).astype(np.int32) - 127)
    return arr.astype(np.float32)


def _row(store: TensorStore, lp: LayerPlan) -> LayerRow:
    info = store.info(lp.scale)
    scale = f"{info.dtype}{shape_str(info.shape)}"
    spec = formats.name_of(lp.spec) or lp.spec.describe()
    try:
        qw = build_layer(store, lp)
    except CheckpointError as e:
        return LayerRow(lp.module, spec, None, None, scale, None, "", str(e))
    vals = _scale_values(store, lp)
    extra = []
    if qw.global_scale is not None:
        g = np.asarray(qw.global_scale, np.float32)
        extra.append(f"global={float(g.max()):.4g} ({lp.spec.weight.global_scale.value})")
    if qw.input_scale is not None:
        extra.append(f"input={float(qw.input_scale):.4g}")
    return LayerRow(lp.module, spec, qw.shape, qw.storage_shape, scale,
                    (float(vals.min()), float(vals.max())), " ".join(extra) or "-")


def inspect(path: str | os.PathLike) -> Report:
    """Describe a checkpoint; problems are collected, never raised."""
    path = pathlib.Path(path)
    try:
        source = open_source(path)
        with warnings.catch_warnings():  # shown as the report's notes instead
            warnings.simplefilter("ignore")
            plan = plan_for(source)
    except CheckpointError as e:
        return Report(path, "unknown", [], 0, [str(e)])
    store = source.store
    problems = [plan.problems[m] for m in sorted(plan.problems)]
    rows = []
    for module in sorted(plan.layers):
        try:
            row = _row(store, plan.layers[module])
        except CheckpointError as e:  # e.g. the scale tensor itself is missing
            row = LayerRow(module, plan.layers[module].spec.describe(), None, None, "-", None,
                           "", str(e))
        rows.append(row)
        if row.error:
            problems.append(row.error)
    extra = unexpected_tensors(store, plan)
    problems.extend(f"{store.info(n).where}: unexpected tensor for a {plan.format} checkpoint "
                    "(no quantized layer uses it)" for n in extra)
    consumed = {n for lp in plan.layers.values() for n in lp.tensor_names}
    n_other = sum(1 for n in store.names() if n not in consumed)
    return Report(path, plan.format, rows, n_other, problems, plan.source_format,
                  list(plan.warnings))
