"""Masked softmax with log-sum-exp, in one pass or online, and attention over key blocks.

Every attention path that splits a query's keys (into blocks, ring steps, a cache pool and
the chunk's own tokens, gathered selections) keeps the same per-row statistics: the shift `m`
(the row's largest logit) and `total = sum(exp(logits - m))`. From them come the normalised
output `acc / total` and the log-sum-exp `m + log(total)`, and two results over disjoint key
sets merge exactly through their log-sum-exps (`merge_partials`).

Masked logits are `-inf`. A row with no unmasked key is shifted by 0 instead of `-inf`, so its
probabilities are exactly 0 (not NaN); it normalises to output 0 and log-sum-exp `-inf`, and
contributes nothing when merged.

- `softmax_stats`: one pass over a whole row (the PBSA reference, the forcing cache attention);
- `online_softmax_step`: one block of a row at a time (`attend_blocks`);
- `normalize`: (output, log-sum-exp) from the accumulated statistics;
- `attend_blocks`: attention of queries over key blocks under `lax.scan` (the "chunked" path
  of `vidax.nn.attention` and the per-device block of ring attention).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

# Keys per step of `attend_blocks`: big enough for wide matmuls, small enough that one block's
# logits stay a fraction of the full matrix.
KEY_BLOCK = 1024

_LOW_PRECISION = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def _shift(m: jax.Array) -> jax.Array:
    """The row maximum, 0 where the row has no finite logit (avoids -inf - -inf = NaN)."""
    return jnp.where(jnp.isfinite(m), m, 0.0)


def softmax_stats(
    logits: jax.Array, axis: int | tuple[int, ...] = -1
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Unnormalised probabilities of masked logits, with their shift and sum over `axis`.

    Args:
        logits: float32 logits, `-inf` where masked.
        axis: the key axis (or axes) of a row.

    Returns:
        `p = exp(logits - shift)` (the shape of `logits`), and `shift` and `total = p.sum()`
        (the shape of `logits` without `axis`); `p` and `total` are 0 on empty rows.
    """
    shift = _shift(logits.max(axis=axis, keepdims=True))
    p = jnp.exp(logits - shift)
    return p, jnp.squeeze(shift, axis), p.sum(axis=axis)


