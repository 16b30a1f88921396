import os
import pathlib
import sys
import zlib

import jax
import numpy as np
import pytest

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
