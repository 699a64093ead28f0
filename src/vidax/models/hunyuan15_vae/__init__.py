"""The HunyuanVideo-1.5 causal 3D VAE: config, NNX model with chunked streaming, key map."""

from vidax.models.hunyuan15_vae.config import (
    PRESETS,
    HunyuanVideo15VAEConfig,
    from_diffusers_config,
    to_diffusers_config,
)
from vidax.models.hunyuan15_vae.convert import key_map, load, save
from vidax.models.hunyuan15_vae.model import HunyuanVideo15VAE
from vidax.models.hunyuan_vae.config import NO_TILING, Tiling

__all__ = [
    "NO_TILING",
    "PRESETS",
    "HunyuanVideo15VAE",
    "HunyuanVideo15VAEConfig",
    "Tiling",
    "from_diffusers_config",
    "key_map",
    "load",
    "save",
    "to_diffusers_config",
]
