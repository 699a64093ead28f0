"""CLIP ViT image encoder (Wan 2.1 image-to-video's `image_encoder`) in Flax NNX.

Matches transformers' `CLIPVisionModel`: patches (a stride-p convolution without bias) after a
learned class token, plus a learned position table, then a layer norm ("pre_layrnorm") before
the pre-norm transformer layers (`vidax.models.vit`). The final layer norm ("post_layernorm") is
applied to the class token only, as the pooled output; the hidden states transformers returns
are un-normed.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from vidax.models import vit
from vidax.models.clip_vision.config import CLIPVisionConfig
from vidax.models.clip_vision.preprocess import preprocess
from vidax.nn import LayerNorm
from vidax.nn.layers import param
from vidax.sharding import shard


class CLIPVisionEncoder(nnx.Module):
    """Normalised pixels -> CLIP hidden states (and the pooled class token).

    Layers are created stacked (leading "layers" axis) and run with `jax.lax.scan`;
    `hidden_states` runs only as many layers as the requested hidden state needs.
    """

    def __init__(self, config: CLIPVisionConfig, *, rngs: nnx.Rngs):
        c = self.config = config
        d = c.hidden_size
        self.patch_embedding = vit.patch_embedding(c, use_bias=False, rngs=rngs)
        class_token = jax.random.normal(rngs.params(), (d,), jnp.float32) * d**-0.5
        self.class_embedding = param(class_token.astype(c.storage_dtype), ("embed",))
        self.position_embedding = vit.position_table(c, c.num_tokens, rngs)
        norm: dict[str, Any] = dict(eps=c.layer_norm_eps, param_dtype=c.storage_dtype)
        self.pre_norm = LayerNorm(d, **norm)
        self.blocks = vit.encoder_layers(c, rngs)
        self.post_norm = LayerNorm(d, **norm)

    def preprocess(self, images: np.ndarray) -> np.ndarray:
        """RGB images (b, H, W, 3) -> this encoder's input, as transformers'
        `CLIPImageProcessor` makes it (`vidax.models.clip_vision.preprocess`)."""
        return preprocess(images, self.config)

    def embed(self, pixels: Float[Array, "b H W c"]) -> Float[Array, "b l d"]:
        """Class token and patch embeddings plus positions, after the pre-layer norm
        (transformers' `hidden_states[0]`)."""
        x = self.patch_embedding(vit.patches(pixels, self.config, "clip_vision"))
        x = x.astype(jnp.float32)
        cls = self.class_embedding[...].astype(jnp.float32)
        cls = jnp.broadcast_to(cls.reshape(1, 1, -1), (x.shape[0], 1, x.shape[2]))
        x = jnp.concatenate([cls, x], axis=1)
        x = x + self.position_embedding[...].astype(jnp.float32)[None]
        return shard(self.pre_norm(x), vit.TOKENS)

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
        x = self.embed(pixels)
        return vit.run_layers(self.blocks, x, layer, self.config.num_hidden_layers)

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
