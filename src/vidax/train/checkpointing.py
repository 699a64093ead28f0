"""Training checkpoints with orbax: the whole train state plus a JSON record of the run.

A checkpoint holds the train state pytree (parameters, optimiser state, EMA, step) and a JSON
`meta` dict (data-loader position, config). orbax writes each step to a temporary directory
and renames it when complete, so a process killed mid-save leaves the previous checkpoint
intact and `latest_step` never sees a partial one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax

# orbax (and tensorstore, ~70 MB installed) load on a Checkpointer's first use, not at import:
# `vidax train all`, `vidax generate` and `vidax eval` import this module but never save here,
# and a bare accelerator machine then needs neither package.


class Checkpointer:
    """Saves and restores (state, meta) under `<directory>`, keeping the newest `keep`.

    Args:
        directory: checkpoint root (created if missing).
        keep: how many checkpoints to keep.
        asynchronous: write in a background thread after copying to host (the next train
            steps overlap the disk write); `wait` or `close` finishes it.
    """

    def __init__(self, directory: str | os.PathLike, *, keep: int = 2, asynchronous: bool = True):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory).absolute()
        import orbax.checkpoint as ocp

        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=asynchronous
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Writes `state` (a pytree of arrays) and `meta` (JSON-serialisable) at `step`."""
        import orbax.checkpoint as ocp

        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )

    def restore(self, target: Any, step: int | None = None) -> tuple[Any, dict[str, Any], int]:
        """Restores a checkpoint into the structure, dtypes and shardings of `target`.

        Args:
            target: a pytree like the saved state (concrete or `jax.ShapeDtypeStruct`s);
                arrays come back with its shardings.
            step: which checkpoint (default: the latest).

        Returns:
            (state, meta, step).

        Raises:
            FileNotFoundError: if there is no checkpoint.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        import orbax.checkpoint as ocp

        abstract = jax.tree.map(_abstract, target)
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
            ),
        )
        return out["state"], dict(out["meta"]), step

    def wait(self) -> None:
        """Blocks until pending asynchronous saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


def _abstract(x):
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    sharding = getattr(x, "sharding", None)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
