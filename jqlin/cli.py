"""`jqlin` command line: demo, inspect, convert, bench.

Each subcommand lives with the code it exercises; this module only wires argparse.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from .errors import JqlinError


def positive_int(text: str) -> int:
    """An argparse type (and the subcommands' own list checks): an integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v

# subcommand -> "module:function(subparsers)" that adds its parser (and sets `func`)
_SUBCOMMANDS = {
    "demo": "jqlin.demo:add_parser",
    "inspect": "jqlin.checkpoint.cli:add_inspect_parser",
    "convert": "jqlin.checkpoint.cli:add_convert_parser",
    "bench": "jqlin.bench:add_parser",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jqlin", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, target in _SUBCOMMANDS.items():
        mod, fn = target.split(":")
        try:
            getattr(importlib.import_module(mod), fn)(sub)
        except ImportError as e:  # a subcommand whose module is not built yet
            p = sub.add_parser(name, help=f"(unavailable: {e})")
            p.set_defaults(func=lambda args, e=e: _unavailable(e))
    return parser


def _unavailable(e: Exception) -> int:
    print(f"jqlin: this subcommand is unavailable: {e}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except JqlinError as e:  # a deliberate error names what is at fault: no traceback
        print(f"jqlin {args.command}: error: {e}", file=sys.stderr)
        return 1
