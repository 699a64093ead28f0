"""A small trained text encoder over hashed word vectors (the `tiny` model's text side).

The hashed embedder (`vidax.text.hashed`) gives every word a fixed random vector plus a
position code; on its own a DiT must bind "red" to "circle" and "circle" to "left" through
cross-attention alone, which a 1 M-parameter model never learned for 2-3 object prompts.
`WordEncoder` adds a few bidirectional transformer layers over those vectors, trained with the
DiT, so each output token can carry its clause's attributes. Unknown words still map
deterministically (their hashed vector goes through the same layers).

    encoder = WordEncoder(WordEncoderConfig(), rngs=nnx.Rngs(0))
    words, mask = HashedTextEmbedder(dim=128, text_len=32)(["a red circle standing still"])
    context = encoder(words, mask)        # (1, 32, 256), zero past the prompt's end

The output is zero on padding, so the empty prompt (all padding) embeds to all zeros: the
same unconditional input the DiT's caption dropout trains on.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
from einops import rearrange
from flax import nnx
from jaxtyping import Array, Bool, Float

from vidax.checkpoint import Rule, linear_rules, load_model, save_model
from vidax.models.dit_config import check_dtypes
from vidax.nn import LayerNorm, Linear, attention
from vidax.nn.layers import FeedForward

_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WordEncoderConfig:
    """Shape of a `WordEncoder`.

    Attributes:
      in_dim: width of the hashed word vectors (`HashedTextEmbedder.dim`).
      dim: width of the layers and of the output (the DiT's `text_dim`).
      num_layers, num_heads, ffn_dim: pre-LayerNorm transformer layers.
      text_len: tokens per prompt (`HashedTextEmbedder.text_len`).
      dtype / param_dtype: compute and storage dtypes.
    """

    in_dim: int = 128
    dim: int = 256
    num_layers: int = 3
    num_heads: int = 4
    ffn_dim: int = 512
    text_len: int = 32
    eps: float = 1e-6
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        for name in ("in_dim", "dim", "num_layers", "num_heads", "ffn_dim", "text_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"WordEncoderConfig.{name} must be positive")
        if self.dim % self.num_heads:
            raise ValueError(f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        check_dtypes(self, _DTYPES)


class _Layer(nnx.Module):
    def __init__(self, c: WordEncoderConfig, *, rngs: nnx.Rngs):
        kw: dict[str, Any] = dict(
            dtype=jnp.dtype(c.dtype), param_dtype=jnp.dtype(c.param_dtype), rngs=rngs
        )
        self.norm1 = LayerNorm(c.dim, eps=c.eps)
        self.qkv = Linear(c.dim, 3 * c.dim, axes=("embed", "heads"), **kw)
        self.out = Linear(c.dim, c.dim, axes=("heads", "embed"), **kw)
        self.norm2 = LayerNorm(c.dim, eps=c.eps)
        self.ffn = FeedForward(c.dim, c.ffn_dim, **kw)
        self.num_heads = c.num_heads

    def __call__(self, x: Float[Array, "b l d"], mask: Bool[Array, "b l"]) -> jax.Array:
        q, k, v = jnp.split(self.qkv(self.norm1(x)), 3, axis=-1)
        q, k, v = (rearrange(a, "b l (n k) -> b l n k", n=self.num_heads) for a in (q, k, v))
        keys = jnp.broadcast_to(mask[:, None, None, :], (x.shape[0], 1, x.shape[1], x.shape[1]))
        o = attention(q, k, v, mask=keys, impl="reference")
        x = x + self.out(rearrange(o, "b l n k -> b l (n k)")).astype(x.dtype)
        return x + self.ffn(self.norm2(x)).astype(x.dtype)


class WordEncoder(nnx.Module):
    """(b, L, in_dim) hashed word vectors + (b, L) mask -> (b, L, dim) contextual embeddings."""

    def __init__(self, config: WordEncoderConfig, *, rngs: nnx.Rngs):
        c = self.config = config
        kw: dict[str, Any] = dict(
            dtype=jnp.dtype(c.dtype), param_dtype=jnp.dtype(c.param_dtype), rngs=rngs
        )
        self.proj_in = Linear(c.in_dim, c.dim, axes=("text_embed", "embed"), **kw)
        self.layers = nnx.List([_Layer(c, rngs=rngs) for _ in range(c.num_layers)])
        self.norm_out = LayerNorm(c.dim, eps=c.eps)

    def __call__(
        self, words: Float[Array, "b l i"], mask: Bool[Array, "b l"]
    ) -> Float[Array, "b l d"]:
        c = self.config
        if words.ndim != 3 or words.shape[-1] != c.in_dim or mask.shape != words.shape[:2]:
            raise ValueError(
                f"expected words (b, l, {c.in_dim}) and mask (b, l), got {words.shape}, "
                f"{mask.shape}"
            )
        x = self.proj_in(words)
        for layer in self.layers:
            x = layer(x, mask)
        # Zero on padding: the empty prompt is all zeros, as the caption dropout trains.
        return self.norm_out(x).astype(jnp.float32) * mask[..., None].astype(jnp.float32)


def key_map(config: WordEncoderConfig) -> list[Rule]:
    """Checkpoint keys (torch-style `weight` (out, in)) of a `WordEncoder`."""
    rules = [*linear_rules("proj_in", "proj_in")]
    for i in range(config.num_layers):
        p = f"layers.{i}"
        rules += [
            *linear_rules(f"{p}.attn.qkv", f"{p}.qkv"),
            *linear_rules(f"{p}.attn.out", f"{p}.out"),
            *linear_rules(f"{p}.ffn.fc1", f"{p}.ffn.proj_in"),
            *linear_rules(f"{p}.ffn.fc2", f"{p}.ffn.proj_out"),
        ]
        for norm in ("norm1", "norm2"):
            rules += [
                Rule(f"{p}.{norm}.weight", f"{p}.{norm}.scale"),
                Rule(f"{p}.{norm}.bias", f"{p}.{norm}.bias"),
            ]
    rules += [Rule("norm_out.weight", "norm_out.scale"), Rule("norm_out.bias", "norm_out.bias")]
    return rules


def load(path: str | os.PathLike, config: WordEncoderConfig) -> WordEncoder:
    """A `WordEncoder` from a safetensors file written by `save`."""
    return load_model(lambda: WordEncoder(config, rngs=nnx.Rngs(0)), path, key_map(config))


def save(encoder: WordEncoder, path: str | os.PathLike, **kwargs) -> None:
    """Writes `encoder`'s parameters (kwargs: `dtype`, `metadata` of `save_model`)."""
    save_model(encoder, path, key_map(encoder.config), **kwargs)
