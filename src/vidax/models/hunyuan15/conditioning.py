"""What the shared sampler (`vidax.pipeline`) needs to know about HunyuanVideo-1.5: its forward's
conditioning, and the condition channels it expects beside the latent."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from vidax.models.hunyuan15.config import HunyuanVideo15Config


def conditioning(config: HunyuanVideo15Config, text, guidance: float) -> dict:
    """The forward's keyword arguments for prompt embeddings `text` (a `vidax.text.PromptEmbeds`:
    embeds (b, s, d), mask (b, s))."""
    del config, guidance
    return {"text": text.embeds, "text_mask": text.mask}


def model_input(config: HunyuanVideo15Config, x: jax.Array) -> jax.Array:
    """The model input for latent x (b, t, h, w, c): text-to-video's condition latent and mask
    channel are zeros (diffusers `prepare_cond_latents_and_mask`)."""
    extra = config.in_channels - x.shape[-1]
    return jnp.concatenate([x, jnp.zeros((*x.shape[:-1], extra), x.dtype)], axis=-1)
