"""An infinite, seeded, resumable batch iterator over `shapes` clips, and mesh placement.

Clip i of a run is a pure function of (seed, i): `clip_at(config, seed, i)`. Batch `step` holds
clips [step * b, (step + 1) * b), so the iterator's whole state is (seed, step): save it with
the model checkpoint and a resumed run sees exactly the batches it would have seen, with no clip
lost or repeated. In a multi-process job every process holds the same (seed, step) and renders
only the rows of the global batch that its devices hold.

    loader = ClipLoader(LoaderConfig(batch_size=8, num_frames=17), seed=0)
    batch = next(loader)                   # {"video": (8, 17, 64, 64, 3), "caption": [...], ...}
    state = loader.get_state()             # {"seed": 0, "step": 1}
    video = shard_batch(batch, mesh)["video"]   # NamedSharding(mesh, P(("data", "fsdp")))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vidax.data.shapes import ClipSpec, caption, render, sample_spec

# The mesh axes a batch is split over (those present in the mesh are used, in this order).
BATCH_AXES = ("data", "fsdp")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """What the loader renders.

    Attributes:
        batch_size: global batch size b (all processes together).
        num_frames, height, width: clip size t, h, w.
        min_objects, max_objects, pan_probability: passed to `sample_spec`.
    """

    batch_size: int
    num_frames: int = 17
    height: int = 64
    width: int = 64
    min_objects: int = 1
    max_objects: int = 3
    pan_probability: float = 0.3

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {self.num_frames}")
        if min(self.height, self.width) < 16:
            raise ValueError(f"frames must be at least 16x16, got {self.height}x{self.width}")
        if not 1 <= self.min_objects <= self.max_objects <= 3:
            raise ValueError(
                f"need 1 <= min_objects <= max_objects <= 3, got "
                f"{self.min_objects}, {self.max_objects}"
            )
        if not 0.0 <= self.pan_probability <= 1.0:
            raise ValueError(f"pan_probability must be in [0, 1], got {self.pan_probability}")


def clip_at(config: LoaderConfig, seed: int, index: int) -> tuple[ClipSpec, np.ndarray]:
    """Clip `index` of the stream `seed`: its spec and frames (t, h, w, 3) in [-1, 1].

    Random access (a pure function of its arguments), so it also serves as a
    `grain.MapDataset` source should prefetching in worker processes ever be needed.
    """
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be >= 0, got {seed}, {index}")
    spec = sample_spec(
        np.random.default_rng([seed, index]),
        min_objects=config.min_objects,
        max_objects=config.max_objects,
        pan_probability=config.pan_probability,
    )
    frames, _ = render(spec, config.num_frames, config.height, config.width)
    return spec, frames


def batch_rows(mesh: Mesh | None, batch_size: int) -> range:
    """The rows of the global batch whose data this process's devices hold.

    All rows without a mesh or in a single-process job. With several processes, the rows of
    the shards of `NamedSharding(mesh, P(BATCH_AXES))` on this process's devices, which must
    be one contiguous block (true for meshes built by `jax.make_mesh`).

    Raises:
        ValueError: if the batch does not split evenly over the batch axes, or the process's
            rows are not contiguous.
    """
    if mesh is None:
        return range(batch_size)
    sharding = batch_sharding(mesh, 1)
    shards = int(np.prod([mesh.shape[a] for a in BATCH_AXES if a in mesh.shape]))
    if batch_size % shards:
        raise ValueError(f"batch size {batch_size} does not split over {shards} batch shards")
    if jax.process_count() == 1:
        return range(batch_size)
    index_map = sharding.addressable_devices_indices_map((batch_size,))
    # (A device holding no part of the array maps to None.)
    rows = sorted(
        {r for idx in index_map.values() if idx is not None for r in range(batch_size)[idx[0]]}
    )
    if rows != list(range(rows[0], rows[-1] + 1)):
        raise ValueError(f"process {jax.process_index()} holds non-contiguous batch rows")
    return range(rows[0], rows[-1] + 1)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Shards dim 0 of a rank-`ndim` array over the mesh's batch axes ("data", "fsdp")."""
    axes = tuple(a for a in BATCH_AXES if a in mesh.shape)
    spec = PartitionSpec(axes if axes else None, *([None] * (ndim - 1)))
    return NamedSharding(mesh, spec)


class ClipLoader(Iterator[dict[str, Any]]):
    """Infinite iterator of batches of rendered clips; resumable from (seed, step).

    Each batch is a dict with
      - "video": (b', t, h, w, 3) float32 in [-1, 1],
      - "caption": list of b' captions,
      - "spec": list of b' `ClipSpec`s (ground truth for metrics),
      - "index": (b',) int64 global clip indices,
    where b' is the global batch size, or this process's rows of it when a `mesh` is given in a
    multi-process job (see `batch_rows`; pass the batch to `shard_batch` to assemble it).
    """

    def __init__(
        self, config: LoaderConfig, *, seed: int = 0, step: int = 0, mesh: Mesh | None = None
    ):
        if seed < 0 or step < 0:
            raise ValueError(f"seed and step must be >= 0, got {seed}, {step}")
        self.config = config
        self.seed = seed
        self.step = step
        self.rows = batch_rows(mesh, config.batch_size)

    def __next__(self) -> dict[str, Any]:
        first = self.step * self.config.batch_size
        indices = [first + r for r in self.rows]
        specs, videos = zip(*(clip_at(self.config, self.seed, i) for i in indices), strict=True)
        self.step += 1
        return {
            "video": np.stack(videos),
            "caption": [caption(s) for s in specs],
            "spec": list(specs),
            "index": np.asarray(indices, np.int64),
        }

    def get_state(self) -> dict[str, int]:
        """The iterator position, {"seed", "step"}: plain ints, to store with a checkpoint."""
        return {"seed": self.seed, "step": self.step}

    def set_state(self, state: dict[str, int]) -> None:
        """Resumes from `get_state()`: the next batch is the one that followed it."""
        seed, step = int(state["seed"]), int(state["step"])
        if seed < 0 or step < 0:
            raise ValueError(f"seed and step must be >= 0, got {state}")
        self.seed, self.step = seed, step


def shard_batch(batch: dict[str, Any], mesh: Mesh) -> dict[str, Any]:
    """Places a host batch on `mesh`, dim 0 split over the batch axes ("data", "fsdp").

    Array entries become global `jax.Array`s built from this process's rows (all rows in a
    single-process job); other entries (captions, specs) are returned unchanged.

    Args:
        batch: a `ClipLoader` batch (from a loader built with the same `mesh`).
        mesh: the device mesh; absent batch axes are ignored.

    Raises:
        ValueError: if the global batch does not split evenly over the batch shards.
    """
    out = dict(batch)
    local = len(batch["caption"])
    global_size = local * jax.process_count()
    shards = int(np.prod([mesh.shape[a] for a in BATCH_AXES if a in mesh.shape]))
    if global_size % shards:
        raise ValueError(f"batch of {global_size} does not split over {shards} batch shards")
    for key, value in batch.items():
        if isinstance(value, np.ndarray):
            sharding = batch_sharding(mesh, value.ndim)
            shape = (global_size, *value.shape[1:])
            out[key] = jax.make_array_from_process_local_data(sharding, value, shape)
    return out
