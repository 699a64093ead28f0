"""Files written whole or not at all: weights, latent caches, cached prompt embeddings."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """Writes `path` through a temporary file beside it that then replaces it.

    A process killed mid-write leaves the previous file (or none), never a truncated one, and
    concurrent writers of one path each fill their own temporary file (the last rename wins).

    Args:
        path: the file to write.
        write: writes the content to the path it is given. That path ends with `path`'s
            suffix (numpy's `save`/`savez` append ".npy"/".npz" to any other name) and starts
            with a dot, so a glob such as `chunk_*.npz` never sees a partial file.

    Raises:
        Whatever `write` raises; the temporary file is removed first.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
