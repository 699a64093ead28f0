"""SigLIP image encoder (HunyuanVideo-1.5 image-to-video's `image_encoder`) in Flax NNX.

Matches transformers' `SiglipVisionModel` up to its last hidden state: patches (a stride-p
convolution with bias) plus a learned position table, no class token and no norm before the
pre-norm transformer layers (`vidax.models.vit`), then a final layer norm ("post_layernorm")
over every token. The attention-pooling head that gives `pooler_output` is not ported (its
checkpoint keys are skipped): image-to-video models read the tokens.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from vidax.models import vit
from vidax.models.siglip_vision.config import SiglipVisionConfig
from vidax.models.siglip_vision.preprocess import preprocess
from vidax.nn import LayerNorm
from vidax.sharding import shard


class SiglipVisionEncoder(nnx.Module):
    """Normalised pixels -> SigLIP's last hidden state (every token, post-layer-normed).

    Layers are created stacked (leading "layers" axis) and run with `jax.lax.scan`;
    `hidden_states` runs only as many layers as the requested hidden state needs.
    """

    def __init__(self, config: SiglipVisionConfig, *, rngs: nnx.Rngs):
        c = self.config = config
        self.patch_embedding = vit.patch_embedding(c, use_bias=True, rngs=rngs)
        self.position_embedding = vit.position_table(c, c.num_tokens, rngs)
        self.blocks = vit.encoder_layers(c, rngs)
        self.post_norm = LayerNorm(c.hidden_size, eps=c.layer_norm_eps, param_dtype=c.storage_dtype)

    def preprocess(self, images: np.ndarray) -> np.ndarray:
        """RGB images (b, H, W, 3) -> this encoder's input, as transformers'
        `SiglipImageProcessor` makes it (`vidax.models.siglip_vision.preprocess`)."""
        return preprocess(images, self.config)

    def embed(self, pixels: Float[Array, "b H W c"]) -> Float[Array, "b l d"]:
        """Patch embeddings plus positions (transformers' `hidden_states[0]`)."""
        x = self.patch_embedding(vit.patches(pixels, self.config, "siglip_vision"))
        x = x.astype(jnp.float32) + self.position_embedding[...].astype(jnp.float32)[None]
        return shard(x, vit.TOKENS)

    def hidden_states(
        self, pixels: Float[Array, "b H W c"], layer: int = -1
    ) -> Float[Array, "b l d"]:
        """One of transformers' `output_hidden_states=True` hidden states (without the post-layer
        norm), running no layer after it.

        Args:
          pixels: (b, image_size, image_size, num_channels) normalised pixels, channels-last.
          layer: index into transformers' `hidden_states` tuple (0: the embeddings, i: after
            i layers, -1: after all).

        Returns:
          (b, grid^2, d) float32.
        """
        x = self.embed(pixels)
        return vit.run_layers(self.blocks, x, layer, self.config.num_hidden_layers)

    def __call__(self, pixels: Float[Array, "b H W c"]) -> Float[Array, "b l d"]:
        """The encoder's `last_hidden_state`, what HunyuanVideo-1.5 I2V reads.

        Args:
          pixels: (b, image_size, image_size, num_channels) normalised pixels, channels-last.

        Returns:
          (b, grid^2, d) float32: every token after the post-layer norm.
        """
        return shard(self.post_norm(self.hidden_states(pixels)), vit.TOKENS)
