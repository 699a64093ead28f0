"""What the shared sampler (`vidax.pipeline`) needs to know about Wan: its forward's
conditioning from a prompt, and (image-to-video) from the first frame."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from vidax.models.dit_stages import first_frame_condition
from vidax.models.wan.config import WanConfig

# video (b, F, H, W, 3) in [-1, 1] -> normalised latents (b, t, h, w, c): the VAE's encode.
Encode = Callable[[jax.Array], jax.Array]

# The image encoder sees the image as given: diffusers' Wan I2V pipeline encodes it with CLIP
# before resizing it to the video.
ENCODER_SEES_FIRST_FRAME = False


def conditioning(config: WanConfig, text, guidance: float) -> dict:
    """The forward's keyword arguments for prompt embeddings `text` (a `vidax.text.PromptEmbeds`:
    embeds (b, s, d), mask (b, s)): Wan attends to zero-padded text without a mask."""
    del config, guidance
    return {"context": text.embeds * text.mask[..., None].astype(text.embeds.dtype)}


def image_condition(
    config: WanConfig, encode: Encode, pixels: jax.Array, num_frames: int, latent_frames: int
) -> jax.Array:
    """The forward's `condition` (b, t, h, w, config.image_channels) for first frames `pixels`
    (b, H, W, 3) in [-1, 1], as diffusers' `WanImageToVideoPipeline.prepare_latents` builds it.

    Wan 2.1 / 2.2 A14B I2V: the VAE encodes the image followed by num_frames - 1 black frames;
    a mask (one channel per frame a latent frame packs, the VAE's temporal stride) is 1 on the
    first latent frame; condition = [mask, latents]. Wan 2.2 TI2V (`expand_timesteps`): the
    image's own latent on frame 0 and a mask channel 1 there: that frame is given, not noised.
    """
    b, height, width, _ = pixels.shape
    if config.image_channels == 0:
        raise ValueError("this Wan model is text-to-video only: it takes no image")
    if config.expand_timesteps:
        return first_frame_condition(encode, pixels, latent_frames, config.image_channels)
    black = jnp.zeros((b, num_frames - 1, height, width, 3), pixels.dtype)
    latents = encode(jnp.concatenate([pixels[:, None], black], axis=1))
    mask_channels = config.condition_channels - latents.shape[-1]
    if mask_channels < 1:
        raise ValueError(
            f"the VAE's {latents.shape[-1]} latent channels leave no mask channels in the "
            f"model's {config.condition_channels} condition channels"
        )
    mask = jnp.zeros((*latents.shape[:-1], mask_channels), latents.dtype).at[:, 0].set(1.0)
    return jnp.concatenate([mask, latents], axis=-1)


def image_tokens(config: WanConfig, encoder, pixels: jax.Array) -> jax.Array:
    """What the forward reads from the image encoder (traced): CLIP's penultimate hidden states
    (b, 257, 1280 for ViT-H/14), as diffusers' `WanImageToVideoPipeline.encode_image`."""
    del config
    return encoder.hidden_states(pixels, -2)


def image_inputs(config: WanConfig, tokens: jax.Array | None) -> dict:
    """The forward's keyword arguments for image-encoder tokens (b, s, image_dim) (Wan 2.1
    I2V's CLIP tokens; models without image_dim read none)."""
    if config.image_dim is None:
        return {}
    if tokens is None:
        raise ValueError("this Wan model reads image-encoder tokens: none were given")
    return {"image": tokens}


def conditioned_output(config: WanConfig, latents: jax.Array, condition: jax.Array) -> jax.Array:
    """The sample with what the condition fixes written in: TI2V's given first frame (the
    model never denoises it); other models' samples as they are."""
    if not config.expand_timesteps:
        return latents
    c = config.out_channels
    mask = condition[..., c:]
    return mask * condition[..., :c] + (1.0 - mask) * latents
