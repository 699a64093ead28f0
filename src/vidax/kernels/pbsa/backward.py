"""Backward pass of PBSA in XLA, one query tile at a time (flash-attention style).

Differentiating the reference directly keeps every gathered block of every query tile alive,
`(b, n_kv, num_q_tiles, max_sel, block_size, k)` in float32, which at Sparse Forcing scale is
gigabytes per layer. Here a `lax.scan` over query tiles recomputes one tile's probabilities from
the saved log-sum-exp, and scatter-adds that tile's key/value gradients into float32 pool
gradients carried through the scan: peak memory is one tile's blocks plus the pool gradients.

With `P = exp(S - lse)`, `D = rowsum(dO * O)` and a cotangent `dlse` on the log-sum-exp:
`dV = Pᵀ dO`, `dS = P * (dO Vᵀ - D + dlse)`, `dQ = dS K * scale`, `dK = dSᵀ Q * scale`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vidax.kernels.pbsa.index import PbsaDims, iota_below
from vidax.kernels.pbsa.reference import _q_tiles


def pbsa_backward(q, pool_k, pool_v, idx, cnt, lens, out, lse, d_out, d_lse, d: PbsaDims, scale):
    """Gradients `(dq, dpool_k, dpool_v)` of PBSA over canonical lists (see `canonicalize_selection`).

    Args:
        q, pool_k, pool_v: the forward inputs.
        idx, cnt: canonical lists `(b, n_kv, num_q_tiles, max_sel)`, `(b, n_kv, num_q_tiles)`.
        lens: int32 `(b, n_kv, num_slots)` valid tokens per slot.
        out, lse: the forward outputs `(b, n, l, k)` and float32 `(b, n, l)`.
        d_out, d_lse: their cotangents (same shapes).
        d: the call's sizes; scale: the logit scale.
    """
    f32 = jnp.float32
    rows = d.num_q_tiles * d.block_q
    pad = rows - d.lq

    def tiles(x):  # (b, n, l, k) -> (nq, b, n_kv, g, bq, k): scan over the tile axis
        return jnp.moveaxis(_q_tiles(x.astype(f32), d), 3, 0)

    def row_tiles(x):  # (b, n, l) -> (nq, b, n_kv, g, bq)
        x = jnp.pad(x, ((0, 0), (0, 0), (0, pad)))
        return jnp.moveaxis(x.reshape(d.b, d.n_kv, d.groups, d.num_q_tiles, d.block_q), 3, 0)

    delta = jnp.einsum("bnlk,bnlk->bnl", d_out.astype(f32), out.astype(f32))
    # An empty row (lse = -inf) has P = 0: shift it by +inf so exp() gives 0, not inf.
    lse_safe = jnp.where(jnp.isfinite(lse), lse, jnp.inf)
    xs = (
        tiles(q),
        tiles(d_out),
        row_tiles(lse_safe),
        row_tiles(delta - d_lse.astype(f32)),
        jnp.moveaxis(idx, 2, 0),
        jnp.moveaxis(cnt, 2, 0),
    )
    take = jax.vmap(jax.vmap(lambda pool, i: pool[i]))  # per (b, n_kv): pool[idx]
    bi = jnp.arange(d.b)[:, None, None]
    hi = jnp.arange(d.n_kv)[None, :, None]

    def tile_step(carry, x):
        dk_pool, dv_pool = carry
        q_t, do_t, lse_t, delta_t, idx_t, cnt_t = x
        kb = take(pool_k, idx_t).astype(f32)  # (b, n_kv, s, bs, k)
        vb = take(pool_v, idx_t).astype(f32)
        live = iota_below(d.max_sel, cnt_t)
        tok_len = jnp.where(live, take(lens, idx_t), 0)
        valid = iota_below(d.block_size, tok_len)  # (b, h, s, bs)
        s = jnp.einsum("bhgrk,bhsnk->bhgrsn", q_t, kb) * scale
        s = jnp.where(valid[:, :, None, None], s, -jnp.inf)
        p = jnp.exp(s - lse_t[..., None, None])
        dv = jnp.einsum("bhgrsn,bhgrk->bhsnk", p, do_t)
        dp = jnp.einsum("bhgrk,bhsnk->bhgrsn", do_t, vb)
        ds = p * (dp - delta_t[..., None, None])
        dq_t = jnp.einsum("bhgrsn,bhsnk->bhgrk", ds, kb) * scale
        dk = jnp.einsum("bhgrsn,bhgrk->bhsnk", ds, q_t) * scale
        # Padding entries repeat a slot but carry zero probability, so adding them is harmless.
        dk_pool = dk_pool.at[bi, hi, idx_t].add(dk)
        dv_pool = dv_pool.at[bi, hi, idx_t].add(dv)
        return (dk_pool, dv_pool), dq_t

    zeros = jnp.zeros(pool_k.shape, f32)
    (dk_pool, dv_pool), dq = jax.lax.scan(tile_step, (zeros, zeros), xs)
    dq = jnp.moveaxis(dq, 0, 3).reshape(d.b, d.n, rows, d.k)[:, :, : d.lq]
    return dq.astype(q.dtype), dk_pool.astype(pool_k.dtype), dv_pool.astype(pool_v.dtype)
