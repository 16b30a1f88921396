"""A benchmark script with DeepSeek-V3.1's block FP8 spec (`scale_fmt: "ue8m0"` checkpoints:
128x128 block weights, activations in e4m3 groups of 128 with power-of-two e8m0 scales by
ScaleRule.DEEPSEEK) registered as the format `fp8_block_ue8m0` for the run, so it can be timed
beside `fp8_block` (float32 activation scales) in one run. jqlin registers no name for it:
checkpoints load it as `fp8/block_ue8m0`.

    PYTHONPATH=. python3 benchmarks/bench_ue8m0.py --formats fp8_block,fp8_block_ue8m0 \\
        --shapes deepseek-v3 --m 1,16,256,4096 --modes default --out $OUT/ue8m0
    PYTHONPATH=. python3 benchmarks/bench_ue8m0.py --script decode_breakdown.py \\
        --ops fp8_block,fp8_block_ue8m0 --shapes 18432x7168 --m 256,4096
(--script: the benchmark to run, default bench_matmul.py; every other argument is that
script's.)
"""

from __future__ import annotations

import dataclasses
import pathlib
import runpy
import sys

from jqlin import formats
from jqlin.checkpoint.hf_fp8 import ue8m0_activation

NAME = "fp8_block_ue8m0"


def _script() -> pathlib.Path:
    """--script NAME (removed from sys.argv): a benchmark script beside this one."""
    name = "bench_matmul.py"
    if "--script" in sys.argv:
        i = sys.argv.index("--script")
        if i + 1 == len(sys.argv):
            sys.exit("bench_ue8m0.py: --script needs a script name, e.g. decode_breakdown.py")
        name = sys.argv.pop(i + 1)
        del sys.argv[i]
    path = pathlib.Path(__file__).with_name(name)
    if not path.is_file():
        sys.exit(f"bench_ue8m0.py: --script {name!r}: no such script in {path.parent}")
    return path


if __name__ == "__main__":
    script = _script()
    formats.register(NAME, dataclasses.replace(formats.get("fp8_block"),
                                               activation=ue8m0_activation(128)))
    runpy.run_path(str(script), run_name="__main__")
