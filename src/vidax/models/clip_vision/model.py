"""CLIP ViT image encoder (Wan 2.1 image-to-video's `image_encoder`) in Flax NNX.

Matches transformers' `CLIPVisionModel`: patches (a stride-p convolution without bias, here a
Linear over flattened patches) after a learned class token, plus a learned position table, then
a layer norm ("pre_layrnorm") before the pre-norm transformer layers (LayerNorm -> multi-head
attention with biases -> residual; LayerNorm -> MLP -> residual). The final layer norm
("post_layernorm") is applied to the class token only, as the pooled output; the hidden states
transformers returns are un-normed.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from einops import rearrange
from flax import nnx
from jaxtyping import Array, Float

from vidax.models.clip_vision.config import CLIPVisionConfig
from vidax.nn import FeedForward, LayerNorm, Linear, attention
from vidax.nn.layers import param
from vidax.nn.scan import scan_layers, stack_layers
from vidax.sharding import shard

_TOKENS = ("batch", "tokens", "embed")
_HEADS = ("batch", "attn_tokens", "attn_heads", "head_dim")


def quick_gelu(x: jax.Array) -> jax.Array:
    """x * sigmoid(1.702 x): OpenAI CLIP's GELU approximation (transformers' "quick_gelu").

    Module-level, like `nn.layers.gelu_tanh`: a module keeps its activation as a static
    attribute, and a lambda per model would make two loads of one checkpoint different graphs.
    """
    return x * jax.nn.sigmoid(1.702 * x)


def gelu(x: jax.Array) -> jax.Array:
    """Exact (erf) GELU, transformers' "gelu"."""
    return jax.nn.gelu(x, approximate=False)


_ACTIVATIONS = {"quick_gelu": quick_gelu, "gelu": gelu}


class CLIPAttention(nnx.Module):
    """Multi-head self-attention with biased q/k/v/out projections, scaled by 1/sqrt(k)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        attention_impl: str,
        dtype: jnp.dtype,
        param_dtype: jnp.dtype,
        rngs: nnx.Rngs,
    ):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.q = Linear(dim, dim, axes=("embed", "heads"), **kw)
        self.k = Linear(dim, dim, axes=("embed", "heads"), **kw)
        self.v = Linear(dim, dim, axes=("embed", "heads"), **kw)
        self.out = Linear(dim, dim, axes=("heads", "embed"), **kw)
        self.num_heads = num_heads
        self.attention_impl = attention_impl

    def __call__(self, x: Float[Array, "b l d"]) -> Float[Array, "b l d"]:
        split = lambda y: rearrange(y, "b l (n k) -> b l n k", n=self.num_heads)
        q = shard(split(self.q(x)), _HEADS)
        kv_axes = ("batch", "kv_tokens", "attn_heads", "head_dim")
        k, v = shard(split(self.k(x)), kv_axes), shard(split(self.v(x)), kv_axes)
        o = shard(attention(q, k, v, impl=self.attention_impl), _HEADS)
        return self.out(rearrange(o, "b l n k -> b l (n k)"))


class CLIPEncoderLayer(nnx.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); norms and the residual stream are float32."""

    def __init__(self, config: CLIPVisionConfig, *, rngs: nnx.Rngs):
        c = config
        kw: dict[str, Any] = dict(dtype=c.compute_dtype, param_dtype=c.storage_dtype, rngs=rngs)
        norm: dict[str, Any] = dict(eps=c.layer_norm_eps, param_dtype=c.storage_dtype)
        self.attention_norm = LayerNorm(c.hidden_size, **norm)
        self.attention = CLIPAttention(
            c.hidden_size, c.num_attention_heads, attention_impl=c.attention_impl, **kw
        )
        self.mlp_norm = LayerNorm(c.hidden_size, **norm)
        self.mlp = FeedForward(
            c.hidden_size, c.intermediate_size, activation=_ACTIVATIONS[c.hidden_act], **kw
        )
        self.dtype = c.compute_dtype

    def __call__(self, x: Float[Array, "b l d"]) -> Float[Array, "b l d"]:
        h = self.attention_norm(x).astype(self.dtype)
        x = x + self.attention(h).astype(jnp.float32)
        h = self.mlp_norm(x).astype(self.dtype)
        x = x + self.mlp(h).astype(jnp.float32)
        return shard(x, _TOKENS)


