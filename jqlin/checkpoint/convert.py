"""convert: any supported checkpoint -> a jqlin checkpoint (see native.py), streaming and atomic.

Layers are built (and, with `quantize=`, quantized) one at a time and their arrays written
immediately, so peak memory stays near the largest layer, not the model. Everything is written
into a temporary directory beside `dst` that is renamed into place only after the last byte:
a failure or interrupt leaves no partial `dst`.
"""

from __future__ import annotations

import fnmatch
import json
import os
import pathlib
import shutil
import tempfile
from typing import Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from tqdm import tqdm  # plain bars: tqdm.auto wants ipywidgets inside notebooks

from .. import formats
from ..errors import CheckpointError, UnknownFormatError
from ..qweight import QuantizedWeight, calibrate_input_scale
from ..qweight import quantize as quantize_weight
from ..spec import QuantSpec
from . import native
from .build import build_layer
from .checks import FLOAT_TAGS
from .detect import open_source, plan_for
from .loader import raise_problems, unexpected_tensors
from .plan import split_name
from .safetensors_io import INDEX_FILE, ShardWriter, TensorStore

__all__ = ["convert", "DEFAULT_EXCLUDE", "quantizable_weights"]

# What producers leave unquantized (FORMATS.md sec. 2): lm_head, embeddings, norms, MoE routers.
DEFAULT_EXCLUDE = ("*lm_head", "*embed*", "*norm*", "*.mlp.gate", "*router*")
_NOT_COPIED = {"config.json", "hf_quant_config.json", native.METADATA_FILE, INDEX_FILE}


def quantizable_weights(store: TensorStore, exclude: Sequence[str] = ()) -> list[str]:
    """Names of 2-D floating `*.weight` tensors online quantization applies to."""
    patterns = (*DEFAULT_EXCLUDE, *exclude)
    out = []
    for name in store.names():
        module, suffix = split_name(name)
        info = store.info(name)
        if (suffix == "weight" and len(info.shape) == 2 and info.dtype in (*FLOAT_TAGS, "F64")
                and not any(fnmatch.fnmatchcase(module, p) for p in patterns)):
            out.append(name)
    return out


def _write_layer(writer: ShardWriter, module: str, qw: QuantizedWeight, entries: dict) -> None:
    names = native.tensor_names(module, qw)
    for role, arr in (("data", qw.data), ("scale", qw.scale), ("global_scale", qw.global_scale),
                      ("input_scale", qw.input_scale)):
        if arr is not None:
            writer.write(names[role], np.asarray(arr))
    entries[module] = native.layer_entry(module, qw)


