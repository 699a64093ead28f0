"""Fixed-size per-layer KV cache: sink, persistent memory, window ring and compressed ring.

Every buffer has a static shape fixed by the `CacheLayout`, whatever the length of the video, so
a rollout compiles once and its cost per chunk is flat. Writes are `dynamic_update_slice`s into
the buffers (in place under `jit` with the cache donated or carried through a `scan`); nothing is
ever shifted or rolled. Keys are stored with the spatial part of their RoPE only: a cached
token's (h, w) never changes, but the time position of a cached frame does once the rollout
passes the horizon (see `ForcingConfig.horizon`), so the time lanes are rotated when the keys
are read, one angle per slot (`time_positions`; `vidax.forcing.attention.time_angles`).

Per-slot metadata lives beside the blocks: the absolute latent frame a slot holds (-1: empty),
its block index inside that frame (for the spatial RoPE positions) and its salience (sparse).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from vidax.models.causal import CacheLayout


@dataclasses.dataclass(frozen=True)
class KVCache:
    """The cache of every layer, stacked on a leading layer axis `L`.

    k, v: (L, b, n, slots, bs, k) keys with their spatial RoPE (rotated at (0, h, w),
      `vidax.forcing.attention.spatial_keys`) and values.
    frame: (L, b, n, slots) int32 absolute latent frame of each slot, -1 when empty.
    block: (L, b, n, slots) int32 block index of the slot inside its frame.
    salience: (L, b, n, slots) float32 running attention mass of each slot (sparse; -1 until
      the slot is first scored).
    ck, cv: (L, b, n, r, k) compressed ring of discarded blocks (mean stored key / value: a
      block's mean spatially rotated key, time-rotated on read like a slot's).
    cframe, cblock: (L, b, n, r) int32 frame (-1: empty) and block of each compressed token.
    """

    k: jax.Array
    v: jax.Array
    frame: jax.Array
    block: jax.Array
    salience: jax.Array
    ck: jax.Array
    cv: jax.Array
    cframe: jax.Array
    cblock: jax.Array

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    def layer(self, i) -> KVCache:
        """The cache of layer `i` (no layer axis); `i` may be traced."""
        return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False), self)

    def set_layer(self, i, layer: KVCache) -> KVCache:
        """A copy with layer `i` replaced (an in-place update under `jit`)."""
        return jax.tree.map(
            lambda x, y: jax.lax.dynamic_update_index_in_dim(x, y.astype(x.dtype), i, 0),
            self,
            layer,
        )

    def nbytes(self) -> int:
        """Bytes of the key/value buffers (blocks and compressed ring), metadata excluded."""
        return sum(int(x.size) * x.dtype.itemsize for x in (self.k, self.v, self.ck, self.cv))


jax.tree_util.register_dataclass(
    KVCache,
    data_fields=["k", "v", "frame", "block", "salience", "ck", "cv", "cframe", "cblock"],
    meta_fields=[],
)


def init_cache(
    layout: CacheLayout, *, num_layers: int, batch: int, num_heads: int, head_dim: int, dtype
) -> KVCache:
    """An empty cache (all slots invalid) for `layout`."""
    lead = (num_layers, batch, num_heads)
    r = layout.config.compressed_tokens
    zeros = lambda *s: jnp.zeros((*lead, *s), dtype)
    ints = lambda n, fill: jnp.full((*lead, n), fill, jnp.int32)
    return KVCache(
        k=zeros(layout.num_slots, layout.block_size, head_dim),
        v=zeros(layout.num_slots, layout.block_size, head_dim),
        frame=ints(layout.num_slots, -1),
        block=ints(layout.num_slots, 0),
        salience=jnp.full((*lead, layout.num_slots), -1.0, jnp.float32),
        ck=zeros(r, head_dim),
        cv=zeros(r, head_dim),
        cframe=ints(r, -1),
        cblock=ints(r, 0),
    )


# -- positions ------------------------------------------------------------------------------------


def time_positions(
    frame: Int[Array, "..."], chunk_start: Int[Array, ""], layout: CacheLayout
) -> Float[Array, "..."]:
    """RoPE time position of absolute latent frames while the chunk at `chunk_start` is denoised.

    Absolute until the chunk start passes the horizon R; then the chunk sits at R, a frame `age`
    frames older at `R - min(age, R - sink)` and the sink frames keep 0..sink-1. Memory blocks
    (older than the window) therefore share the band just after the sink, and every relative
    distance stays one the model was trained on.

    Args:
      frame: int absolute latent frames, any shape (-1 for empty entries: any value results).
      chunk_start: int32 scalar, first frame of the current chunk (may be traced).
      layout: the cache layout.
    """
    c = layout.config
    horizon, sink = c.horizon, c.sink_frames
    now = jnp.minimum(chunk_start, horizon)
    age = chunk_start - frame  # <= 0 for frames of the current chunk
    pos = now - jnp.minimum(age, horizon - sink)
    return jnp.where(frame < sink, frame, pos).astype(jnp.float32)


def block_lengths(block: Int[Array, "..."], layout: CacheLayout) -> Int[Array, "..."]:
    """Tokens of block `block` of a frame: `block_size`, less for a frame's partial last block."""
    bs = layout.block_size
    return jnp.minimum(bs, layout.tokens_per_frame - block * bs).astype(jnp.int32)


