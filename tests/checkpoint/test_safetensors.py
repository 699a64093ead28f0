"""The safetensors reader/writer: format compatibility and corruption handling."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from vidax.checkpoint import CheckpointError, open_checkpoint, save_file

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _tensors():
    rng = np.random.default_rng(0)
    return {
        "a.weight": rng.standard_normal((3, 5)).astype(np.float32),
        "b.bias": rng.standard_normal((7,)).astype(np.float16),
        "c": rng.standard_normal((2, 2, 2)).astype(ml_dtypes.bfloat16),
        "ids": np.arange(6, dtype=np.int64).reshape(2, 3),
    }


def test_round_trip_including_bfloat16(tmp_path):
    path = tmp_path / "m.safetensors"
    tensors = _tensors()
    save_file(tensors, path, metadata={"format": "pt"})
    reader = open_checkpoint(path)
    assert set(reader) == set(tensors)
    for key, value in tensors.items():
        assert reader.dtype(key) == value.dtype
        np.testing.assert_array_equal(reader[key], value)


def test_reads_files_written_by_the_safetensors_package(tmp_path):
    path = tmp_path / "ref.safetensors"
    tensors = {k: v for k, v in _tensors().items() if v.dtype != ml_dtypes.bfloat16}
    safetensors_numpy.save_file(tensors, str(path))
    reader = open_checkpoint(path)
    for key, value in tensors.items():
        np.testing.assert_array_equal(reader[key], value)


def test_files_we_write_load_in_the_safetensors_package(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    path = tmp_path / "ours.safetensors"
    tensors = _tensors()
    save_file(tensors, path)
    loaded = load_file(str(path))
    assert loaded["c"].dtype == torch.bfloat16
    np.testing.assert_array_equal(loaded["c"].float().numpy(), tensors["c"].astype(np.float32))
    np.testing.assert_array_equal(loaded["a.weight"].numpy(), tensors["a.weight"])


def test_truncated_file_names_file_and_key(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file(_tensors(), path)
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(CheckpointError, match=r"t\.safetensors: truncated: tensor 'ids'"):
        open_checkpoint(path)


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"\x05", "truncated safetensors file"),
        (struct.pack("<Q", 10**12) + b"{}", "corrupt safetensors header length"),
        (struct.pack("<Q", 4) + b"{{{{", "corrupt safetensors header"),
    ],
)
def test_corrupt_headers(tmp_path, payload, message):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(payload)
    with pytest.raises(CheckpointError, match=message):
        open_checkpoint(path)


def test_wrong_byte_count_and_unknown_dtype(tmp_path):
    def write(header):
        raw = json.dumps(header).encode()
        path = tmp_path / "h.safetensors"
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 64)
        return path

    with pytest.raises(CheckpointError, match="has 8 bytes for shape"):
        open_checkpoint(write({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}))
    with pytest.raises(CheckpointError, match="bad header entry"):
        open_checkpoint(write({"x": {"dtype": "Q7", "shape": [4], "data_offsets": [0, 16]}}))


def test_sharded_index(tmp_path):
    tensors = _tensors()
    keys = sorted(tensors)
    shards = {"model-00001.safetensors": keys[:2], "model-00002.safetensors": keys[2:]}
    for name, names in shards.items():
        save_file({k: tensors[k] for k in names}, tmp_path / name)
    weight_map = {k: name for name, names in shards.items() for k in names}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    reader = open_checkpoint(tmp_path)  # directory with an index
    assert set(reader) == set(tensors)
    np.testing.assert_array_equal(reader["ids"], tensors["ids"])

    weight_map["ghost"] = "model-00001.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match="index lists 'ghost'"):
        open_checkpoint(tmp_path)

    weight_map.pop("ghost")
    weight_map["ids"] = "model-00003.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=r"model-00003\.safetensors"):
        open_checkpoint(tmp_path)


def test_missing_paths(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        open_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        open_checkpoint(tmp_path)
