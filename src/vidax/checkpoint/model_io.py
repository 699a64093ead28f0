"""Building nnx models straight from checkpoints, and saving them back."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TypeVar

import numpy as np
from flax import nnx
from jax.sharding import Mesh

from vidax.checkpoint.keymap import Rule, export_state, load_state
from vidax.checkpoint.safetensors import open_checkpoint, save_file
from vidax.sharding import param_shardings

M = TypeVar("M", bound=nnx.Module)


def load_model(
    build: Callable[[], M],
    path: str | os.PathLike,
    rules: Iterable[Rule],
    *,
    mesh: Mesh | None = None,
    strategy=None,
    ignore: Iterable[str] = (),
) -> M:
    """Builds `build()` abstractly (no random init) and fills it from the checkpoint at `path`.

    With `mesh`, every parameter is placed directly with the sharding its logical axes get
    under `strategy` (see `vidax.sharding`), so no device ever holds the whole model.
    """
    abstract = nnx.eval_shape(build)
    graphdef, abstract_state = nnx.split(abstract)
    shardings = None
    if mesh is not None:
        shardings = param_shardings(abstract_state, mesh, strategy or "fsdp")
    state = load_state(
        abstract_state, open_checkpoint(path), rules, shardings=shardings, ignore=ignore
    )
    return nnx.merge(graphdef, state)


def save_model(
    model: nnx.Module,
    path: str | os.PathLike,
    rules: Iterable[Rule],
    *,
    dtype: np.dtype | None = None,
    metadata: dict | None = None,
) -> None:
    """Writes `model`'s parameters in the checkpoint layout described by `rules`."""
    save_file(export_state(nnx.state(model, nnx.Param), rules, dtype=dtype), path, metadata)
