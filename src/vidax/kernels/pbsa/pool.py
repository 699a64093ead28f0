"""The KV block pool beside the kernel: in-place block writes, gathers and block means.

A memory update of Sparse Forcing is index bookkeeping (which slots hold what) plus a scatter of
new blocks into free slots. `update_pool` is that scatter; under
`jax.jit(update_pool, donate_argnums=(0, 1))` (or inside a jitted step whose pool arguments are
donated) XLA writes the blocks in place instead of copying the pool, which replaces the full-cache
roll of a rolling KV cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from vidax.kernels.pbsa.index import _concrete, full_slot_len, iota_below


def _slots_3d(slots: Array, b: int, n_kv: int, name: str = "slots") -> Array:
    """`(m,)`, `(b, m)` or `(b, n_kv, m)` slot lists as int32 `(b, n_kv, m)`."""
    if not jnp.issubdtype(slots.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array, got {slots.dtype}")
    slots = slots.astype(jnp.int32)
    if slots.ndim == 1:
        slots = slots[None, None]
    elif slots.ndim == 2:
        if slots.shape[0] != b:
            raise ValueError(f"{name} of shape (b, m) must have b={b}, got {slots.shape}")
        slots = slots[:, None]
    elif slots.ndim != 3 or slots.shape[:2] != (b, n_kv):
        raise ValueError(f"{name} must be (m,), (b, m) or (b, n_kv, m), got {slots.shape}")
    return jnp.broadcast_to(slots, (b, n_kv, slots.shape[-1]))


def update_pool(
    pool_k: Float[Array, "b n_kv slots bs k"],
    pool_v: Float[Array, "b n_kv slots bs k"],
    new_k: Float[Array, "b n_kv m bs k"],
    new_v: Float[Array, "b n_kv m bs k"],
    slots: Int[Array, " m"] | Int[Array, "b m"] | Int[Array, "b n_kv m"],
    *,
    slot_len: Int[Array, "b n_kv slots"] | None = None,
    new_len: Int[Array, "b n_kv m"] | None = None,
):
    """Writes `m` new blocks into the given pool slots (everything else is kept).

    Call it under `jax.jit(update_pool, donate_argnums=(0, 1))` (donating `slot_len` too when
    given) so the pool is updated in place rather than copied.

    Args:
        pool_k: key pool `(b, n_kv, num_slots, block_size, k)`.
        pool_v: value pool, same shape.
        new_k: new key blocks `(b, n_kv, m, block_size, k)`.
        new_v: new value blocks, same shape.
        slots: int target slots, shared `(m,)`, per batch element `(b, m)` or per KV head
            `(b, n_kv, m)`; distinct within each `(b, n_kv)`.
        slot_len: optional int `(b, n_kv, num_slots)` (or `(b, num_slots)`) valid tokens per slot
            to update alongside.
        new_len: valid tokens of the new blocks, broadcastable to `(b, n_kv, m)`; default full.

    Returns:
        `(pool_k, pool_v)`, or `(pool_k, pool_v, slot_len)` with `slot_len` int32
        `(b, n_kv, num_slots)` when `slot_len` is given.

    Raises:
        ValueError: for mismatched shapes or dtypes; for concrete `slots` out of range or
            repeated within a `(b, n_kv)` (a repeated target makes the write order undefined).
            Under `jit` out-of-range slots are dropped.
    """
    if pool_k.ndim != 5 or pool_k.shape != pool_v.shape:
        raise ValueError(f"pools must be equal 5-D arrays, got {pool_k.shape} and {pool_v.shape}")
    b, n_kv, num_slots, block_size, k = pool_k.shape
    if new_k.shape != new_v.shape or new_k.ndim != 5:
        raise ValueError(f"new blocks must be equal 5-D arrays, got {new_k.shape}, {new_v.shape}")
    m = new_k.shape[2]
    if new_k.shape != (b, n_kv, m, block_size, k):
        raise ValueError(
            f"new blocks {new_k.shape} do not fit pool {pool_k.shape}: expected "
            f"{(b, n_kv, m, block_size, k)}"
        )
    if new_k.dtype != pool_k.dtype or new_v.dtype != pool_v.dtype:
        raise ValueError(
            f"new blocks ({new_k.dtype}, {new_v.dtype}) must match the pool dtype {pool_k.dtype}"
        )
    slots = _slots_3d(slots, b, n_kv)
    if slots.shape[-1] != m:
        raise ValueError(f"{slots.shape[-1]} slots for {m} new blocks")
    concrete = _concrete(slots)
    if concrete is not None and concrete.size:
        if concrete.min() < 0 or concrete.max() >= num_slots:
            raise ValueError(f"slots must lie in [0, num_slots={num_slots})")
        srt = np.sort(concrete, axis=-1)
        if (srt[..., 1:] == srt[..., :-1]).any():
            raise ValueError("slots must be distinct within each (batch, KV head)")
    bi = jnp.arange(b)[:, None, None]
    hi = jnp.arange(n_kv)[None, :, None]
    pool_k = pool_k.at[bi, hi, slots].set(new_k, mode="drop")
    pool_v = pool_v.at[bi, hi, slots].set(new_v, mode="drop")
    if slot_len is None:
        return pool_k, pool_v
    lens = full_slot_len(slot_len, b=b, n_kv=n_kv, num_slots=num_slots, block_size=block_size)
    if lens.shape != (b, n_kv, num_slots):
        raise ValueError(f"slot_len shape {slot_len.shape} does not match the pool")
    fill = jnp.full((b, n_kv, m), block_size, jnp.int32)
    if new_len is not None:
        fill = jnp.broadcast_to(jnp.asarray(new_len, jnp.int32), (b, n_kv, m))
    return pool_k, pool_v, lens.at[bi, hi, slots].set(fill, mode="drop")


def gather_blocks(
    pool: Float[Array, "b n_kv slots bs k"],
    slots: Int[Array, " m"] | Int[Array, "b m"] | Int[Array, "b n_kv m"],
) -> Float[Array, "b n_kv m bs k"]:
    """The blocks at `slots` (shared `(m,)`, per batch `(b, m)` or per head `(b, n_kv, m)`).

    For compressing evicted blocks or scoring them. Out-of-range slots raise when concrete; under
    `jit` they are clamped into range.
    """
    if pool.ndim != 5:
        raise ValueError(f"pool must be (b, n_kv, num_slots, block_size, k), got {pool.shape}")
    b, n_kv, num_slots = pool.shape[:3]
    slots = _slots_3d(slots, b, n_kv)
    concrete = _concrete(slots)
    if (
        concrete is not None
        and concrete.size
        and (concrete.min() < 0 or concrete.max() >= num_slots)
    ):
        raise ValueError(f"slots must lie in [0, num_slots={num_slots})")
    return jax.vmap(jax.vmap(lambda p, s: jnp.take(p, s, axis=0, mode="clip")))(pool, slots)


def block_means(
    pool: Float[Array, "b n_kv slots bs k"],
    *,
    slot_len: Int[Array, "b n_kv slots"] | None = None,
    dtype=jnp.float32,
) -> Float[Array, "b n_kv slots k"]:
    """Mean key (or value) of every pool block over its valid tokens, accumulated in float32.

    The block summary K̄ used to score blocks (`softmax(q̄ K̄ᵀ)`) and to compress them. An empty
    slot (`slot_len == 0`) has mean 0.

    Args:
        pool: `(b, n_kv, num_slots, block_size, k)`.
        slot_len: optional int `(b, n_kv, num_slots)` or `(b, num_slots)` valid tokens per slot.
        dtype: output dtype (float32 by default, the precision scoring wants).
    """
    if pool.ndim != 5:
        raise ValueError(f"pool must be (b, n_kv, num_slots, block_size, k), got {pool.shape}")
    b, n_kv, num_slots, block_size, _ = pool.shape
    x = pool.astype(jnp.float32)
    if slot_len is None:
        return x.mean(axis=-2).astype(dtype)
    if slot_len.shape not in ((b, n_kv, num_slots), (b, num_slots)):
        raise ValueError(f"slot_len shape {slot_len.shape} does not match the pool {pool.shape}")
    lens = full_slot_len(slot_len, b=b, n_kv=n_kv, num_slots=num_slots, block_size=block_size)
    tok = iota_below(block_size, lens).astype(jnp.float32)
    total = jnp.einsum("bhst,bhstk->bhsk", tok, x)
    count = jnp.maximum(lens, 1).astype(jnp.float32)[..., None]
    return (total / count).astype(dtype)
