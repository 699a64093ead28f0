"""Reading safetensors checkpoints tensor by tensor, single-file or sharded with an index.

Tensors are read one at a time on demand, so loading a model holds at most one tensor (plus
its converted copy) in host memory besides the placed parameters. We read and write the (documented, tiny) format ourselves because the
`safetensors` package's numpy backend cannot handle bfloat16; tests check both directions
against that package.

Every structural problem (missing file, truncated data, overlapping offsets, unknown dtype,
index naming absent files) is a `CheckpointError` that names the file and key.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_MAX_HEADER = 100 * 1024 * 1024


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, truncated or does not match the model."""


class _File:
    def __init__(self, path: Path):
        self.path = path
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                raw = f.read(8)
                if len(raw) < 8:
                    raise CheckpointError(f"{path}: truncated safetensors file (no header)")
                (n,) = struct.unpack("<Q", raw)
                if n > min(_MAX_HEADER, size - 8):
                    raise CheckpointError(f"{path}: corrupt safetensors header length {n}")
                header = json.loads(f.read(n))
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint file not found: {path}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: corrupt safetensors header ({e})") from None
        self.metadata = header.pop("__metadata__", None) or {}
        self._data_start = 8 + n
        data_size = size - self._data_start
        self.entries: dict[str, tuple[np.dtype, tuple[int, ...], int, int]] = {}
        spans = []
        for key, info in header.items():
            try:
                dtype = _DTYPES[info["dtype"]]
                shape = tuple(int(s) for s in info["shape"])
                start, end = (int(o) for o in info["data_offsets"])
            except KeyError as e:
                raise CheckpointError(
                    f"{path}: tensor {key!r} has a bad header entry ({e})"
                ) from None
            if end - start != math.prod(shape) * dtype.itemsize:
                raise CheckpointError(
                    f"{path}: tensor {key!r} has {end - start} bytes for shape {shape} {dtype}"
                )
            if end > data_size:
                raise CheckpointError(
                    f"{path}: truncated: tensor {key!r} ends at byte {end} of {data_size}"
                )
            spans.append((start, end, key))
            self.entries[key] = (dtype, shape, start, end)
        spans.sort()
        for (_, e0, k0), (s1, _, k1) in itertools.pairwise(spans):
            if s1 < e0:
                raise CheckpointError(f"{path}: tensors {k0!r} and {k1!r} overlap")

    def read(self, key: str) -> np.ndarray:
        # A plain read of just this tensor: unlike a memory map, nothing of the file stays
        # resident once the caller drops the array, so loading peaks at one tensor.
        dtype, shape, start, end = self.entries[key]
        with open(self.path, "rb") as f:
            f.seek(self._data_start + start)
            data = np.fromfile(f, dtype=np.uint8, count=end - start)
        if data.size != end - start:
            raise CheckpointError(f"{self.path}: truncated while reading tensor {key!r}")
        return data.view(dtype).reshape(shape)


class CheckpointReader(Mapping[str, np.ndarray]):
    """Read-only mapping key -> tensor (read on access) over one or more safetensors files."""

    def __init__(self, files: list[Path]):
        self.files = [_File(p) for p in files]
        self._where: dict[str, _File] = {}
        for f in self.files:
            for key in f.entries:
                if key in self._where:
                    raise CheckpointError(
                        f"tensor {key!r} appears in both {self._where[key].path} and {f.path}"
                    )
                self._where[key] = f

    def __getitem__(self, key: str) -> np.ndarray:
        try:
            return self._where[key].read(key)
        except KeyError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def shape(self, key: str) -> tuple[int, ...]:
        return self._where[key].entries[key][1]

    def dtype(self, key: str) -> np.dtype:
        return self._where[key].entries[key][0]

    def path_of(self, key: str) -> Path:
        return self._where[key].path


def open_checkpoint(path: str | os.PathLike) -> CheckpointReader:
    """Opens a safetensors file, a `*.safetensors.index.json`, or a directory holding either."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.is_dir():
        indexes = sorted(path.glob("*.safetensors.index.json"))
        singles = sorted(path.glob("*.safetensors"))
        if len(indexes) == 1:
            path = indexes[0]
        elif len(indexes) > 1:
            raise CheckpointError(f"{path}: several index files {[p.name for p in indexes]}")
        elif len(singles) == 1:
            return CheckpointReader(singles)
        elif not singles:
            raise CheckpointError(f"{path}: no *.safetensors file or index in this directory")
        else:
            raise CheckpointError(
                f"{path}: {len(singles)} safetensors files but no *.safetensors.index.json"
            )
    if path.name.endswith(".json"):
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{path}: not a safetensors index ({e})") from None
        files = sorted({path.parent / name for name in weight_map.values()})
        reader = CheckpointReader(files)
        for key, name in weight_map.items():
            if key not in reader:
                raise CheckpointError(f"{path}: index lists {key!r} in {name} but it is not there")
        return reader
    return CheckpointReader([path])


def save_file(
    tensors: Mapping[str, np.ndarray], path: str | os.PathLike, metadata: dict | None = None
) -> None:
    """Writes numpy tensors (bfloat16 included) to one safetensors file, keys sorted."""
    names = {dtype: name for name, dtype in _DTYPES.items()}
    header: dict = {"__metadata__": {k: str(v) for k, v in (metadata or {}).items()}}
    arrays, offset = [], 0
    for key in sorted(tensors):
        value = np.ascontiguousarray(tensors[key])
        if value.dtype not in names:
            raise CheckpointError(f"cannot save tensor {key!r} of dtype {value.dtype}")
        header[key] = {
            "dtype": names[value.dtype],
            "shape": list(value.shape),
            "data_offsets": [offset, offset + value.nbytes],
        }
        arrays.append(value)
        offset += value.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format aligns the data section to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for value in arrays:
            f.write(value.tobytes())