def slot_lengths(
    frame: Int[Array, "... m"], block: Int[Array, "... m"], layout: CacheLayout
) -> Int[Array, "... m"]:
    """Valid tokens of each slot: its block's tokens, 0 for an empty slot (`frame` -1)."""
    return jnp.where(frame >= 0, block_lengths(block, layout), 0).astype(jnp.int32)


# -- writes ---------------------------------------------------------------------------------------


def chunk_slot(chunk: Int[Array, ""], layout: CacheLayout) -> Int[Array, ""]:
    """First slot that chunk `chunk` is written to: the sink, else its place in the window ring."""
    c = layout.config
    ring = (chunk - c.sink_chunks) % c.window_chunks
    return jnp.where(
        chunk < c.sink_chunks,
        chunk * layout.chunk_blocks,
        layout.window_start + ring * layout.chunk_blocks,
    ).astype(jnp.int32)


def chunk_metadata(
    chunk: Int[Array, ""], layout: CacheLayout
) -> tuple[Int[Array, " m"], Int[Array, " m"]]:
    """(frame, block) of the `chunk_blocks` blocks of a chunk, in token order."""
    f = layout.config.chunk_frames
    per = layout.blocks_per_frame
    i = jnp.arange(f * per, dtype=jnp.int32)
    return chunk * f + i // per, i % per


