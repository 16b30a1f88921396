"""The experimental Mosaic GPU block-scaled fp8 kernel (pallas_kernels.fp8_block_mgpu): on CPU
it must lower for CUDA (Mosaic GPU's layout inference runs in Python) and match float64 in
Mosaic GPU's interpreter; on the GPU (marked) it must match float64 at a real size."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from float64_bound import (GPU_ACC_RTOL_FP8, assert_within_bound,
                           block_w8a8_float64 as _float64, block_w8a8_operands as _operands)
from interpreter_races import run_checking_races
from pallas_kernels.fp8_block_mgpu import fp8_block_matmul_mgpu
from pallas_kernels.mgpu_common import tile_index

# fp8 MMAs accumulate inside the tensor core with ~14 significant bits per 128-K block (as the
# Triton block kernel); the interpreter sums in float32.
GPU_ACC_RTOL = GPU_ACC_RTOL_FP8
CPU_ACC_RTOL = 1e-5


@pytest.mark.parametrize("blocks,group_m,programs", [(1, 1, None), (2, 1, None), (2, 2, None),
                                                     (2, 2, 4)])
@pytest.mark.parametrize("m,out_dtype", [(300, jnp.float32), (1, jnp.bfloat16)])
def test_interpreter_matches_float64(rng, m, out_dtype, blocks, group_m, programs):
    """Partial M tile (300 -> 384 rows: a partial tile group at group_m=2; 1 -> 128), two N
    tiles, four K-blocks whose scales differ; one or two K-blocks per pipeline step; a
    persistent grid of 4 CTAs over the 6 (or 2) tiles: some CTAs run two tiles, some none."""
    xq, xs, w, ws = _operands(rng, m, 256, 512)
    f = jax.jit(lambda *a: fp8_block_matmul_mgpu(*a, out_dtype=out_dtype, interpret=True,
                                                 blocks_per_step=blocks, group_m=group_m,
                                                 programs=programs))
    y = f(xq, xs, w, ws)
    assert y.dtype == out_dtype
    ref, bound = _float64(xq, xs, w, ws)
    assert_within_bound(y, ref, bound, CPU_ACC_RTOL, out_dtype)


@pytest.mark.parametrize("m_tiles,n_tiles,group_m", [(3, 5, 2), (4, 3, 8), (5, 2, 1), (1, 1, 4)])
def test_tile_order_covers_every_tile_once(m_tiles, n_tiles, group_m):
    tiles = [tuple(int(v) for v in tile_index(jnp.int32(t), m_tiles, n_tiles, group_m))
             for t in range(m_tiles * n_tiles)]
    assert sorted(tiles) == [(i, j) for i in range(m_tiles) for j in range(n_tiles)]
    assert [j for i, j in tiles[:min(group_m, m_tiles)]] == [0] * min(group_m, m_tiles)


@pytest.mark.parametrize("blocks", [1, 2])
def test_interpreter_finds_no_races(rng, blocks):
    """The interpreter's happens-before race detector over the TMA / wgmma / SMEM traffic (it
    reports a race when the epilogue's commit_smem is removed). No public API yet: private.
    K here gives no more pipeline steps than stages: where a stage slot is refilled (more
    steps, or the persistent grid's next tile) this jax's detector reports the compute
    warpgroups' plain `plgpu.load` reads of the scale rows as racing the refill, although each
    thread arrives on the consumed barrier with release semantics after its loads; a
    ten-line pipeline with one compute warpgroup and one load shows the same report
    (benchmarks/NOTES.md, session 5)."""
    xq, xs, w, ws = _operands(rng, 130, 256, 512)
    _, races = run_checking_races(lambda params: fp8_block_matmul_mgpu(
        xq, xs, w, ws, blocks_per_step=blocks, interpret=params))
    assert not races


@pytest.mark.parametrize("blocks,programs", [(1, None), (2, None), (2, 4)])
def test_lowers_for_cuda_on_cpu(rng, blocks, programs):
    """Mosaic GPU's lowering (layouts, transforms, TMA shapes) runs in Python: it must pass."""
    args = _operands(rng, 256, 384, 1024)
    f = jax.jit(lambda *a: fp8_block_matmul_mgpu(*a, blocks_per_step=blocks, group_m=2,
                                                 programs=programs))
    text = f.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


def test_rejects_bad_operands(rng):
    xq, xs, w, ws = _operands(rng, 8, 128, 256)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_block_matmul_mgpu(xq.astype(jnp.bfloat16), xs, w, ws)
    with pytest.raises(ValueError, match="N a multiple of 128"):
        fp8_block_matmul_mgpu(xq[:, :200], xs, w[:, :200], ws)
    with pytest.raises(ValueError, match="K of 256"):  # two K-blocks per step
        fp8_block_matmul_mgpu(xq[:, :128], xs[:, :1], w[:, :128], ws[:, :1], blocks_per_step=2)
    with pytest.raises(ValueError, match="blocks_per_step"):
        fp8_block_matmul_mgpu(xq, xs, w, ws, blocks_per_step=3)
    with pytest.raises(ValueError, match="x_scale must be"):
        fp8_block_matmul_mgpu(xq, xs[:, :1], w, ws)
    with pytest.raises(ValueError, match="group_m"):
        fp8_block_matmul_mgpu(xq, xs, w, ws, group_m=0)
    with pytest.raises(ValueError, match="programs"):
        fp8_block_matmul_mgpu(xq, xs, w, ws, programs=0)
    # K = 256: two K-blocks, one pipeline step of two -- two parts cut the K-blocks (park
    # closes inside a step), not the step
    with pytest.raises(ValueError, match="1 pipeline steps of 2 K-block"):
        fp8_block_matmul_mgpu(xq, xs, w, ws, blocks_per_step=2, k_parts=2)
    with pytest.raises(ValueError, match="2 K-blocks into equal parts, got 3"):
        fp8_block_matmul_mgpu(xq, xs, w, ws, blocks_per_step=2, k_parts=3, park=True)
    with pytest.raises(ValueError, match="park holds the sum of K parts"):
        fp8_block_matmul_mgpu(xq, xs, w, ws, park=True)


@pytest.mark.gpu
@pytest.mark.parametrize("blocks,group_m,programs", [(1, 1, None), (2, 1, None), (2, 8, None),
                                                     (2, 16, 132)])
@pytest.mark.parametrize("m", [1, 255, 4096])
def test_gpu_matches_float64(rng, m, blocks, group_m, programs):
    xq, xs, w, ws = _operands(rng, m, 2560, 7168)
    y = jax.jit(lambda *a: fp8_block_matmul_mgpu(*a, out_dtype=jnp.float32, group_m=group_m,
                                                 blocks_per_step=blocks, programs=programs))(
        xq, xs, w, ws)
    ref, bound = _float64(xq, xs, w, ws)
    assert_within_bound(y, ref, bound, GPU_ACC_RTOL, jnp.float32)
