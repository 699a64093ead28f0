"""The attention core: the single switch between implementations.

Every model calls `attention(q, k, v, impl=...)`:
- "reference": plain einsum/softmax with float32 logits, the spec;
- "xla": `jax.nn.dot_product_attention` (lets XLA pick, cuDNN on GPU where it applies);
- "auto": "xla" (kernels register further implementations here as they land).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float

IMPLEMENTATIONS = ("auto", "reference", "xla")


def attention(
    q: Float[Array, "b l n k"],
    k: Float[Array, "b s n k"],
    v: Float[Array, "b s n k"],
    *,
    mask: Bool[Array, "b n l s"] | None = None,
    scale: float | None = None,
    impl: str = "auto",
) -> Float[Array, "b l n k"]:
    """Scaled dot-product attention; `mask` is True where a query may attend."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention impl {impl!r}; choose from {IMPLEMENTATIONS}")
    if q.shape[-1] != k.shape[-1] or k.shape != v.shape:
        raise ValueError(f"attention shapes q={q.shape} k={k.shape} v={v.shape} do not match")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if impl == "reference":
        return attention_reference(q, k, v, mask=mask, scale=scale)
    # jax.nn.dot_product_attention promotes bf16 against float32 internally, which strict
    # promotion (our test setting) rejects; the promotion is intended there.
    with jax.numpy_dtype_promotion("standard"):
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale)
    return out.astype(q.dtype)


def attention_reference(q, k, v, *, mask=None, scale: float):
    """softmax(q k^T * scale) v with float32 logits and accumulation."""
    logits = jnp.einsum("blnk,bsnk->bnls", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bnls,bsnk->blnk", probs, v.astype(jnp.float32)).astype(q.dtype)
