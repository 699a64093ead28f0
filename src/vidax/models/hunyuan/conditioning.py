"""What the shared sampler (`vidax.pipeline`) needs to know about HunyuanVideo: its forward's
conditioning, and that a guidance-distilled checkpoint takes the scale as an input."""

from __future__ import annotations

import jax.numpy as jnp

from vidax.models.hunyuan.config import HunyuanVideoConfig


def conditioning(config: HunyuanVideoConfig, text, guidance: float) -> dict:
    """The forward's keyword arguments for prompt embeddings `text` (a `vidax.text.PromptEmbeds`:
    embeds (b, s, d), mask (b, s), pooled (b, p) or None, then zeros)."""
    pooled = text.pooled
    if pooled is None:
        pooled = jnp.zeros((text.batch, config.pooled_dim), jnp.float32)
    cond = {"text": text.embeds, "text_mask": text.mask, "pooled": pooled}
    if config.guidance_embeds:  # guidance-distilled: the scale (x1000) is an input, not CFG
        cond["guidance"] = jnp.full((text.batch,), 1000.0 * guidance, jnp.float32)
    return cond


def embedded_guidance(config: HunyuanVideoConfig) -> bool:
    """Whether the guidance scale is a model input (no classifier-free guidance batch)."""
    return config.guidance_embeds
