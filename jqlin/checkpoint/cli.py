"""`jqlin inspect SRC` and `jqlin convert SRC DST [--quantize FORMAT]`.

Bad checkpoints print the CheckpointError message (no traceback) and return a nonzero code.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

from .. import formats
from . import native
from ..errors import JqlinError

__all__ = ["add_inspect_parser", "add_convert_parser"]


def add_inspect_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "inspect", help="show a checkpoint's detected format and per-layer table; flag problems",
        description="Print the detected format and a per-layer table (spec, shapes, scale "
                    "ranges). Every problem found is listed; exit code 1 if there is any.")
    p.add_argument("src", help="checkpoint directory (config.json + safetensors)")
    p.set_defaults(func=_inspect)
    return p


def _inspect(args) -> int:
    from .report import inspect
    report = inspect(args.src)
    print(report.render())
    return 0 if report.ok else 1


def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4GB, 500MB)")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    size = int(float(m.group(1)) * mult)
    if size <= 0:
        raise argparse.ArgumentTypeError(f"a shard size must be positive, got {text!r}")
    return size


def add_convert_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "convert", help="write a jqlin checkpoint (safetensors + jqlin_quant.json)",
        description="Convert an HF fp8 / compressed-tensors / ModelOpt / jqlin checkpoint into a "
                    "jqlin checkpoint, streaming tensor by tensor and writing atomically. "
                    "--quantize quantizes a bf16/fp32 checkpoint online.")
    p.add_argument("src", help="source checkpoint directory")
    p.add_argument("dst", help="destination directory (must not exist unless --overwrite)")
    p.add_argument("--quantize", metavar="FORMAT", choices=formats.names(),
                   help=f"quantize Linear weights into FORMAT: {', '.join(formats.names())}")
    p.add_argument("--input-amax", metavar="JSON",
                   help="JSON file {module: max |input|} for formats with static activation "
                        "scales (fp8_per_tensor, nvfp4)")
    p.add_argument("--exclude", metavar="PATTERN", action="append", default=[],
                   help="fnmatch pattern of modules to leave unquantized (repeatable); lm_head, "
                        "embeddings, norms and routers are always left alone")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing DST (a checkpoint directory, or an empty one)")
    p.add_argument("--max-shard-size", type=_size, default=4 << 30, metavar="SIZE",
                   help="split the output into shards of at most SIZE (default 4GiB)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_convert)
    return p


def _convert(args) -> int:
    from .convert import convert
    try:
        amax = None
        if args.input_amax:
            try:
                amax = json.loads(pathlib.Path(args.input_amax).read_text())
            except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
                print(f"jqlin convert: error: --input-amax {args.input_amax}: {e}", file=sys.stderr)
                return 2
            if not isinstance(amax, dict):
                print(f"jqlin convert: error: --input-amax {args.input_amax}: expected a JSON "
                      "object of module -> amax", file=sys.stderr)
                return 2
        dst = convert(args.src, args.dst, quantize=args.quantize, input_amax=amax,
                      exclude=args.exclude, overwrite=args.overwrite,
                      progress=not args.no_progress, max_shard_bytes=args.max_shard_size)
    except JqlinError as e:
        print(f"jqlin convert: error: {e}", file=sys.stderr)
        return 1
    layers = json.loads((dst / native.METADATA_FILE).read_text())["layers"]
    if layers:
        print(f"wrote {dst} ({len(layers)} quantized layers)")
    else:  # (a copy in jqlin's layout: say so, it is rarely what was meant)
        print(f"wrote {dst} (no quantized layer: the source holds none; --quantize FORMAT "
              "quantizes it)")
    return 0
