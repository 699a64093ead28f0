"""HunyuanVideo (1.0) text-to-video diffusion transformer."""

from vidax.models.hunyuan.config import PRESETS, HunyuanVideoConfig
from vidax.models.hunyuan.convert import key_map, load
from vidax.models.hunyuan.model import (
    Conditioning,
    DualStreamBlock,
    HunyuanVideoTransformer,
    SingleStreamBlock,
    TokenRefiner,
)

__all__ = [
    "PRESETS",
    "Conditioning",
    "DualStreamBlock",
    "HunyuanVideoConfig",
    "HunyuanVideoTransformer",
    "SingleStreamBlock",
    "TokenRefiner",
    "key_map",
    "load",
]