def _static_scales(spec: QuantSpec, modules: list[str],
                   input_amax: Mapping[str, float] | None) -> dict[str, jnp.ndarray]:
    """Static activation scales (the key's own convention) from per-module input amax."""
    if not spec.static_input_scale:
        if input_amax is not None:
            static = [f for f in formats.names() if formats.get(f).static_input_scale]
            name = formats.name_of(spec) or spec.describe()
            raise CheckpointError(f"input_amax= / --input-amax given, but {name}'s activations "
                                  f"need no static scale (formats that do: {', '.join(static)})")
        return {}
    input_amax = dict(input_amax or {})
    missing = [m for m in modules if m not in input_amax]
    if missing:
        raise CheckpointError(
            f"the target format has a static activation scale; input_amax has no entry for "
            f"'{missing[0]}' ({len(missing)} of {len(modules)} layers missing): pass the max |x| "
            "of each layer's calibration inputs")
    out = {}
    for m in modules:
        a = input_amax[m]
        if not isinstance(a, (int, float)) or not np.isfinite(a) or a <= 0:
            raise CheckpointError(f"input_amax['{m}'] must be a finite number > 0, got {a!r}")
        out[m] = calibrate_input_scale(spec.activation, jnp.float32(a))
    return out


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, quantize: str | None = None,
            input_amax: Mapping[str, float] | None = None, exclude: Sequence[str] = (),
            overwrite: bool = False, progress: bool = True,
            max_shard_bytes: int = 4 << 30) -> pathlib.Path:
    """Write `src` as a jqlin checkpoint at `dst`; returns dst.

    quantize: a registered format name (`jqlin.formats.names()`); quantizes every 2-D float
        Linear weight of an unquantized checkpoint with `jqlin.quantize`, leaving lm_head,
        embeddings, norms, routers and `exclude` (fnmatch patterns on module names) alone.
    input_amax: module -> max |input activation| from calibration, for formats with a static
        activation scale (fp8_per_tensor, nvfp4); converted to the format's own convention.
    """
    source = open_source(src)
    store = source.store
    plan = plan_for(source)
    raise_problems(plan)
    extra = unexpected_tensors(store, plan)
    if extra:
        raise CheckpointError(f"{store.info(extra[0]).where}: unexpected tensor for a "
                              f"{plan.format} checkpoint (no quantized layer uses it)")
    spec, to_quantize, static = None, [], {}
    if quantize is not None:
        try:
            spec = formats.get(quantize)
        except UnknownFormatError as e:
            raise CheckpointError(str(e)) from None
        if plan.layers:
            raise CheckpointError(f"{source.path}: already quantized ({plan.format}); quantize= "
                                  "needs a bf16/fp32 checkpoint")
        _check_exclude(store, exclude)
        to_quantize = quantizable_weights(store, exclude)
        if not to_quantize:
            raise CheckpointError(f"{source.path}: no weight to quantize (every Linear weight "
                                  "is excluded, or none is a 2-D float Linear weight)")
        static = _static_scales(spec, [split_name(n)[0] for n in to_quantize], input_amax)
    elif input_amax is not None:
        raise CheckpointError("input_amax= / --input-amax is only used together with "
                              "quantize= / --quantize")
    elif exclude:
        raise CheckpointError("exclude= / --exclude is only used together with quantize= / "
                              "--quantize (a quantized checkpoint's layers are converted as "
                              "stored)")

    if (isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int)
            or max_shard_bytes <= 0):
        raise CheckpointError(f"max_shard_bytes must be a positive number of bytes, got "
                              f"{max_shard_bytes!r}")
    dst = _destination(source.path, pathlib.Path(dst), overwrite)
    tmp = _temporary_beside(dst)
    writer = ShardWriter(tmp, max_shard_bytes=max_shard_bytes, metadata={"format": "jqlin"})
    try:
        entries: dict = {}
        consumed = {n for lp in plan.layers.values() for n in lp.tensor_names}
        quantize_set = set(to_quantize)
        bar = tqdm(total=store.total_bytes, unit="B", unit_scale=True, disable=not progress,
                   desc=f"convert {source.path.name}")
        done = 0

        def advance(names) -> None:
            nonlocal done
            done += len(names)
            bar.update(sum(store.info(n).nbytes for n in names))
            bar.set_postfix_str(f"{done}/{len(store)} tensors")

        with bar:
            for module in sorted(plan.layers):
                lp = plan.layers[module]
                _write_layer(writer, module, build_layer(store, lp), entries)
                advance([n for n in lp.tensor_names if n in store])
            for name in store.names():
                if name in consumed:
                    continue
                if name in quantize_set:
                    module = split_name(name)[0]
                    try:
                        qw = quantize_weight(jnp.asarray(store.read(name)), spec,
                                             input_scale=static.get(module))
                    except ValueError as e:  # (e.g. a NaN weight: name the tensor)
                        raise CheckpointError(f"{store.info(name).where}: {e}") from None
                    _write_layer(writer, module, qw, entries)
                else:
                    writer.write(name, store.read(name))
                advance([name])
        writer.close()
        _write_metadata(tmp, source, plan, entries, quantize)
        _copy_side_files(source.path, tmp)
        _replace(tmp, dst)
    except BaseException as e:
        writer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):  # a full disk, a vanished source: say which conversion
            raise CheckpointError(f"{dst}: converting {source.path} failed ({e.strerror or e}"
                                  f"{': ' + str(e.filename) if e.filename else ''}); nothing "
                                  "was written") from e
        raise
    return dst


