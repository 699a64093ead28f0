"""The spec of persistent block-sparse attention: gather the selected pool blocks, then attend.

Plain `jnp` with float32 logits and accumulation. It materialises the gathered blocks
`(b, n_kv, num_q_tiles, max_sel, block_size, k)`, so it costs memory proportional to the
selection, not to the pool; it is the test oracle of the kernel and its backward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from vidax.kernels.pbsa.index import (
    PbsaDims,
    canonicalize_selection,
    check_inputs,
    check_key_angles,
    full_slot_len,
    iota_below,
)
from vidax.nn.rope import rotate_pairs
from vidax.nn.softmax import normalize, softmax_stats


def pbsa_reference(
    q: Float[Array, "b n l k"],
    pool_k: Float[Array, "b n_kv slots bs k"],
    pool_v: Float[Array, "b n_kv slots bs k"],
    block_idx: Int[Array, "b n_kv nq s"],
    block_cnt: Int[Array, "b n_kv nq"],
    *,
    block_q: int | None = None,
    scale: float | None = None,
    slot_len: Int[Array, "b n_kv slots"] | None = None,
    key_angles: Float[Array, "b n_kv slots k/2"] | None = None,
    return_lse: bool = False,
):
    """Each query tile attends to the union of its selected pool blocks, one softmax over all.

    See `vidax.kernels.pbsa.index` for the full index format.

    Args:
        q: queries `(b, n, l, k)`, cut into tiles of `block_q` rows (last tile may be partial).
        pool_k: key pool `(b, n_kv, num_slots, block_size, k)`; `n` is a multiple of `n_kv`.
        pool_v: value pool, same shape as `pool_k`.
        block_idx: int `(b, n_kv, num_q_tiles, max_sel)` pool slots per query tile (a set:
            duplicates count once).
        block_cnt: int `(b, n_kv, num_q_tiles)` number of valid leading entries of `block_idx`.
        block_q: query rows per tile; None infers `l // num_q_tiles` (must divide `l`).
        scale: logit scale, default `k ** -0.5`.
        slot_len: int `(b, n_kv, num_slots)` or `(b, num_slots)` valid tokens per slot (a
            partial block is padded at its end); None means all slots are full.
        key_angles: optional float `(b, n_kv, num_slots, k/2)` RoPE angles per slot: the keys
            of slot `s` are read rotated by them (`rotate_keys`).
        return_lse: also return the float32 log-sum-exp of the logits per query row.

    Returns:
        `out` `(b, n, l, k)` in `q.dtype`, or `(out, lse)` with `lse` float32 `(b, n, l)`. A row
        whose selection has no valid token gets `out = 0`, `lse = -inf`.
    """
    d = check_inputs(q, pool_k, pool_v, block_idx, block_cnt, block_q=block_q, slot_len=slot_len)
    scale = d.k**-0.5 if scale is None else scale
    idx, cnt = canonicalize_selection(block_idx, block_cnt, d.num_slots)
    lens = full_slot_len(
        slot_len, b=d.b, n_kv=d.n_kv, num_slots=d.num_slots, block_size=d.block_size
    )
    check_key_angles(key_angles, d)
    if key_angles is not None:
        pool_k = rotate_keys(pool_k, key_angles)
    out, lse = _attend(q, pool_k, pool_v, idx, cnt, lens, d, scale)
    return (out, lse) if return_lse else out


def rotate_keys(
    pool_k: Float[Array, "b n_kv slots bs k"], key_angles: Float[Array, "b n_kv slots k/2"]
) -> Float[Array, "b n_kv slots bs k"]:
    """Every key of slot `s` with its interleaved pairs rotated by `key_angles[..., s, :]`
    (float32 arithmetic, the pool's dtype): what `pbsa`'s RoPE on read attends to."""
    return rotate_pairs(pool_k, key_angles[..., None, :])


def _q_tiles(q: Array, d: PbsaDims) -> Array:
    """`(b, n, l, k)` -> `(b, n_kv, g, num_q_tiles, block_q, k)`, zero-padding the last tile."""
    pad = d.num_q_tiles * d.block_q - d.lq
    q = jnp.pad(q, ((0, 0), (0, 0), (0, pad), (0, 0)))
    return q.reshape(d.b, d.n_kv, d.groups, d.num_q_tiles, d.block_q, d.k)


def _attend(q, pool_k, pool_v, idx, cnt, lens, d: PbsaDims, scale: float):
    """Attention over canonical lists (`idx`, `cnt`) and int32 `lens` `(b, n_kv, slots)`."""
    f32 = jnp.float32
    take = jax.vmap(jax.vmap(lambda pool, i: pool[i]))  # per (b, n_kv): pool[idx]
    kb = take(pool_k, idx).astype(f32)  # (b, n_kv, nq, s, bs, k)
    vb = take(pool_v, idx).astype(f32)
    live = iota_below(d.max_sel, cnt)
    tok_len = jnp.where(live, take(lens, idx), 0)  # (b, n_kv, nq, s)
    valid = iota_below(d.block_size, tok_len)

    qt = _q_tiles(q, d).astype(f32)
    logits = jnp.einsum("bhgqtk,bhqsnk->bhgqtsn", qt, kb) * scale
    logits = jnp.where(valid[:, :, None, :, None], logits, -jnp.inf)
    # One softmax over all selected tokens: the row's keys are its (slot, token) pairs.
    p, shift, total = softmax_stats(logits, axis=(-2, -1))
    o, lse = normalize(jnp.einsum("bhgqtsn,bhqsnk->bhgqtk", p, vb), shift, total)

    rows = d.num_q_tiles * d.block_q
    out = o.reshape(d.b, d.n, rows, d.k)[:, :, : d.lq].astype(q.dtype)
    lse = lse.reshape(d.b, d.n, rows)[:, :, : d.lq]
    return out, lse
