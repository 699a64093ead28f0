"""What the shared sampler (`vidax.pipeline`) needs to know about HunyuanVideo-1.5: its forward's
conditioning from a prompt, and (image-to-video) from the first frame. Text-to-video leaves the
condition channels beside the latent zero (`vidax.models.dit_stages.with_condition`, as
diffusers' `prepare_cond_latents_and_mask`) and adds no image tokens (diffusers' all-zero image
embeddings, which it masks out)."""

from __future__ import annotations

from collections.abc import Callable

import jax

from vidax.models.dit_stages import first_frame_condition
from vidax.models.hunyuan15.config import HunyuanVideo15Config

# The image encoder sees the first frame at the video size: diffusers' I2V pipeline resizes the
# image to the video before both the VAE and SigLIP read it.
ENCODER_SEES_FIRST_FRAME = True


def conditioning(config: HunyuanVideo15Config, text, guidance: float) -> dict:
    """The forward's keyword arguments for prompt embeddings `text` (a `vidax.text.PromptEmbeds`:
    embeds (b, s, d), mask (b, s))."""
    del config, guidance
    return {"text": text.embeds, "text_mask": text.mask}


def image_condition(
    config: HunyuanVideo15Config,
    encode: Callable[[jax.Array], jax.Array],
    pixels: jax.Array,
    num_frames: int,
    latent_frames: int,
) -> jax.Array:
    """The forward's `condition` (b, t, h, w, c + 1) for first frames `pixels` (b, H, W, 3) in
    [-1, 1], as diffusers' `HunyuanVideo15ImageToVideoPipeline.prepare_cond_latents_and_mask`
    builds it: the image encoded alone (the VAE's scaled posterior mode) on latent frame 0 and
    zeros after, then a mask channel 1 on frame 0 (the model input is [latents, condition
    latents, mask], diffusers' order).
    """
    del num_frames
    return first_frame_condition(encode, pixels, latent_frames, config.condition_channels)


def image_tokens(config: HunyuanVideo15Config, encoder, pixels: jax.Array) -> jax.Array:
    """What the forward reads from the image encoder (traced): SigLIP's last hidden state
    (b, 729, 1152 for so400m), as diffusers' `_get_image_embeds`."""
    del config
    return encoder(pixels)


def image_inputs(config: HunyuanVideo15Config, tokens: jax.Array | None) -> dict:
    """The forward's keyword arguments for image-encoder tokens (b, m, image_dim): its
    `image_embeds`, the image stream of the text tokens."""
    del config
    if tokens is None:
        raise ValueError("HunyuanVideo-1.5 image-to-video reads image-encoder tokens: none given")
    return {"image_embeds": tokens}
