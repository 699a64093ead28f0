"""The attention core: the single switch between implementations.

Every model calls `attention(q, k, v, impl=...)`:
- "reference": plain einsum/softmax with float32 logits, the spec;
- "xla": `jax.nn.dot_product_attention` (lets XLA pick, cuDNN on GPU where it applies);
- "chunked": online softmax over key blocks in plain jnp (float32 accumulators), so the
  `(l, s)` logits never exist at once; the XLA fallback for long sequences;
- "splash": jax's Pallas TPU splash-attention kernel, per device under `shard_map` with the
  layout the active sharding strategy gives q/k/v (TPU meshes only);
- "ring": ring attention over the `seq` mesh axis (`vidax.nn.ring_attention`);
- "auto": "ring" when the active strategy asks for it (`Strategy.ring`), "splash" on an active
  TPU mesh, "chunked" when the logits would exceed `CHUNKED_ABOVE` elements, else "xla".

Which mesh layout the sharded paths use comes from `vidax.sharding.current()`: q is laid out
as `("batch", "attn_tokens", "attn_heads", "head_dim")`, k/v as `"kv_tokens"` for
self-attention (as many keys as queries) and `"text_tokens"` otherwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

IMPLEMENTATIONS = ("auto", "reference", "xla", "chunked", "splash", "ring")

# "auto" switches to "chunked" above this many logits (b*n*l*s): 2^28 float32 logits are 1 GiB.
CHUNKED_ABOVE = 1 << 28
# Keys per step of the chunked path: big enough for wide matmuls, small enough that one
# block's logits stay a fraction of the full matrix.
KEY_BLOCK = 1024


def attention(
    q: Float[Array, "b l n k"],
    k: Float[Array, "b s n k"],
    v: Float[Array, "b s n k"],
    *,
    mask: Bool[Array, "b n l s"] | None = None,
    scale: float | None = None,
    impl: str = "auto",
) -> Float[Array, "b l n k"]:
    """Scaled dot-product attention; `mask` is True where a query may attend.

    A query whose mask row is all False gets the mean of `v` (as `jax.nn.dot_product_attention`
    does), not zeros: callers that can produce empty rows must handle them.
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention impl {impl!r}; choose from {IMPLEMENTATIONS}")
    if q.shape[-1] != k.shape[-1] or k.shape != v.shape:
        raise ValueError(f"attention shapes q={q.shape} k={k.shape} v={v.shape} do not match")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if impl == "auto":
        impl = _auto_impl(q, k, mask)
    if impl == "reference":
        return attention_reference(q, k, v, mask=mask, scale=scale)
    if impl == "chunked":
        return attention_chunked(q, k, v, mask=mask, scale=scale)
    if impl in ("ring", "splash"):
        if mask is not None:
            raise ValueError(f"attention impl {impl!r} does not take a mask")
        from vidax.nn import ring_attention

        if impl == "ring":
            return ring_attention.ring_attention(q, k, v, scale=scale)
        return ring_attention.splash_attention(q, k, v, scale=scale)
    # jax.nn.dot_product_attention promotes bf16 against float32 internally, which strict
    # promotion (our test setting) rejects; the promotion is intended there.
    with jax.numpy_dtype_promotion("standard"):
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale)
    return out.astype(q.dtype)


def _auto_impl(q, k, mask) -> str:
    from vidax.sharding.rules import current

    active = current()
    if mask is None and active is not None:
        mesh, strategy = active
        if strategy.ring and mesh.shape.get("seq", 1) > 1 and q.shape[1] == k.shape[1]:
            return "ring"
        if mesh.devices.flat[0].platform == "tpu":
            return "splash"
    logits = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[1]
    return "chunked" if logits > CHUNKED_ABOVE else "xla"


def attention_reference(q, k, v, *, mask=None, scale: float):
    """softmax(q k^T * scale) v with float32 logits and accumulation."""
    logits = jnp.einsum("blnk,bsnk->bnls", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bnls,bsnk->blnk", probs, v.astype(jnp.float32)).astype(q.dtype)


def attention_chunked(q, k, v, *, mask=None, scale: float, block: int = KEY_BLOCK):
    """Online-softmax attention over key blocks of `block` (padded keys are masked out)."""
    out, lse = attend_blocks(q, k, v, scale=scale, mask=mask, block=block)
    del lse
    return out.astype(q.dtype)


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
    qf = q.astype(jnp.float32) * scale
    kb = k.reshape(b, num, block, n, -1).swapaxes(0, 1)
    vb = v.reshape(b, num, block, n, -1).swapaxes(0, 1)
    mb = None if mask is None else mask.reshape(b, n, length, num, block).transpose(3, 0, 1, 2, 4)

    def step(carry, xs):
        acc, m, total = carry
        i, kc, vc, mc = xs
        logits = jnp.einsum("blnk,bsnk->bnls", qf, kc.astype(jnp.float32))
        keep = (i * block + jnp.arange(block) < limit)[None, None, None, :]
        if mc is not None:
            keep = keep & mc
        logits = jnp.where(keep, logits, -jnp.inf)
        m_new = jnp.maximum(m, logits.max(axis=-1))
        # Rows that have seen no key yet keep m = -inf; shift by 0 there to avoid inf - inf.
        shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(logits - shift[..., None])
        corr = jnp.exp(jnp.where(jnp.isfinite(m), m - shift, -jnp.inf))
        total = total * corr + p.sum(axis=-1)
        acc = acc * corr.transpose(0, 2, 1)[..., None] + jnp.einsum(
            "bnls,bsnk->blnk", p, vc.astype(jnp.float32)
        )
        return (acc, m_new, total), None

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
    safe = jnp.where(total > 0, total, 1.0)
    out = acc / safe.transpose(0, 2, 1)[..., None]
    lse = jnp.where(total > 0, m + jnp.log(safe), -jnp.inf)
    return out, lse


def merge_partials(
    a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]
) -> tuple[jax.Array, jax.Array]:
    """Merges two normalised (output (b,l,n,k), lse (b,n,l)) results over disjoint key sets."""
    (oa, la), (ob, lb) = a, b
    lse = jnp.logaddexp(la, lb)
    safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    wa = jnp.exp(la - safe).transpose(0, 2, 1)[..., None]
    wb = jnp.exp(lb - safe).transpose(0, 2, 1)[..., None]
    return oa * wa + ob * wb, lse
