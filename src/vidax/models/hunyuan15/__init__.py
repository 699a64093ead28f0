"""HunyuanVideo-1.5 text/image-to-video diffusion transformer."""

from vidax.models.hunyuan15.conditioning import (
    ENCODER_SEES_FIRST_FRAME,
    conditioning,
    image_condition,
    image_inputs,
    image_tokens,
)
from vidax.models.hunyuan15.config import (
    PRESETS,
    HunyuanVideo15Config,
    from_diffusers_config,
    to_diffusers_config,
)
from vidax.models.hunyuan15.convert import key_map, load
from vidax.models.hunyuan15.model import (
    ByT5Projection,
    HunyuanVideo15Transformer,
    ImageProjection,
)

__all__ = [
    "ENCODER_SEES_FIRST_FRAME",
    "PRESETS",
    "ByT5Projection",
    "HunyuanVideo15Config",
    "HunyuanVideo15Transformer",
    "ImageProjection",
    "conditioning",
    "from_diffusers_config",
    "image_condition",
    "image_inputs",
    "image_tokens",
    "key_map",
    "load",
    "to_diffusers_config",
]