def to_blocks(x: Float[Array, "b l n k"], layout: CacheLayout) -> Float[Array, "b n m bs k"]:
    """Token-major keys/values of whole frames as pool blocks, `blocks_per_frame` per frame (a
    frame's partial last block padded with zeros)."""
    b, length, n, k = x.shape
    tpf, bs, per = layout.tokens_per_frame, layout.block_size, layout.blocks_per_frame
    x = x.reshape(b, length // tpf, tpf, n, k)
    if layout.ragged:
        x = jnp.pad(x, ((0, 0), (0, 0), (0, per * bs - tpf), (0, 0), (0, 0)))
    return x.reshape(b, (length // tpf) * per, bs, n, k).transpose(0, 3, 1, 2, 4)


def write_chunk(
    cache: KVCache,
    k: Float[Array, "b l n k"],
    v: Float[Array, "b l n k"],
    chunk: Int[Array, ""],
    layout: CacheLayout,
    *,
    mass: Float[Array, "b n slots"] | None = None,
) -> KVCache:
    """Writes a finished chunk (keys, values) into one layer's cache; updates the memory.

    Dense: the chunk overwrites its sink or ring slots (evicting chunk `c - window_chunks`).
    Sparse, in addition: the salience of every slot is updated with this chunk's attention mass
    `mass`, and the evicted blocks compete with the persistent memory: the `memory_blocks` most
    salient of (memory + evicted) stay, the rest are mean-pooled into the compressed ring. With
    a bounded memory (`memory_frames`), blocks beyond its reach from the next chunk are dropped
    from the memory and the compressed ring first.

    Args:
      cache: one layer's cache (no layer axis).
      k, v: (b, l, n, k) keys with their spatial RoPE (`spatial_keys`) and values of the chunk
        (l = `chunk_tokens`).
      chunk: int32 scalar chunk index (may be traced).
      layout: the cache layout.
      mass: (b, n, slots) attention mass the chunk's queries put on each cache slot (sparse).
    """
    c = layout.config
    if k.shape != v.shape or k.ndim != 4 or k.shape[1] != layout.chunk_tokens:
        raise ValueError(
            f"a chunk has {layout.chunk_tokens} tokens: expected keys/values (b, "
            f"{layout.chunk_tokens}, n, k), got {k.shape} and {v.shape}"
        )
    new_k, new_v = to_blocks(k, layout), to_blocks(v, layout)
    b, n = new_k.shape[:2]
    frames, blocks = chunk_metadata(chunk, layout)
    start = chunk_slot(chunk, layout)
    m = layout.chunk_blocks

    if c.sparse:
        salience = cache.salience
        if mass is not None:
            # A block's first observation sets its salience (-1 marks "never scored"), so new
            # blocks compete with long-kept ones on their mass, not on the age of their average.
            ema = c.salience_decay * salience + (1 - c.salience_decay) * mass
            salience = jnp.where(salience < 0, mass, ema)
        cache = dataclasses.replace(cache, salience=salience)
        cache = _update_memory(cache, start, chunk, layout)

    def put(buf, new, axis=2):
        idx = [0] * buf.ndim
        idx[axis] = start
        return jax.lax.dynamic_update_slice(buf, new.astype(buf.dtype), idx)

    meta = lambda x: jnp.broadcast_to(x, (b, n, m))
    return dataclasses.replace(
        cache,
        k=put(cache.k, new_k),
        v=put(cache.v, new_v),
        frame=put(cache.frame, meta(frames)),
        block=put(cache.block, meta(blocks)),
        salience=put(cache.salience, jnp.full((b, n, m), -1.0, jnp.float32)),
    )


def _update_memory(cache: KVCache, start, chunk, layout: CacheLayout) -> KVCache:
    """Keeps the most salient of (memory + blocks evicted at `start`); compresses the rest."""
    c = layout.config
    m, p = layout.chunk_blocks, layout.memory_slots
    take = lambda x: jax.lax.dynamic_slice_in_dim(x, start, m, axis=2)
    mem = lambda x: x[:, :, layout.memory_start : layout.memory_start + p]
    # Evicted blocks: what the ring slot held, if it held a window frame (never the sink).
    ev_frame = take(cache.frame)
    evicting = chunk >= c.sink_chunks
    ev_frame = jnp.where(evicting & (ev_frame >= c.sink_frames), ev_frame, -1)
    mem_frame = mem(cache.frame)
    if c.memory_frames:
        # Out of reach of the next chunk: dropped (treated as empty), never compressed.
        oldest = (chunk + 1) * c.chunk_frames - c.window_frames - c.memory_frames
        ev_frame, mem_frame = (jnp.where(f < oldest, -1, f) for f in (ev_frame, mem_frame))
        cache = dataclasses.replace(
            cache, cframe=jnp.where(cache.cframe < oldest, -1, cache.cframe)
        )
    cand = {
        "k": jnp.concatenate([mem(cache.k), take(cache.k)], axis=2),
        "v": jnp.concatenate([mem(cache.v), take(cache.v)], axis=2),
        "frame": jnp.concatenate([mem_frame, ev_frame], axis=2),
        "block": jnp.concatenate([mem(cache.block), take(cache.block)], axis=2),
        "salience": jnp.concatenate([mem(cache.salience), take(cache.salience)], axis=2),
    }
    score = jnp.where(cand["frame"] >= 0, cand["salience"], -jnp.inf)
    # Stable descending order: ties keep memory blocks before evicted ones.
    order = jnp.argsort(-score, axis=-1, stable=True)
    gather = lambda x, idx: jnp.take_along_axis(
        x, idx.reshape(*idx.shape, *([1] * (x.ndim - 3))), 2
    )
    keep, drop = order[..., :p], order[..., p:]

    def put_mem(buf, new):
        return buf.at[:, :, layout.memory_start : layout.memory_start + p].set(new)

    cache = dataclasses.replace(
        cache,
        k=put_mem(cache.k, gather(cand["k"], keep)),
        v=put_mem(cache.v, gather(cand["v"], keep)),
        frame=put_mem(cache.frame, gather(cand["frame"], keep)),
        block=put_mem(cache.block, gather(cand["block"], keep)),
        salience=put_mem(cache.salience, gather(cand["salience"], keep)),
    )
    r = c.compressed_tokens
    if r == 0:
        return cache
    # The losers (exactly one chunk's worth of candidates) become compressed tokens.
    lost_frame = gather(cand["frame"], drop)
    # Mean over a block's tokens (a partial block's padding is zeros: sum / its length).
    lost_len = block_lengths(gather(cand["block"], drop), layout).astype(jnp.float32)[..., None]
    mean = lambda x: (gather(x, drop).astype(jnp.float32).sum(axis=-2) / lost_len).astype(x.dtype)
    evictions = jnp.maximum(chunk - c.sink_chunks - c.window_chunks, 0)
    slots = (evictions * m + jnp.arange(m)) % r
    valid = lost_frame >= 0
    # An empty loser (early in the rollout) leaves the ring entry it would overwrite untouched.
    old = lambda x: x[:, :, slots]
    pick = lambda new, x: jnp.where(valid.reshape(*valid.shape, *([1] * (x.ndim - 3))), new, old(x))
    return dataclasses.replace(
        cache,
        ck=cache.ck.at[:, :, slots].set(pick(mean(cand["k"]), cache.ck)),
        cv=cache.cv.at[:, :, slots].set(pick(mean(cand["v"]), cache.cv)),
        cframe=cache.cframe.at[:, :, slots].set(jnp.where(valid, lost_frame, old(cache.cframe))),
        cblock=cache.cblock.at[:, :, slots].set(
            jnp.where(valid, gather(cand["block"], drop), old(cache.cblock))
        ),
    )
