import os
import pathlib
import subprocess
import sys
import zlib

import jax
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

# Pallas' Mosaic GPU interpreter runs each wgmma as numpy's matmul (OpenBLAS). Threaded, OpenBLAS
# summed a wider x tile's products in another order than a narrow one's on a 2-core AVX2 CPU
# (1 ulp on 9 of 256 outputs of the fixed-K-order rows test), so the interpreter's bits would
# depend on the x tile -- on the machine, not on the kernel. One BLAS thread: an order that
# does not depend on the tile. (Set for subprocesses too.)
os.environ["OPENBLAS_NUM_THREADS"] = "1"
threadpool_limits(1, user_api="blas")

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # tests/oracle.py


def _origin_checkout() -> pathlib.Path | None:
    """The checkout this repository was cloned from, where that is a local directory (a fresh
    clone made for CI elsewhere, e.g. `git clone . /tmp/x`), else None."""
    try:
        url = subprocess.run(["git", "-C", str(REPO), "config", "--get", "remote.origin.url"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    path = pathlib.Path(url.removeprefix("file://")) if url else None
    return path if path is not None and path.is_absolute() and path.is_dir() else None


def _fixtures_dir() -> pathlib.Path:
    """Third-party fixture checkpoints: $JQLIN_FIXTURES, else ../shared/fixtures beside the repo,
    else beside the local checkout it was cloned from."""
    env = os.environ.get("JQLIN_FIXTURES")
    if env:
        return pathlib.Path(env)
    beside = REPO.parent / "shared" / "fixtures"
    origin = _origin_checkout()
    if not beside.is_dir() and origin is not None:
        return origin.parent / "shared" / "fixtures"
    return beside


FIXTURES = _fixtures_dir()


def pytest_collection_modifyitems(config, items):
    on_gpu = jax.default_backend() == "gpu"
    skip_gpu = pytest.mark.skip(reason="needs a GPU (run through the device tool)")
    for item in items:
        if "gpu" in item.keywords and not on_gpu:
            item.add_marker(skip_gpu)
    # the tests marked slow first, the longest (slow(seconds)) before the rest (a stable sort):
    # xdist's workers then share them out at the start, instead of one worker running a
    # 2-minute subprocess check at the end while the other idles. The other multi-device
    # subprocess checks (test_sharding's 8 host devices, bench_tp's 2) are not marked: they keep
    # their place well after test_parallel, never beside it (two such processes at once on 2
    # cores once aborted in XLA's CPU all-reduce rendezvous, NOTES.md session 19)
    def order(item):
        slow = item.get_closest_marker("slow")
        return -(slow.args[0] if slow and slow.args else 1 if slow else 0)
    items.sort(key=order)


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's name so failures reproduce."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


@pytest.fixture
def triton_sm90(monkeypatch):
    """Pallas' Triton lowering asks the runtime for the GPU's compute capability: told sm_90, a
    lowering for CUDA (`.lower(lowering_platforms=("cuda",))`) runs its rules on this machine,
    which interpret mode never does."""
    import types

    from jax._src.pallas.triton import pallas_call_registration
    monkeypatch.setattr(pallas_call_registration, "gpu_info_lib", types.SimpleNamespace(
        get_gpu_info=lambda: types.SimpleNamespace(compute_capability=90)))


@pytest.fixture(scope="session")
def fixtures_dir() -> pathlib.Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"fixture checkpoints not found at {FIXTURES}; set JQLIN_FIXTURES")
    return FIXTURES
