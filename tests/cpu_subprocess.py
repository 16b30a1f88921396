"""The environment of a test's CPU subprocess (a script that must set its host device count
before jax is imported): this checkout first on PYTHONPATH, the CPU platform, and the caller's
XLA_FLAGS kept with the device count added."""

import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]


def cpu_subprocess_env(devices: int = 1) -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    if devices > 1:
        env["XLA_FLAGS"] = " ".join(
            [os.environ.get("XLA_FLAGS", ""), f"--xla_force_host_platform_device_count={devices}"]
        ).strip()
    return env
