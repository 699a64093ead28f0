"""Atomic writes: the file is replaced whole, and a failed write leaves the old one alone."""

import numpy as np
import pytest

from vidax.checkpoint import write_atomic


def test_replaces_the_file_whole_through_numpy(tmp_path):
    path = tmp_path / "chunk_0000.npz"
    path.write_bytes(b"old")
    # numpy appends ".npz" to a name without it: the temporary name must keep the suffix.
    write_atomic(path, lambda tmp: np.savez(tmp, x=np.arange(3)))
    np.testing.assert_array_equal(np.load(path)["x"], np.arange(3))
    assert [p.name for p in tmp_path.iterdir()] == ["chunk_0000.npz"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "weights.safetensors"
    path.write_bytes(b"old")
    seen = []

    def write(tmp):
        seen.append(tmp)
        assert tmp.parent == tmp_path and tmp.name.startswith(".")  # hidden from chunk_* globs
        tmp.write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, write)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["weights.safetensors"]
    assert seen and not seen[0].exists()
