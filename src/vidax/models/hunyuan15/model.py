"""The HunyuanVideo-1.5 diffusion transformer in Flax NNX.

Same stages as HunyuanVideo (see `vidax.models.hunyuan.model`), with dual-stream blocks only:

    tokens, grid = model.embed(x)
    cond = model.condition(timestep, text, text_mask, byt5=..., image_embeds=...)
    tokens = model.run_blocks(tokens, cond, model.rope(grid, positions))
    x = model.unembed(tokens, cond, grid)

The text stream concatenates up to three token types, each tagged with a learned type
embedding: [image (SigLIP), glyph text (ByT5), prompt (Qwen2.5-VL, refined)]. diffusers also
moves every type's valid tokens ahead of all padding; attention ignores padded keys and the
text stream is otherwise per-token, so that permutation cannot change the video output and is
skipped here.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Bool, Float

from vidax.models.dit_stages import MLPEmbedder
from vidax.models.hunyuan.model import Conditioning, DualStreamDiT, check_text
from vidax.models.hunyuan15.config import HunyuanVideo15Config
from vidax.nn import LayerNorm, Linear
from vidax.nn.embeddings import timestep_embedding
from vidax.nn.layers import last_axis, param
from vidax.sharding import shard

# Token types of the text stream (rows of `cond_type_embed`).
_PROMPT, _BYT5, _IMAGE = 0, 1, 2


def _gelu(x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x, approximate=False)


# The conditioning projections use torch's default LayerNorm epsilon, not the blocks' eps.
_PROJECTION_EPS = 1e-5


class ByT5Projection(nnx.Module):
    """LayerNorm -> Linear -> GELU -> Linear -> GELU -> Linear: ByT5 glyph embeddings to width d."""

    def __init__(self, in_dim: int, hidden: int, dim: int, *, dtype, param_dtype, rngs):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm = LayerNorm(in_dim, eps=_PROJECTION_EPS, param_dtype=param_dtype)
        self.linear_1 = Linear(in_dim, hidden, axes=("text_embed", "mlp"), **kw)
        self.linear_2 = Linear(hidden, hidden, axes=("mlp", None), **kw)
        self.linear_3 = Linear(hidden, dim, axes=(None, "embed"), **kw)

    def __call__(self, x: Float[Array, "b s e"]) -> Float[Array, "b s d"]:
        h = _gelu(self.linear_1(self.norm(x)))
        return self.linear_3(_gelu(self.linear_2(h)))


class ImageProjection(nnx.Module):
    """LayerNorm -> Linear -> GELU -> Linear -> LayerNorm: SigLIP image tokens to width d."""

    def __init__(self, in_dim: int, dim: int, *, dtype, param_dtype, rngs):
        kw: dict[str, Any] = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm_in = LayerNorm(in_dim, eps=_PROJECTION_EPS, param_dtype=param_dtype)
        self.linear_1 = Linear(in_dim, in_dim, axes=("text_embed", None), **kw)
        self.linear_2 = Linear(in_dim, dim, axes=(None, "embed"), **kw)
        self.norm_out = LayerNorm(dim, eps=_PROJECTION_EPS, param_dtype=param_dtype)

    def __call__(self, x: Float[Array, "b m e"]) -> Float[Array, "b m d"]:
        return self.norm_out(self.linear_2(_gelu(self.linear_1(self.norm_in(x)))))


class HunyuanVideo15Transformer(DualStreamDiT):
    """HunyuanVideo-1.5 DiT: `(x, timestep, text, text_mask, byt5=, image_embeds=) -> v`.

    Inputs are channels-last latents whose channels are [noisy latent; condition latent; mask]
    (`in_channels`); the prediction has `out_channels`. The dual-stream blocks are stacked and
    run with `jax.lax.scan`.
    """

    def __init__(self, config: HunyuanVideo15Config, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        c = config
        kw: dict[str, Any] = dict(dtype=c.compute_dtype, param_dtype=c.storage_dtype, rngs=rngs)
        f32 = {**kw, "dtype": jnp.float32}
        self.time_embedder = MLPEmbedder(c.freq_dim, c.dim, in_axis="freq", **f32)
        self.time_embedder_r = (
            MLPEmbedder(c.freq_dim, c.dim, in_axis="freq", **f32) if c.use_meanflow else None
        )
        self.refiner = self._refiner(rngs)
        self.byt5_embedder = ByT5Projection(c.byt5_dim, c.byt5_hidden, c.dim, **kw)
        self.image_embedder = ImageProjection(c.image_dim, c.dim, **kw)
        table = jax.random.normal(rngs.params(), (3, c.dim), jnp.float32)
        self.cond_type_embed = param(table.astype(c.storage_dtype), ("vocab", "embed"))

    def _typed(self, tokens: jax.Array, kind: int) -> jax.Array:
        c = self.config
        embed = last_axis(self.cond_type_embed[kind].astype(c.compute_dtype), tokens.ndim)
        return tokens.astype(c.compute_dtype) + embed

    def condition(
        self,
        timestep: Float[Array, " b"],
        text: Float[Array, "b s e"],
        text_mask: Bool[Array, "b s"],
        *,
        byt5: Float[Array, "b g e"] | None = None,
        byt5_mask: Bool[Array, "b g"] | None = None,
        image_embeds: Float[Array, "b m e"] | None = None,
        timestep_r: Float[Array, " b"] | None = None,
    ) -> Conditioning:
        """Vector conditioning and the typed text stream for one forward pass.

        Args:
          timestep: (b,) in [0, 1000].
          text: (b, s, text_dim) prompt embeddings; text_mask: (b, s), True for real tokens.
          byt5: optional (b, g, byt5_dim) glyph embeddings; byt5_mask: (b, g) (default: all
            real). None adds no glyph tokens, as an all-False mask does in diffusers.
          image_embeds: optional (b, m, image_dim) image tokens (I2V). A sample whose embeddings
            are all zero counts as text-to-video and its image tokens are masked out (diffusers
            applies that test to the whole batch at once). None adds no image tokens.
          timestep_r: optional (b,) second timestep of MeanFlow models (`use_meanflow`).
        """
        c = self.config
        if timestep.ndim != 1:
            raise ValueError(f"timestep must be (b,), got {timestep.shape}")
        b = timestep.shape[0]
        check_text(text, text_mask, c.text_dim, b)
        if timestep_r is not None:
            if self.time_embedder_r is None:
                raise ValueError("timestep_r needs a MeanFlow model (use_meanflow=True)")
            if timestep_r.shape != (b,):
                raise ValueError(f"timestep_r must be ({b},), got {timestep_r.shape}")
        if image_embeds is not None and (
            image_embeds.ndim != 3 or image_embeds.shape[::2] != (b, c.image_dim)
        ):
            raise ValueError(
                f"image_embeds must be ({b}, m, {c.image_dim}), got {image_embeds.shape}"
            )
        if byt5 is None and byt5_mask is not None:
            raise ValueError("byt5_mask given without byt5")
        if byt5 is not None:
            if byt5.ndim != 3 or byt5.shape[::2] != (b, c.byt5_dim):
                raise ValueError(f"byt5 must be ({b}, g, {c.byt5_dim}), got {byt5.shape}")
            if byt5_mask is None:
                byt5_mask = jnp.ones(byt5.shape[:2], bool)
            if byt5_mask.shape != byt5.shape[:2]:
                raise ValueError(f"byt5_mask must be {byt5.shape[:2]}, got {byt5_mask.shape}")

        temb = self.time_embedder(timestep_embedding(timestep, c.freq_dim))
        if timestep_r is not None and self.time_embedder_r is not None:  # both or an error above
            temb = temb + self.time_embedder_r(timestep_embedding(timestep_r, c.freq_dim))
        mask = jnp.asarray(text_mask).astype(bool)
        tokens, masks = [], []
        if image_embeds is not None:
            image_embeds = jnp.asarray(image_embeds)
            tokens.append(self._typed(self.image_embedder(image_embeds), _IMAGE))
            is_i2v = jnp.any(image_embeds != 0, axis=(1, 2))
            masks.append(jnp.broadcast_to(is_i2v[:, None], image_embeds.shape[:2]))
        if byt5 is not None:
            tokens.append(self._typed(self.byt5_embedder(byt5), _BYT5))
            masks.append(jnp.asarray(byt5_mask).astype(bool))
        prompt = self.refiner(text.astype(c.compute_dtype), timestep, mask)
        tokens.append(self._typed(prompt, _PROMPT))
        masks.append(mask)
        context = shard(jnp.concatenate(tokens, axis=1), ("batch", "text_tokens", "embed"))
        return Conditioning(temb=temb, text=context, text_mask=jnp.concatenate(masks, axis=1))
