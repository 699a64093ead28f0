"""The HunyuanVideo (1.0) causal 3D VAE: config, tiling, NNX model, diffusers key map, loader."""

from vidax.models.hunyuan_vae.config import (
    NO_TILING,
    PRESETS,
    HunyuanVideoVAEConfig,
    Tiling,
    from_diffusers_config,
    to_diffusers_config,
)
from vidax.models.hunyuan_vae.convert import key_map, load, save
from vidax.models.hunyuan_vae.model import HunyuanVideoVAE

__all__ = [
    "NO_TILING",
    "PRESETS",
    "HunyuanVideoVAE",
    "HunyuanVideoVAEConfig",
    "Tiling",
    "from_diffusers_config",
    "key_map",
    "load",
    "save",
    "to_diffusers_config",
]
