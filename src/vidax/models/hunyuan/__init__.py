"""HunyuanVideo (1.0) text-to-video diffusion transformer."""

from vidax.models.hunyuan.conditioning import conditioning, embedded_guidance
from vidax.models.hunyuan.config import (
    PRESETS,
    HunyuanVideoConfig,
    from_diffusers_config,
    to_diffusers_config,
)
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
    "conditioning",
    "embedded_guidance",
    "from_diffusers_config",
    "key_map",
    "load",
    "to_diffusers_config",
]