def online_softmax_step(
    m: jax.Array, total: jax.Array, logits: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Adds one block of keys (the last axis of `logits`) to a row's running statistics.

    Args:
        m: the running maximum (`-inf` before any key counted), shape `logits.shape[:-1]`.
        total: the running sum of `exp(logits - m)` (0 before any key).
        logits: this block's logits, `-inf` where masked.

    Returns:
        `(p, correction, m, total)`: the block's `exp(logits - shift)`, the factor that
        rescales earlier accumulations to the new shift, and the updated statistics. The
        caller's accumulator becomes `acc * correction + p @ v`.
    """
    m_new = jnp.maximum(m, logits.max(axis=-1))
    shift = _shift(m_new)
    p = jnp.exp(logits - shift[..., None])
    correction = jnp.exp(jnp.where(jnp.isfinite(m), m - shift, -jnp.inf))
    return p, correction, m_new, total * correction + p.sum(axis=-1)


def normalize(
    acc: Float[Array, "*rows k"], shift: Float[Array, "*rows"], total: Float[Array, "*rows"]
) -> tuple[Float[Array, "*rows k"], Float[Array, "*rows"]]:
    """(output, log-sum-exp) of rows from their accumulated `acc = p @ v`, shift and total.

    A row with `total == 0` (no key counted) gets output 0 and log-sum-exp `-inf`. The total is
    replaced before it is divided by or logged, so gradients stay finite there too.
    """
    has = total > 0
    safe = jnp.where(has, total, 1.0)
    return acc / safe[..., None], jnp.where(has, shift + jnp.log(safe), -jnp.inf)


def merge_partials(
    a: tuple[Float[Array, "b l n k"], Float[Array, "b n l"]],
    b: tuple[Float[Array, "b l n k"], Float[Array, "b n l"]],
) -> tuple[Float[Array, "b l n k"], Float[Array, "b n l"]]:
    """Merges two normalised (output, log-sum-exp) results over disjoint key sets."""
    (oa, la), (ob, lb) = a, b
    lse = jnp.logaddexp(la, lb)
    safe = _shift(lse)
    wa = jnp.exp(la - safe).transpose(0, 2, 1)[..., None]
    wb = jnp.exp(lb - safe).transpose(0, 2, 1)[..., None]
    return oa * wa + ob * wb, lse


def attend_blocks(
    q: Float[Array, "b l n k"],
    k: Float[Array, "b s n k"],
    v: Float[Array, "b s n k"],
    *,
    scale: float,
    mask: Bool[Array, "b n l s"] | None = None,
    valid: jax.Array | int | None = None,
    block: int = KEY_BLOCK,
) -> tuple[Float[Array, "b l n k"], Float[Array, "b n l"]]:
    """Attention of q over k/v block by block: (normalised float32 output, log-sum-exp).

    Args:
        q, k, v: queries and keys/values.
        scale: logit scale.
        mask: True where a query may attend (optional).
        valid: only the first `valid` keys count (a traced scalar is fine); the rest are
            padding.
        block: keys per step.

    Returns:
        The float32 output and the float32 log-sum-exp of each query's logits (`-inf` where no
        key counts), so that results over disjoint key sets merge exactly (`merge_partials`).
    """
    b, length, n, _ = q.shape
    s = k.shape[1]
    block = min(block, s)
    num = -(-s // block)
    pad = num * block - s
    if pad:
        k = jnp.pad(k, ((0, 0), (0, pad), (0, 0), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, pad), (0, 0), (0, 0)))
        if mask is not None:
            mask = jnp.pad(mask, ((0, 0), (0, 0), (0, 0), (0, pad)))
    limit = s if valid is None else jnp.minimum(valid, s)
    # bf16/fp16 operands run the matmuls at the low-precision rate with float32 accumulation
    # (as flash attention does), scaling the float32 logits rather than rounding q * scale;
    # other inputs are computed in float32 throughout.
    low = q.dtype == k.dtype == v.dtype and q.dtype in _LOW_PRECISION
    dot_dtype = q.dtype if low else jnp.float32
    qf = q if low else q.astype(jnp.float32) * scale
    kb = k.reshape(b, num, block, n, -1).swapaxes(0, 1)
    vb = v.reshape(b, num, block, n, -1).swapaxes(0, 1)
    mb = None if mask is None else mask.reshape(b, n, length, num, block).transpose(3, 0, 1, 2, 4)

    def step(carry, xs):
        acc, m, total = carry
        i, kc, vc, mc = xs
        logits = jnp.einsum(
            "blnk,bsnk->bnls", qf, kc.astype(dot_dtype), preferred_element_type=jnp.float32
        )
        if low:
            logits = logits * scale
        keep = (i * block + jnp.arange(block) < limit)[None, None, None, :]
        if mc is not None:
            keep = keep & mc
        logits = jnp.where(keep, logits, -jnp.inf)
        p, correction, m, total = online_softmax_step(m, total, logits)
        acc = acc * correction.transpose(0, 2, 1)[..., None] + jnp.einsum(
            "bnls,bsnk->blnk",
            p.astype(dot_dtype),
            vc.astype(dot_dtype),
            preferred_element_type=jnp.float32,
        )
        return (acc, m, total), None

    init = (
        jnp.zeros((b, length, n, v.shape[-1]), jnp.float32),
        jnp.full((b, n, length), -jnp.inf, jnp.float32),
        jnp.zeros((b, n, length), jnp.float32),
    )
    xs = (jnp.arange(num), kb, vb, mb)
    if num == 1:
        (acc, m, total), _ = step(init, jax.tree.map(lambda x: x[0], xs))
    else:
        (acc, m, total), _ = jax.lax.scan(step, init, xs)
    # The statistics are (b, n, l) and the output (b, l, n, k): normalise token-major.
    out, lse = normalize(acc, m.transpose(0, 2, 1), total.transpose(0, 2, 1))
    return out, lse.transpose(0, 2, 1)
