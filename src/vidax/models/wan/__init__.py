"""Wan 2.1 / 2.2 diffusion transformer (text- and image-to-video)."""

from vidax.models.wan.conditioning import (
    ENCODER_SEES_FIRST_FRAME,
    conditioned_output,
    conditioning,
    image_condition,
    image_inputs,
    image_tokens,
)
from vidax.models.wan.config import (
    PRESETS,
    WanConfig,
    from_diffusers_config,
    to_diffusers_config,
)
from vidax.models.wan.convert import key_map, load
from vidax.models.wan.model import Conditioning, WanBlock, WanTransformer, replace_frames

__all__ = [
    "ENCODER_SEES_FIRST_FRAME",
    "PRESETS",
    "Conditioning",
    "WanBlock",
    "WanConfig",
    "WanTransformer",
    "conditioned_output",
    "conditioning",
    "from_diffusers_config",
    "image_condition",
    "image_inputs",
    "image_tokens",
    "key_map",
    "load",
    "replace_frames",
    "to_diffusers_config",
]
