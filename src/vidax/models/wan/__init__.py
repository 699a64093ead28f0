"""Wan 2.1 text-to-video diffusion transformer."""

from vidax.models.wan.conditioning import conditioning
from vidax.models.wan.config import (
    PRESETS,
    WanConfig,
    from_diffusers_config,
    to_diffusers_config,
)
from vidax.models.wan.convert import key_map, load
from vidax.models.wan.model import Conditioning, WanBlock, WanTransformer

__all__ = [
    "PRESETS",
    "Conditioning",
    "WanBlock",
    "WanConfig",
    "WanTransformer",
    "conditioning",
    "from_diffusers_config",
    "key_map",
    "load",
    "to_diffusers_config",
]
