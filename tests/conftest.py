import os
import pathlib
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


def _fixtures_dir() -> pathlib.Path:
    """Third-party fixture checkpoints: $JQLIN_FIXTURES, else ../shared/fixtures beside the repo."""
    env = os.environ.get("JQLIN_FIXTURES")
    return pathlib.Path(env) if env else REPO.parent / "shared" / "fixtures"


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


@pytest.fixture(scope="session")
def fixtures_dir() -> pathlib.Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"fixture checkpoints not found at {FIXTURES}; set JQLIN_FIXTURES")
    return FIXTURES
