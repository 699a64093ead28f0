"""Wan 2.1 text-to-video diffusion transformer."""

from vidax.models.wan.config import PRESETS, WanConfig, to_diffusers_config
from vidax.models.wan.convert import key_map, load
from vidax.models.wan.model import Conditioning, WanBlock, WanTransformer

__all__ = [
    "PRESETS",
    "Conditioning",
    "WanBlock",
    "WanConfig",
    "WanTransformer",
    "key_map",
    "load",
    "to_diffusers_config",
]