def _check_exclude(store: TensorStore, exclude: Sequence[str]) -> None:
    """A pattern that names no module is a typo that would quantize what was to be kept."""
    modules = sorted({split_name(n)[0] for n in store.names()})
    for p in exclude:
        if not any(fnmatch.fnmatchcase(m, p) for m in modules):
            example = next((m for m in modules if m.endswith("_proj")), next(iter(modules), ""))
            raise CheckpointError(f"exclude pattern {p!r} matches no module of the checkpoint "
                                  f"(module names look like {example!r}; fnmatch patterns)")


_CHECKPOINT_MARKERS = ("config.json", native.METADATA_FILE)


def _destination(src: pathlib.Path, dst: pathlib.Path, overwrite: bool) -> pathlib.Path:
    """dst checked before any work: replacing it must never delete the source."""
    if dst.exists() and not overwrite:
        raise CheckpointError(f"{dst}: already exists (pass overwrite=True / --overwrite)")
    real_src, real_dst = src.resolve(), dst.resolve()
    if real_dst == real_src or real_dst in real_src.parents:
        raise CheckpointError(f"{dst}: is the source checkpoint {src} or a directory holding it; "
                              "replacing it would delete the source (choose another destination)")
    if dst.exists() and not dst.is_dir():
        raise CheckpointError(f"{dst}: exists and is not a directory (a checkpoint is one)")
    if dst.is_dir() and not any((dst / f).is_file() for f in _CHECKPOINT_MARKERS) \
            and any(dst.iterdir()):
        # (overwrite replaces a checkpoint; a mistyped dst must not delete someone's directory)
        raise CheckpointError(f"{dst}: overwrite replaces a checkpoint directory, but this one "
                              f"holds none of {', '.join(_CHECKPOINT_MARKERS)} and is not empty "
                              "(refusing to delete it)")
    return real_dst


def _temporary_beside(dst: pathlib.Path) -> pathlib.Path:
    """The work directory, on dst's file system so that the final rename is atomic."""
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        return pathlib.Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    except OSError as e:
        raise CheckpointError(f"{dst}: cannot create the destination's directory "
                              f"({e.strerror or e}: {e.filename or dst.parent})") from None


def _write_metadata(tmp: pathlib.Path, source, plan, entries: dict, quantize: str | None) -> None:
    if quantize is not None:
        origin = f"jqlin.quantize/{quantize}"
    else:
        origin = plan.source_format if plan.format == "jqlin" else plan.format
    meta = {"format_version": native.FORMAT_VERSION, "source_format": origin,
            "layers": {m: entries[m] for m in sorted(entries)}}
    (tmp / native.METADATA_FILE).write_text(json.dumps(meta, indent=1))
    config = dict(source.config)
    config["quantization_config"] = {"quant_method": native.QUANT_METHOD,
                                     "format_version": native.FORMAT_VERSION,
                                     "metadata_file": native.METADATA_FILE,
                                     "source_format": origin}
    (tmp / "config.json").write_text(json.dumps(config, indent=2))


def _copy_side_files(src: pathlib.Path, tmp: pathlib.Path) -> None:
    """Tokenizer, generation config and the like travel with the weights."""
    for p in sorted(src.iterdir()):
        if (p.is_file() and p.name not in _NOT_COPIED and p.suffix != ".safetensors"
                and not (tmp / p.name).exists()):
            shutil.copyfile(p, tmp / p.name)


def _replace(tmp: pathlib.Path, dst: pathlib.Path) -> None:
    """Move the finished tmp into place; an old dst is restored if that fails."""
    try:
        if not dst.exists():
            os.rename(tmp, dst)
            return
        trash = pathlib.Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
    except OSError as e:
        raise CheckpointError(f"{dst}: cannot move the converted checkpoint into place "
                              f"({e.strerror or e})") from None
    try:
        os.rename(dst, trash / "old")
    except OSError as e:
        shutil.rmtree(trash, ignore_errors=True)
        raise CheckpointError(f"{dst}: cannot replace it ({e.strerror or e}); left "
                              "unchanged") from None
    try:
        os.rename(tmp, dst)
    except OSError as e:
        os.rename(trash / "old", dst)
        shutil.rmtree(trash, ignore_errors=True)
        raise CheckpointError(f"{dst}: cannot move the converted checkpoint into place "
                              f"({e.strerror or e}); the old one is left unchanged") from None
    shutil.rmtree(trash, ignore_errors=True)

