"""Deterministic block W8A8 on Mosaic GPU (pallas_kernels.fp8_block_det): one K order, three
launches. CPU: Mosaic GPU's interpreter (outputs and shared memory start as NaN: an element no
launch writes stays NaN) -- every launch bitwise the others and within the fp8 bound of float64;
the swap-AB decode launch lowers for CUDA; launch choice and bad input. GPU (marked): the same
at real sizes, rows across M bitwise, and the dispatcher's deterministic mode taking it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jqlin
from float64_bound import (GPU_ACC_RTOL_FP8, assert_within_bound,
                           block_w8a8_float64 as _float64, block_w8a8_operands as _operands)
from jqlin import dispatch
from pallas_kernels import fp8_block_det as det
from pallas_kernels.common import KShardError, k_shards
from pallas_kernels.fp8_a16_decode_mgpu import plain_slabs
from pallas_kernels.fp8_block_det import DetLaunch, det_launch, fp8_block_det_mgpu

CPU_ACC_RTOL = 1e-5


def _bits(y):
    return np.asarray(y, np.float32).view(np.uint32)


def _run(args, launch, out_dtype=jnp.float32, interpret=True):
    return jax.jit(lambda *a: fp8_block_det_mgpu(*a, out_dtype=out_dtype, launch=launch,
                                                 interpret=interpret))(*args)


def _launches_match_the_fold(args, acc_rtol, interpret):
    """The register fold (one K-block a step, no park) within acc_rtol of float64, and every
    launch that takes the problem bitwise it: spread; park at one K-block a step and at two
    (a part's close inside a step where its K-blocks are odd), also with a quarter of its
    columns' sum kept in registers (park_cols=96, session 51's candidate); the register fold
    and spread at two where a part's K-blocks are even; the swap-AB decode up to 128 rows at
    two stage counts."""
    m, k = args[0].shape
    fold = _run(args, DetLaunch("fold", 8), interpret=interpret)
    ref, bound = _float64(*args)
    assert_within_bound(fold, ref, bound, acc_rtol, jnp.float32)
    launches = [DetLaunch("spread", 8), DetLaunch("fold", 8, park=True),
                DetLaunch("fold", 8, blocks_per_step=2, park=True),
                DetLaunch("fold", 8, blocks_per_step=2, park=True, park_cols=96)]
    if k // 128 // 8 % 2 == 0:
        launches += [DetLaunch("fold", 8, blocks_per_step=2),
                     DetLaunch("spread", 8, blocks_per_step=2)]
    if m <= 128:
        launches += [DetLaunch("decode", 8, stages=s) for s in (2, 4)]
    for launch in launches:
        np.testing.assert_array_equal(_bits(_run(args, launch, interpret=interpret)),
                                      _bits(fold), err_msg=str(launch))


# K = 2048: 8 parts of two K-blocks (two blocks a step fit); K = 1024: 8 parts of one
@pytest.mark.parametrize("m,k", [(9, 1024), (40, 2048), (130, 2048)])
def test_interpreter_launches_are_bitwise_and_match_float64(rng, m, k):
    """M = 9 / 40 (the decode launch's 16- and 48-row x tiles, partly filled: its interpreter
    rows are the 128-row tile's), 130 (a partial 128-row tile); N = 256: two 128-row blocks,
    four 64-row CTAs."""
    _launches_match_the_fold(_operands(rng, m, 256, k), CPU_ACC_RTOL, interpret=True)


def test_dispatcher_deterministic_mode_runs_it_in_every_row(rng):
    """deterministic=True on fp8_block takes fp8_block_det (its interpreter here): explain() names
    it, and rows match across M (both Ms launch "spread" on this small weight; the launches
    against each other: test_interpreter_launches_are_bitwise_and_match_float64; M = 2, 7, 64,
    300 through the dispatcher: test_pallas_fp8.test_batch_invariant_rows)."""
    from jqlin.kernels.pallas_fp8 import describe_config
    qw = jqlin.quantize(rng.standard_normal((200, 1000)).astype(np.float32), "fp8_block")
    x = jnp.asarray(rng.standard_normal((70, 1000)), jnp.bfloat16)  # (K padded to 1024)
    path = describe_config("pallas_fp8_block", 70, qw, qw.spec, x.dtype, True)["path"]
    assert "fp8_block_det" in path and "K in 8 parts" in path, path
    y = np.asarray(dispatch.matmul(x, qw, kernel="pallas_fp8_block", deterministic=True),
                   np.float32)
    for i in (0, 69):
        row = dispatch.matmul(x[i:i + 1], qw, kernel="pallas_fp8_block", deterministic=True)
        np.testing.assert_array_equal(_bits(row[0].astype(jnp.float32)), _bits(y[i]))


@pytest.mark.parametrize("m,finish", [(1, True), (5, False), (16, False)])
def test_decode_launch_lowers_for_cuda_on_cpu(rng, m, finish):
    """The swap-AB launch with e4m3 x (8- and 16-row x tiles; the cluster finish and the slabs)
    through Mosaic GPU's CUDA lowering, which runs in Python."""
    args = _operands(rng, m, 512, 2048)
    launch = DetLaunch("decode", 8, stages=2, in_kernel_finish=finish)
    f = jax.jit(lambda *a: fp8_block_det_mgpu(*a, launch=launch))
    assert "mosaic_gpu" in f.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def test_det_launch_by_m(monkeypatch):
    """The launch by M that the H100 measured fastest (fp8_block_det's table; 132 SMs)."""
    import pallas_kernels.fp8_heuristics as heur
    monkeypatch.setattr(det, "num_sms", lambda: 132)
    monkeypatch.setattr(heur, "num_sms", lambda: 132)
    for m in (1, 16, 64):  # the swap-AB decode; the cluster's finish at 8-row x tiles
        launch = det_launch(m, 4096, 4096)
        assert (launch.kind, launch.in_kernel_finish) == ("decode", m == 1)
    assert det_launch(1, 4096, 4096, out_dtype=jnp.float32).in_kernel_finish is False
    assert det_launch(16, 4096, 4096, interpret=True).kind == "spread"  # (not decode: bits)
    assert det_launch(256, 4096, 4096).kind == "fold"  # measured 28.8 us, spread 41.3
    assert det_launch(256, 4096, 14336).kind == "spread"  # measured 68.5, fold 78.3
    assert det_launch(256, 36864, 7168).kind == "fold"  # 576 tiles
    assert det_launch(16, 36864, 7168).kind == "decode"  # measured 110.0 us, fold 144.9
    assert det_launch(64, 36864, 7168).kind == "fold"  # 288 tiles: 145.5, decode 152.2
    # the fold parks its parts' sum in shared memory, at two K-blocks a step: also where a
    # part's 7 K-blocks close inside a step (measured, session 50: park 201.3 us, one K-block a
    # step in registers 206.8 at 4096^3; 14336x4096 598.3 / 681.3)
    # and parts of up to 8 K-blocks park 96 of their 128 columns (session 53, two runs: 3-4%
    # ahead at K = 4096 / 7168 / 8192, 2% behind at 14336)
    assert det_launch(4096, 4096, 4096) == DetLaunch("fold", 8, blocks_per_step=2, park=True,
                                                     park_cols=96)
    assert det_launch(4096, 36864, 7168) == DetLaunch("fold", 8, blocks_per_step=2, park=True,
                                                      park_cols=96)
    assert det_launch(4096, 4096, 14336) == DetLaunch("fold", 8, blocks_per_step=2, park=True)
    assert det_launch(256, 4096, 14336).blocks_per_step == 2  # 8 parts of 14 K-blocks
    assert det_launch(256, 4096, 7168, kind="spread").blocks_per_step == 1  # 8 parts of 7
    # (one part: no slabs, nothing to park; K = 384's three K-blocks, one a step)
    assert det_launch(64, 4096, 384, interpret=True) == DetLaunch("fold", 1)


def test_explain_names_the_parked_columns(monkeypatch):
    """explain()'s words for the fold say how much of the parts' sum is parked (a GPU's launch:
    the interpreter always spreads)."""
    from jqlin.kernels.pallas_fp8 import _det_w8a8_note
    import pallas_kernels.fp8_heuristics as heur
    monkeypatch.setattr(det, "num_sms", lambda: 132)
    monkeypatch.setattr(heur, "num_sms", lambda: 132)
    short = _det_w8a8_note(det_launch(4096, 4096, 4096)._asdict())
    assert "parked in shared memory (96 of 128 columns; the rest in registers)" in short, short
    whole = _det_w8a8_note(det_launch(4096, 4096, 14336)._asdict())
    assert "parked in shared memory;" in whole, whole


def test_k_shards_spread_every_devices_parts():
    """Inside k_shards the local parts are CTAs of their own (their slabs gathered and added in
    K order with the other devices'); folding them in the CTA is refused."""
    with k_shards("k", 2):
        launch = det_launch(4096, 4096, 2048)
        assert (launch.kind, launch.parts) == ("spread", 4)  # 8 parts of K = 4096, 4 here
        with pytest.raises(ValueError, match="k_shards"):
            det_launch(4096, 4096, 2048, kind="fold")
    with k_shards("k", 16), pytest.raises(KShardError):
        det_launch(4096, 4096, 256)  # 8 parts cannot be cut 16 ways


def test_rejects_bad_input(rng):
    xq, xs, w, ws = _operands(rng, 20, 256, 512)
    with pytest.raises(ValueError, match="launch must be one of"):
        fp8_block_det_mgpu(xq, xs, w, ws, launch="gemv")
    with pytest.raises(ValueError, match="M <= 128"):
        fp8_block_det_mgpu(jnp.concatenate([xq] * 7), jnp.concatenate([xs] * 7), w, ws,
                           launch="decode")
    with pytest.raises(ValueError, match="N and K multiples of 128"):
        fp8_block_det_mgpu(xq, xs, w[:200], ws)
    with pytest.raises(ValueError, match="x_scale must be"):
        fp8_block_det_mgpu(xq[:4], xs[:3], w, ws, launch="decode", interpret=True)
    with pytest.raises(ValueError, match="park_cols must be a multiple of 32"):
        fp8_block_det_mgpu(xq, xs, w, ws, launch=DetLaunch("fold", 2, park=True, park_cols=48))
    with pytest.raises(ValueError, match="e4m3 x goes with x_scales"):
        plain_slabs(xq[:4], w, splits=1, stages=2, a_tile=None, chains="range",
                    x_scales=xs[:4], interpret=True)


# -- GPU ----------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("k,n", [(7168, 2560), (4096, 4096)])
@pytest.mark.parametrize("m", [1, 7, 16, 64, 255])
def test_gpu_launches_are_bitwise_and_match_float64(rng, m, k, n):
    """Every launch that takes M, bitwise fold's; fold within the fp8 bound of float64.
    K = 7168: 8 parts of 7 K-blocks (one a step); 4096: of 4 (two a step)."""
    args = _operands(rng, m, n, k)
    _launches_match_the_fold(args, GPU_ACC_RTOL_FP8, interpret=False)
    if m <= 16:  # the cluster's in-kernel finish: the bf16 output XLA's fold rounds
        bf16 = [_run(args, DetLaunch("decode", 8, stages=2, in_kernel_finish=f), jnp.bfloat16,
                     interpret=False) for f in (False, True)]
        np.testing.assert_array_equal(_bits(bf16[0].astype(jnp.float32)),
                                      _bits(bf16[1].astype(jnp.float32)))


@pytest.mark.gpu
@pytest.mark.parametrize("k,n", [(4096, 6144), (7168, 2560)])
def test_gpu_dispatcher_rows_do_not_depend_on_m(rng, k, n):
    """deterministic=True through the dispatcher: rows alone (M = 1, the decode launch) equal
    the same rows inside M = 2, 7, 16, 64, 255, 4096 (decode, spread and fold launches)."""
    qw = jqlin.quantize(rng.standard_normal((n, k)).astype(np.float32), "fp8_block")
    x = jnp.asarray(rng.standard_normal((4096, k)) * rng.uniform(0.2, 3, (4096, 1)),
                    jnp.bfloat16)
    run = jax.jit(lambda x: dispatch.matmul(x, qw, kernel="pallas_fp8_block",
                                            deterministic=True))
    alone = {i: _bits(run(x[i:i + 1])[0].astype(jnp.float32)) for i in (0, 1, 6)}
    for m in (2, 7, 16, 64, 255, 4096):
        y = _bits(run(x[:m]).astype(jnp.float32))
        for i, row in alone.items():
            if i < m:
                np.testing.assert_array_equal(y[i], row, err_msg=f"M={m} row {i}")
