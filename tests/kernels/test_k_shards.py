"""pallas_kernels.k_shards: config resolution for one device's K-slice of a deterministic
product (the bitwise row-parallel path; the sums themselves are checked in
tests/nn/sharding_check.py and, on GPUs, tests/models/tp_check.py)."""

import pytest

from pallas_kernels import KShardError, k_shards, w8a16_config, w8a8_config


def det_w8a16(k: int, n: int = 256):
    return w8a16_config(4, n, k, scale_kind="channel", x_dtype="bfloat16", deterministic=True)


def test_a_device_runs_its_share_of_the_unsharded_splits():
    whole = det_w8a16(2048)
    assert whole.split_k == 4  # the check below needs a split to share
    with k_shards("tp", 2):
        local = det_w8a16(1024)  # this device's K-slice
    assert local.split_k == 2
    assert (local.block_k, local.k_unroll, local.block_n) == (whole.block_k, whole.k_unroll,
                                                             whole.block_n)
    # the unsharded steps per split: (K / 2) / local splits == K / unsharded splits
    assert 1024 // local.split_k == 2048 // whole.split_k


def test_a_schedule_that_does_not_divide_over_the_devices_is_refused():
    assert det_w8a16(2048).split_k == 4
    with k_shards("tp", 8), pytest.raises(KShardError, match="multiple of 8"):
        det_w8a16(256)  # 1/8 of K=2048
    # fp8 x fp8 with K = 3 K-steps: one part
    with k_shards("tp", 2), pytest.raises(KShardError, match="1 split"):
        det_w8a8(192)


def det_w8a8(k: int, m: int = 8192):
    return w8a8_config(m, 256, k, x_scale_kind="row", w_scale_kind="channel",
                       deterministic=True)[1]


def test_fp8_x_fp8_parts_become_splits_on_a_device():
    whole = det_w8a8(2048)  # enough tiles: one program per tile, K in 8 in-program parts
    assert (whole.split_k, whole.k_parts) == (1, 8)
    assert (det_w8a8(2048, m=4).split_k, det_w8a8(2048, m=4).k_parts) == (8, 1)  # few tiles
    for m in (4, 8192):
        with k_shards("tp", 2):
            local = det_w8a8(1024, m)
        assert (local.split_k, local.k_parts) == (4, 1)  # its 4 parts, as splits


def test_only_deterministic_kernels_run_k_sliced():
    with k_shards("tp", 2), pytest.raises(KShardError, match="only deterministic"):
        w8a16_config(4, 256, 1024, scale_kind="channel", x_dtype="bfloat16",
                     deterministic=False)
    with pytest.raises(ValueError, match="count"):
        with k_shards("tp", 0):
            pass
