"""Selection lists for persistent block-sparse attention: validation, canonical form, dense mask.

Index format (shared by `pbsa_reference` and the `pbsa` kernel):

- The KV cache of one layer is a **pool** of `num_slots` blocks of `block_size` tokens per batch
  element and KV head: `pool_k`, `pool_v` of shape `(b, n_kv, num_slots, block_size, k)`.
- Queries `(b, n, lq, k)` are cut into `num_q_tiles = ceil(lq / block_q)` tiles of `block_q`
  rows (the last tile may be partial). All `n // n_kv` query heads of a KV head share its lists.
- `block_idx` int32 `(b, n_kv, num_q_tiles, max_sel)` lists pool slots per query tile and
  `block_cnt` int32 `(b, n_kv, num_q_tiles)` says how many leading entries are valid. Entries
  at or after `block_cnt` are ignored whatever their value.
- The selection is a **set**: a slot listed twice is attended once (model code naturally unions
  forced blocks with top-k picks, which overlap). Valid entries outside `[0, num_slots)` raise
  `ValueError` when the lists are concrete; under `jit` they are dropped.
- `slot_len` int32 `(b, n_kv, num_slots)` or `(b, num_slots)` (optional): valid tokens at the
  start of each slot, in `[0, block_size]`; the rest of the slot is padding and masked. `None`
  means every slot is full.
- A query row whose selection holds no valid token gets output 0 and log-sum-exp `-inf`.

`canonicalize_selection` turns any valid lists into the form the kernel consumes: unique slots in
ascending order (which also makes the kernel's reads of the pool monotone), padded with the last
valid slot, and the count of unique slots.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Int


@dataclasses.dataclass(frozen=True)
class PbsaDims:
    """Static sizes of one `pbsa` call, derived and checked by `check_inputs`."""

    b: int
    n: int
    n_kv: int
    lq: int
    k: int
    num_slots: int
    block_size: int
    block_q: int
    num_q_tiles: int
    max_sel: int

    @property
    def groups(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.n // self.n_kv


def iota_below(n: int, bound: Int[Array, "..."]) -> Bool[Array, "... n"]:
    """`arange(n) < bound[..., None]`, the iota's rank promoted explicitly: which of `n`
    positions fall below each bound."""
    return jnp.arange(n, dtype=jnp.int32).reshape((1,) * bound.ndim + (n,)) < bound[..., None]


def _concrete(x) -> np.ndarray | None:
    """`x` as a NumPy array when its value is known at trace time, else None."""
    if isinstance(x, jax.core.Tracer):
        return None
    try:
        return np.asarray(x)
    except jax.errors.ConcretizationTypeError:
        return None


def check_key_angles(key_angles, d: PbsaDims) -> None:
    """Checks `pbsa`'s optional per-slot RoPE angles: float `(b, n_kv, num_slots, k/2)`."""
    if key_angles is None:
        return
    want = (d.b, d.n_kv, d.num_slots, d.k // 2)
    if d.k % 2 or key_angles.shape != want:
        raise ValueError(
            f"key_angles must be (b, n_kv, num_slots, k/2) = {want} with k even, got "
            f"{key_angles.shape} for k={d.k}"
        )
    if not jnp.issubdtype(key_angles.dtype, jnp.floating):
        raise ValueError(f"key_angles must be a float array, got {key_angles.dtype}")


def check_inputs(
    q, pool_k, pool_v, block_idx, block_cnt, *, block_q: int | None, slot_len
) -> PbsaDims:
    """Checks shapes and dtypes of a `pbsa` call (and values when concrete); returns the sizes.

    Raises:
        ValueError: on mismatched shapes, non-integer lists, a `block_q` that does not match the
            lists, `block_cnt` outside `[0, max_sel]`, valid entries outside `[0, num_slots)` or
            `slot_len` outside `[0, block_size]` (value checks only when the arrays are concrete).
    """
    if q.ndim != 4:
        raise ValueError(f"q must be (b, n, lq, k), got shape {q.shape}")
    if pool_k.ndim != 5 or pool_k.shape != pool_v.shape:
        raise ValueError(
            "pool_k and pool_v must both be (b, n_kv, num_slots, block_size, k), got "
            f"{pool_k.shape} and {pool_v.shape}"
        )
    b, n, lq, k = q.shape
    pb, n_kv, num_slots, block_size, pk = pool_k.shape
    if pb != b or pk != k:
        raise ValueError(f"pool {pool_k.shape} does not match q {q.shape} in batch or head dim")
    if n_kv == 0 or n % n_kv:
        raise ValueError(f"query heads n={n} must be a multiple of KV heads n_kv={n_kv}")
    if lq == 0 or num_slots == 0 or block_size == 0:
        raise ValueError(f"empty q or pool: q {q.shape}, pool {pool_k.shape}")
    if block_idx.ndim != 4 or block_idx.shape[:2] != (b, n_kv):
        raise ValueError(
            f"block_idx must be (b, n_kv, num_q_tiles, max_sel) = ({b}, {n_kv}, ., .), got "
            f"{block_idx.shape}"
        )
    num_q_tiles, max_sel = block_idx.shape[2:]
    if block_cnt.shape != (b, n_kv, num_q_tiles):
        raise ValueError(
            f"block_cnt must be (b, n_kv, num_q_tiles) = {(b, n_kv, num_q_tiles)}, got "
            f"{block_cnt.shape}"
        )
    for name, x in (("block_idx", block_idx), ("block_cnt", block_cnt)):
        if not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"{name} must be an integer array, got {x.dtype}")
    if block_q is None:
        if num_q_tiles == 0 or lq % num_q_tiles:
            raise ValueError(
                f"cannot infer block_q: lq={lq} is not a multiple of num_q_tiles={num_q_tiles}; "
                "pass block_q"
            )
        block_q = lq // num_q_tiles
    if block_q <= 0 or -(-lq // block_q) != num_q_tiles:
        raise ValueError(
            f"block_q={block_q} cuts lq={lq} into {-(-lq // max(block_q, 1))} tiles but the "
            f"lists have num_q_tiles={num_q_tiles}"
        )
    if slot_len is not None:
        if slot_len.shape not in ((b, n_kv, num_slots), (b, num_slots)):
            raise ValueError(
                f"slot_len must be (b, n_kv, num_slots) = {(b, n_kv, num_slots)} or (b, "
                f"num_slots), got {slot_len.shape}"
            )
        if not jnp.issubdtype(slot_len.dtype, jnp.integer):
            raise ValueError(f"slot_len must be an integer array, got {slot_len.dtype}")
        lens = _concrete(slot_len)
        if lens is not None and lens.size and (lens.min() < 0 or lens.max() > block_size):
            raise ValueError(f"slot_len values must lie in [0, block_size={block_size}]")
    cnt = _concrete(block_cnt)
    if cnt is not None and cnt.size and (cnt.min() < 0 or cnt.max() > max_sel):
        raise ValueError(
            f"block_cnt values must lie in [0, max_sel={max_sel}], got range "
            f"[{cnt.min()}, {cnt.max()}]"
        )
    idx = _concrete(block_idx)
    if cnt is not None and idx is not None and idx.size:
        valid = np.arange(max_sel) < cnt[..., None]
        bad = valid & ((idx < 0) | (idx >= num_slots))
        if bad.any():
            raise ValueError(
                f"block_idx has valid entries outside [0, num_slots={num_slots}): "
                f"{np.unique(idx[bad])[:8].tolist()}"
            )
    return PbsaDims(
        b=b,
        n=n,
        n_kv=n_kv,
        lq=lq,
        k=k,
        num_slots=num_slots,
        block_size=block_size,
        block_q=block_q,
        num_q_tiles=num_q_tiles,
        max_sel=max_sel,
    )


def canonicalize_selection(
    block_idx: Int[Array, "b n_kv nq s"], block_cnt: Int[Array, "b n_kv nq"], num_slots: int
) -> tuple[Int[Array, "b n_kv nq s"], Int[Array, "b n_kv nq"]]:
    """Unique, ascending slots per query tile, padded with the last valid slot.

    Entries at or after `block_cnt` and entries outside `[0, num_slots)` are dropped, duplicates
    are merged. Padding repeats the last valid slot (slot 0 for an empty list) so a kernel that
    reads past the count never leaves the pool nor touches a new block.

    Returns:
        `(idx, cnt)`: int32 lists of the same shape and the number of unique valid slots.
    """
    max_sel = block_idx.shape[-1]
    block_idx = block_idx.astype(jnp.int32)
    block_cnt = jnp.clip(block_cnt.astype(jnp.int32), 0, max_sel)
    live = iota_below(max_sel, block_cnt) & (block_idx >= 0) & (block_idx < num_slots)
    # Dropped entries sort to the end as the sentinel `num_slots`.
    s = jnp.sort(jnp.where(live, block_idx, num_slots), axis=-1)
    first = jnp.concatenate([jnp.ones_like(s[..., :1], dtype=bool), s[..., 1:] != s[..., :-1]], -1)
    keep = first & (s < num_slots)
    s = jnp.sort(jnp.where(keep, s, num_slots), axis=-1)
    cnt = keep.sum(-1, dtype=jnp.int32)
    last = jnp.take_along_axis(s, jnp.maximum(cnt - 1, 0)[..., None], axis=-1)
    last = jnp.where(cnt[..., None] > 0, last, 0)
    idx = jnp.where(iota_below(max_sel, cnt), s, last)
    return idx, cnt


def selection_from_mask(
    slot_mask: Bool[Array, "b n_kv nq num_slots"], max_sel: int
) -> tuple[Int[Array, "b n_kv nq s"], Int[Array, "b n_kv nq"]]:
    """Canonical lists from a per-tile boolean slot mask (True = attend to that slot).

    Handy when a selection is easier to build as a mask (forced blocks OR top-k). A tile with
    more than `max_sel` selected slots raises `ValueError` when the mask is concrete; under `jit`
    its lowest `max_sel` slots are kept.

    Returns:
        `(block_idx, block_cnt)`: int32 `(b, n_kv, nq, max_sel)` ascending slots padded with the
        last one, and int32 `(b, n_kv, nq)` counts.
    """
    if slot_mask.ndim != 4 or slot_mask.dtype != jnp.bool_:
        raise ValueError(f"slot_mask must be bool (b, n_kv, nq, num_slots), got {slot_mask.shape}")
    num_slots = slot_mask.shape[-1]
    if max_sel <= 0:
        raise ValueError(f"max_sel must be positive, got {max_sel}")
    counts = _concrete(slot_mask)
    if counts is not None and counts.size and counts.sum(-1).max() > max_sel:
        raise ValueError(f"a tile selects {counts.sum(-1).max()} slots, more than {max_sel=}")
    order = jnp.argsort(~slot_mask, axis=-1, stable=True).astype(jnp.int32)  # selected first
    if max_sel > num_slots:
        order = jnp.pad(order, ((0, 0),) * 3 + ((0, max_sel - num_slots),))
    cnt = jnp.minimum(slot_mask.sum(-1, dtype=jnp.int32), max_sel)
    return canonicalize_selection(order[..., :max_sel], cnt, num_slots)


def full_slot_len(slot_len, *, b: int, n_kv: int, num_slots: int, block_size: int):
    """`slot_len` as int32 `(b, n_kv, num_slots)` in [0, block_size] (all `block_size` when
    None): the TPU kernel pads blocks past their size, and a larger length must not reach the
    padding."""
    if slot_len is None:
        return jnp.full((b, n_kv, num_slots), block_size, jnp.int32)
    slot_len = jnp.clip(slot_len.astype(jnp.int32), 0, block_size)
    if slot_len.ndim == 2:
        slot_len = jnp.broadcast_to(slot_len[:, None], (b, n_kv, num_slots))
    return slot_len


def selection_mask(
    block_idx: Int[Array, "b n_kv nq s"],
    block_cnt: Int[Array, "b n_kv nq"],
    *,
    num_slots: int,
    block_size: int,
    lq: int,
    block_q: int,
    slot_len: Int[Array, "b n_kv num_slots"] | None = None,
) -> Bool[Array, "b n_kv l num_slots*block_size"]:
    """Dense token mask of a selection: True where query row `l` may attend pool token `s`.

    Pool tokens are numbered slot-major (`slot * block_size + t`), i.e. the order of
    `pool_k.reshape(b, n_kv, num_slots * block_size, k)`. Meant for tests and debugging: it is
    as large as dense attention.
    """
    b, n_kv, nq, _ = block_idx.shape
    idx, cnt = canonicalize_selection(block_idx, block_cnt, num_slots)
    live = iota_below(idx.shape[-1], cnt)
    # One-hot over slots; a masked entry scatters into an extra dropped column.
    tgt = jnp.where(live, idx, num_slots)
    onehot = jax.nn.one_hot(tgt, num_slots + 1, dtype=jnp.int32).sum(-2)[..., :num_slots] > 0
    lens = full_slot_len(slot_len, b=b, n_kv=n_kv, num_slots=num_slots, block_size=block_size)
    tok = iota_below(block_size, lens)  # (b, n_kv, slots, bs)
    mask = onehot[..., None] & tok[:, :, None]  # (b, n_kv, nq, slots, bs)
    mask = mask.reshape(b, n_kv, nq, 1, num_slots * block_size)
    mask = jnp.broadcast_to(mask, (b, n_kv, nq, block_q, num_slots * block_size))
    return mask.reshape(b, n_kv, nq * block_q, num_slots * block_size)[:, :, :lq]
