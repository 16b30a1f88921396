"""Tensor-parallel QuantDense on 8 CPU host devices vs the unsharded layer (in a subprocess:
the device count must be set before jax is imported)."""

import pathlib
import subprocess
import sys

import pytest
from cpu_subprocess import cpu_subprocess_env

from jqlin.nn import weight_partition_specs

SCRIPT = pathlib.Path(__file__).with_name("sharding_check.py")


def test_sharded_matches_unsharded_on_8_host_devices():
    r = subprocess.run([sys.executable, str(SCRIPT)], env=cpu_subprocess_env(8),
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "ALL OK" in r.stdout, out[-4000:]
    assert out.count("\nok ") + out.startswith("ok ") >= 24, out[-4000:]


def test_partition_specs_without_devices():
    import jax.numpy as jnp
    import jqlin
    qw = jqlin.quantize(jnp.ones((256, 384)), "nvfp4", input_scale=1.0)
    col = weight_partition_specs(qw, "column", "tp", 2)
    assert tuple(col["data"]) == ("tp", None) and tuple(col["scale"]) == ("tp", None)
    assert tuple(col["global_scale"]) == () and tuple(col["input_scale"]) == ()
    row = weight_partition_specs(qw, "row", "tp", 4)
    assert tuple(row["data"]) == (None, "tp") and tuple(row["scale"]) == (None, "tp")
    with pytest.raises(ValueError, match="divide over 5"):
        weight_partition_specs(qw, "row", "tp", 5)
