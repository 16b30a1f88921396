"""The shared safetensors reader/writer: dtypes, 0-d tensors, interop with safetensors itself."""

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

import jqlin
from jqlin.checkpoint.safetensors_io import ShardWriter, TensorStore
import ckpt_builders as cb


def _arrays(rng):
    return {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "bf16": rng.standard_normal((4,)).astype(ml_dtypes.bfloat16),
        "e4m3": rng.standard_normal((2, 8)).astype(ml_dtypes.float8_e4m3fn),
        "e8m0": np.array([0.5, 1, 2, 2 ** -127], ml_dtypes.float8_e8m0fnu),
        "u8": rng.integers(0, 255, (6, 2)).astype(np.uint8),
        "scalar": np.array(3.25, np.float32),
        "i64": np.array([320, 768], np.int64),
    }


def test_writer_reader_round_trip(tmp_path, rng):
    arrays = _arrays(rng)
    w = ShardWriter(tmp_path, max_shard_bytes=40)
    for name, arr in arrays.items():
        w.write(name, arr)
    files = w.close()
    assert len(files) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    store = TensorStore(tmp_path)
    assert sorted(store.names()) == sorted(arrays)
    for name, arr in arrays.items():
        got = store.read(name)
        assert got.dtype == arr.dtype and got.shape == arr.shape, name
        np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), arr.reshape(-1).view(np.uint8),
                                      err_msg=name)
    # files are plain safetensors: the reference parser agrees on names, shapes and dtypes
    for f in files:
        with safe_open(tmp_path / f, framework="numpy") as st:
            for name in st.keys():
                sl = st.get_slice(name)
                assert tuple(sl.get_shape()) == arrays[name].shape
                if name in ("f32", "u8", "scalar", "i64"):
                    np.testing.assert_array_equal(st.get_tensor(name), arrays[name])


def test_writer_rejects_duplicates(tmp_path):
    w = ShardWriter(tmp_path)
    w.write("a", np.zeros(2, np.float32))
    with pytest.raises(jqlin.CheckpointError, match="'a' written twice"):
        w.write("a", np.zeros(2, np.float32))


def test_mx_scales_tagged_f8_e8m0_are_accepted(tmp_path, rng):
    """Newer files may tag e8m0 scales F8_E8M0 instead of U8 (FORMATS.md sec. 1)."""
    g = cb.ct_group(cb.args(8, "group", group_size=32, scale_dtype="torch.uint8"),
                    cb.args(8, "group", dynamic=True, group_size=32, scale_dtype="torch.uint8"),
                    "mxfp8-quantized")
    expected = {}

    def prod(m, w):
        t, d = cb.mx(w, fp4=False, data_name="weight")
        expected[m] = t["weight_scale"]
        t["weight_scale"] = t["weight_scale"].view(ml_dtypes.float8_e8m0fnu)
        return t, d
    deq, _, _ = cb.build(tmp_path, rng, prod, quantization_config=cb.ct_config({"g": g}))
    ck = jqlin.load_checkpoint(tmp_path)
    assert ck.format == "compressed-tensors/mxfp8"
    for m, qw in ck.layers.items():
        assert qw.scale.dtype == np.uint8
        np.testing.assert_array_equal(np.asarray(qw.scale), expected[m])
        np.testing.assert_array_equal(np.asarray(qw.dequantize()), deq[m])
