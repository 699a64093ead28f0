"""Encoder-only UMT5 (umT5-XXL is Wan 2.1's text encoder) in Flax NNX.

T5-family details that differ from a textbook transformer, all matched to `transformers`'
`UMT5EncoderModel`:
- pre-norm blocks with T5's RMS layer norm (no mean subtraction, no bias, float32);
- attention logits are *not* scaled by 1/sqrt(k) (the scale is folded into the weights);
- a learned relative position bias, looked up by log-spaced distance buckets, added to the
  logits; unlike T5, which shares the first layer's table, UMT5 has one table per layer;
- gated-GELU (tanh) feed-forward without biases; no embedding scaling, no position embedding.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from einops import rearrange
from flax import nnx
from jaxtyping import Array, Bool, Float, Int

from vidax.models.umt5.config import UMT5Config
from vidax.nn import Linear, RMSNorm
from vidax.nn.layers import param
from vidax.nn.scan import scan_layers, stack_layers
from vidax.sharding import shard


def relative_position_bucket(
    relative_position: np.ndarray,
    *,
    num_buckets: int,
    max_distance: int,
    bidirectional: bool = True,
) -> np.ndarray:
    """T5's bucket of each relative position (key position - query position).

    Half the buckets hold exact small distances, the rest log-spaced distances up to
    `max_distance`, beyond which all share the last bucket. Bidirectional (encoder) buckets
    split into two halves, the upper one for keys after the query.

    Computed on the host in float32 with the reference's operation order: the buckets depend
    only on static lengths, and the float32 rounding at the log-spaced boundaries decides which
    bucket some distances land in, so it must be reproduced exactly.

    Args:
      relative_position: integer array of any shape.

    Returns:
      int32 array of the same shape with values in [0, num_buckets).
    """
    relative_position = np.asarray(relative_position, np.int64)
    buckets = np.zeros(relative_position.shape, np.int64)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0) * num_buckets
        distance = np.abs(relative_position)
    else:
        distance = -np.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    with np.errstate(divide="ignore"):  # log(0) only where is_small selects the exact bucket
        log_ratio = np.log(distance.astype(np.float32) / np.float32(max_exact))
    log_ratio = log_ratio / np.float32(math.log(max_distance / max_exact))
    log_ratio = log_ratio * np.float32(num_buckets - max_exact)
    large = max_exact + np.where(is_small, 0, log_ratio).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return (buckets + np.where(is_small, distance, large)).astype(np.int32)


def position_buckets(length: int, *, num_buckets: int, max_distance: int) -> np.ndarray:
    """(l, s) bidirectional buckets of every query/key pair of a length-`length` sequence."""
    positions = np.arange(length)
    return relative_position_bucket(
        positions[None, :] - positions[:, None],
        num_buckets=num_buckets,
        max_distance=max_distance,
    )


class UMT5Attention(nnx.Module):
    """Unscaled multi-head self-attention with a per-layer relative position bias table."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_kv: int,
        num_buckets: int,
        *,
        dtype: jnp.dtype,
        param_dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        inner = num_heads * d_kv
        kw: dict[str, Any] = dict(use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        # T5's initialisation: the missing 1/sqrt(k) logit scale lives in the q init.
        init_q = nnx.initializers.normal((d_model * d_kv) ** -0.5)
        self.q = Linear(d_model, inner, axes=("embed", "heads"), kernel_init=init_q, **kw)
        self.k = Linear(d_model, inner, axes=("embed", "heads"), **kw)
        self.v = Linear(d_model, inner, axes=("embed", "heads"), **kw)
        self.o = Linear(inner, d_model, axes=("heads", "embed"), **kw)
        table = jax.random.normal(rngs.params(), (num_buckets, num_heads), jnp.float32)
        # (buckets, n) is tiny; replicate it rather than shard a dimension that is not n * k.
        self.relative_attention_bias = param(table.astype(param_dtype), (None, None))
        self.num_heads = num_heads

    def position_bias(self, buckets: Int[Array, "l s"]) -> Float[Array, "n l s"]:
        """This layer's float32 bias for a precomputed bucket matrix."""
        table = self.relative_attention_bias[...].astype(jnp.float32)
        return rearrange(table[buckets], "l s n -> n l s")

    def __call__(
        self,
        x: Float[Array, "b l d"],
        buckets: Int[Array, "l l"],
        mask: Bool[Array, "b l"],
    ) -> Float[Array, "b l d"]:
        split = lambda y: rearrange(y, "b l (n k) -> b l n k", n=self.num_heads)
        axes = ("batch", "text_tokens", "attn_heads", "head_dim")
        q, k, v = (shard(split(proj(x)), axes) for proj in (self.q, self.k, self.v))
        # Unscaled logits reach large magnitudes, so they and the softmax are float32.
        logits = jnp.einsum("blnk,bsnk->bnls", q, k, preferred_element_type=jnp.float32)
        logits = logits + self.position_bias(buckets)[None]  # (n, l, s) over the batch
        logits = jnp.where(mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
        o = jnp.einsum("bnls,bsnk->blnk", probs, v)
        return self.o(rearrange(o, "b l n k -> b l (n k)"))


class UMT5FeedForward(nnx.Module):
    """wo(gelu_tanh(wi_0 x) * wi_1 x), no biases."""

    def __init__(
        self, d_model: int, d_ff: int, *, dtype: jnp.dtype, param_dtype: jnp.dtype, rngs: nnx.Rngs
    ):
        kw: dict[str, Any] = dict(use_bias=False, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.wi_0 = Linear(d_model, d_ff, axes=("embed", "mlp"), **kw)
        self.wi_1 = Linear(d_model, d_ff, axes=("embed", "mlp"), **kw)
        self.wo = Linear(d_ff, d_model, axes=("mlp", "embed"), **kw)

    def __call__(self, x: Float[Array, "b l d"]) -> Float[Array, "b l d"]:
        h = jax.nn.gelu(self.wi_0(x), approximate=True) * self.wi_1(x)
        return self.wo(shard(h, ("batch", "text_tokens", "mlp")))


class UMT5Block(nnx.Module):
    """x + attn(norm(x)), then x + ffn(norm(x)); the residual stream is float32."""

    def __init__(self, config: UMT5Config, *, rngs: nnx.Rngs):
        c = config
        kw: dict[str, Any] = dict(dtype=c.compute_dtype, param_dtype=c.storage_dtype, rngs=rngs)
        self.attention_norm = RMSNorm(c.d_model, eps=c.eps, param_dtype=c.storage_dtype)
        self.attention = UMT5Attention(
            c.d_model, c.num_heads, c.d_kv, c.relative_attention_num_buckets, **kw
        )
        self.ffn_norm = RMSNorm(c.d_model, eps=c.eps, param_dtype=c.storage_dtype)
        self.ffn = UMT5FeedForward(c.d_model, c.d_ff, **kw)
        self.dtype = c.compute_dtype

    def __call__(
        self, x: Float[Array, "b l d"], buckets: Int[Array, "l l"], mask: Bool[Array, "b l"]
    ) -> Float[Array, "b l d"]:
        h = self.attention_norm(x).astype(self.dtype)
        x = x + self.attention(h, buckets, mask).astype(jnp.float32)
        h = self.ffn_norm(x).astype(self.dtype)
        x = x + self.ffn(h).astype(jnp.float32)
        return shard(x, ("batch", "text_tokens", "embed"))


class UMT5Encoder(nnx.Module):
    """Token ids -> UMT5 `last_hidden_state`.

    Blocks are created stacked (leading "layers" axis) and run with `jax.lax.scan`, so compile
    time does not grow with depth.
    """

    def __init__(self, config: UMT5Config, *, rngs: nnx.Rngs):
        c = self.config = config
        table = jax.random.normal(rngs.params(), (c.vocab_size, c.d_model), jnp.float32)
        self.embed_tokens = param(table.astype(c.storage_dtype), ("vocab", "embed"))

        self.blocks = stack_layers(c.num_layers, lambda rngs: UMT5Block(c, rngs=rngs), rngs)
        self.final_norm = RMSNorm(c.d_model, eps=c.eps, param_dtype=c.storage_dtype)

    def __call__(
        self, input_ids: Int[Array, "b l"], mask: Bool[Array, "b l"] | None = None
    ) -> Float[Array, "b l d"]:
        """Encodes token ids.

        Args:
          input_ids: (b, l) integer token ids.
          mask: (b, l) True on real tokens; padded keys are ignored by every query (padded
            positions still get outputs, which callers discard). Default: all real.

        Returns:
          (b, l, d) float32 hidden states after the final layer norm.
        """
        c = self.config
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be (b, l), got shape {input_ids.shape}")
        if mask is None:
            mask = jnp.ones(input_ids.shape, bool)
        if mask.shape != input_ids.shape:
            raise ValueError(f"mask {mask.shape} does not match input_ids {input_ids.shape}")
        mask = mask.astype(bool)
        buckets = jnp.asarray(
            position_buckets(
                input_ids.shape[1],
                num_buckets=c.relative_attention_num_buckets,
                max_distance=c.relative_attention_max_distance,
            )
        )
        x = jnp.take(self.embed_tokens[...], input_ids, axis=0).astype(jnp.float32)
        x = shard(x, ("batch", "text_tokens", "embed"))
        x = scan_layers(self.blocks, x, lambda block, x: block(x, buckets, mask))
        return self.final_norm(x)
