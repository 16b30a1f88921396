"""The demo: a small checkpoint -> a quantized Llama -> a few tokens, the kernels chosen for
every layer, and the logit error against the unquantized model."""

from __future__ import annotations

import os
import pathlib
import tempfile
from typing import Any, Callable

import numpy as np

from .. import formats
from ..dispatch import kernels_for
from ..checkpoint import convert, load_checkpoint
from ..nn.quantize_model import quant_layers
from .llama import from_checkpoint

__all__ = ["run_llama_demo"]


def _prompt(path: pathlib.Path, vocab: int) -> np.ndarray:
    ref = path / "reference" / "input_ids.npy"
    if ref.is_file():
        return np.load(ref)[:1].astype(np.int32)
    return np.random.default_rng(0).integers(3, vocab, size=(1, 12)).astype(np.int32)


def run_llama_demo(checkpoint_dir: str | os.PathLike, out: Callable[[str], Any] = print, *,
                   format: str = "fp8_block", reference_dir: str | os.PathLike | None = None,
                   max_new_tokens: int = 8) -> dict[str, Any]:
    """Load (an unquantized checkpoint is first converted to `format`) and run a small Llama.

    The unquantized reference is `checkpoint_dir` itself when it is unquantized, else
    `reference_dir` (without one, the logit comparison is skipped). Everything runs in float32.
    Returns the numbers it printed: tokens, reference tokens, logit error, kernels per layer.
    """
    src = pathlib.Path(checkpoint_dir)
    ck = load_checkpoint(src)
    with tempfile.TemporaryDirectory() as tmp:
        if ck.format == "unquantized":
            reference_dir = src if reference_dir is None else reference_dir
            out(f"converting {src} to {format} (online quantization of every Linear but lm_head)")
            dst = convert(src, pathlib.Path(tmp) / "converted", quantize=format, progress=False)
            ck = load_checkpoint(dst)
        out(f"checkpoint: {src} [{ck.format}{f' from {ck.source_format}' if ck.source_format else ''}], "
            f"{len(ck.layers)} quantized layers")
        model = from_checkpoint(ck)
    cfg = model.config
    ids = _prompt(src, cfg.vocab_size)
    gen = model.generate(ids, max_new_tokens)
    out(f"prompt ids: {ids[0].tolist()}")
    out(f"generated:  {np.asarray(gen.tokens[0]).tolist()}")

    m = ids.shape[1]
    kernels = {}
    out(f"kernel per layer (M={m} prompt rows):")
    for path, layer in quant_layers(model).items():
        ex = layer.explain((m, layer.in_features))
        kernels[path] = ex.chosen
        name = formats.name_of(ex.spec) or ex.spec.describe()
        # kernels that declare this spec but were rejected here (platform, shape, mode)
        declared = kernels_for(ex.spec)
        why = ", ".join(f"{k} ({v.split(';')[0]})" for k, v in ex.rejected.items()
                        if k in declared)
        out(f"  {path:<34} {name:<16} -> {ex.chosen}" + (f"   rejected: {why}" if why else ""))

    result: dict[str, Any] = {"tokens": np.asarray(gen.tokens[0]).tolist(), "kernels": kernels}
    if reference_dir is None:
        out("no unquantized reference given (reference_dir=): logit error not computed")
        return result
    ref_model = from_checkpoint(reference_dir)
    if ref_model.config != cfg:
        raise ValueError(f"reference {reference_dir} is a different model than {src}")
    logits, ref_logits = np.asarray(model(ids)), np.asarray(ref_model(ids))
    err = float(np.linalg.norm(logits - ref_logits) / np.linalg.norm(ref_logits))
    agree = float(np.mean(logits.argmax(-1) == ref_logits.argmax(-1)))
    ref_gen = ref_model.generate(ids, max_new_tokens)
    out(f"unquantized model generates: {np.asarray(ref_gen.tokens[0]).tolist()}")
    out(f"logits vs the unquantized model over the prompt: relative Frobenius error {err:.3e}, "
        f"top-1 agreement {agree:.0%}")
    result.update(reference_tokens=np.asarray(ref_gen.tokens[0]).tolist(), logit_rel_error=err,
                  top1_agreement=agree)
    return result