class CLIPVisionEncoder(nnx.Module):
    """Normalised pixels -> CLIP hidden states (and the pooled class token).

    Layers are created stacked (leading "layers" axis) and run with `jax.lax.scan`;
    `hidden_states` runs only as many layers as the requested hidden state needs.
    """

    def __init__(self, config: CLIPVisionConfig, *, rngs: nnx.Rngs):
        c = self.config = config
        d = c.hidden_size
        self.patch_embedding = Linear(
            c.patch_features,
            d,
            axes=("patch", "embed"),
            use_bias=False,
            dtype=c.compute_dtype,
            param_dtype=c.storage_dtype,
            rngs=rngs,
        )
        class_token = jax.random.normal(rngs.params(), (d,), jnp.float32) * d**-0.5
        self.class_embedding = param(class_token.astype(c.storage_dtype), ("embed",))
        positions = jax.random.normal(rngs.params(), (c.num_tokens, d), jnp.float32) * 0.02
        # (tokens, d): the token axis is small and never sharded.
        self.position_embedding = param(positions.astype(c.storage_dtype), (None, "embed"))
        norm: dict[str, Any] = dict(eps=c.layer_norm_eps, param_dtype=c.storage_dtype)
        self.pre_norm = LayerNorm(d, **norm)
        self.blocks = stack_layers(
            c.num_hidden_layers, lambda rngs: CLIPEncoderLayer(c, rngs=rngs), rngs
        )
        self.post_norm = LayerNorm(d, **norm)

    def embed(self, pixels: Float[Array, "b H W c"]) -> Float[Array, "b l d"]:
        """Class token and patch embeddings plus positions, after the pre-layer norm
        (transformers' `hidden_states[0]`)."""
        c = self.config
        if pixels.ndim != 4 or pixels.shape[1:] != (c.image_size, c.image_size, c.num_channels):
            raise ValueError(
                f"pixels must be (b, {c.image_size}, {c.image_size}, {c.num_channels}) "
                f"channels-last (see clip_vision.preprocess), got shape {pixels.shape}"
            )
        patches = rearrange(
            pixels, "b (gh ph) (gw pw) c -> b (gh gw) (ph pw c)", ph=c.patch_size, pw=c.patch_size
        )
        x = self.patch_embedding(patches).astype(jnp.float32)
        cls = self.class_embedding[...].astype(jnp.float32)
        cls = jnp.broadcast_to(cls.reshape(1, 1, -1), (x.shape[0], 1, x.shape[2]))
        x = jnp.concatenate([cls, x], axis=1)
        x = x + self.position_embedding[...].astype(jnp.float32)[None]
        return shard(self.pre_norm(x), _TOKENS)

    def hidden_states(
        self, pixels: Float[Array, "b H W c"], layer: int = -2
    ) -> Float[Array, "b l d"]:
        """One of transformers' `output_hidden_states=True` hidden states, running no layer
        after it.

        Args:
          pixels: (b, image_size, image_size, num_channels) normalised pixels, channels-last.
          layer: index into transformers' `hidden_states` tuple (0: the embeddings, i: after
            i layers, -1: after all). The default -2, the penultimate layer's output, is what
            Wan 2.1 image-to-video conditions on.

        Returns:
          (b, 1 + grid^2, d) float32, without the post-layer norm.
        """
        layers = self.config.num_hidden_layers
        if not -(layers + 1) <= layer <= layers:
            raise ValueError(
                f"layer must index the {layers + 1} hidden states ({-(layers + 1)}..{layers}), "
                f"got {layer}"
            )
        x = self.embed(pixels)
        return scan_layers(self.blocks, x, lambda block, x: block(x), layers=layer % (layers + 1))

    def __call__(
        self, pixels: Float[Array, "b H W c"]
    ) -> tuple[Float[Array, "b l d"], Float[Array, "b d"]]:
        """The whole encoder.

        Args:
          pixels: (b, image_size, image_size, num_channels) normalised pixels, channels-last.

        Returns:
          last_hidden_state (b, 1 + grid^2, d) (without the post-layer norm, as transformers
          returns it) and pooler_output (b, d) (the post-layer-normed class token), float32.
        """
        x = self.hidden_states(pixels, layer=-1)
        return x, self.post_norm(x[:, 0])
