"""The Wan 2.1 and Wan 2.2 causal 3D VAEs: config, NNX model, diffusers key map and loader."""

from vidax.models.wan_vae.config import (
    PRESETS,
    WanVAEConfig,
    from_diffusers_config,
    to_diffusers_config,
)
from vidax.models.wan_vae.convert import key_map, load, save
from vidax.models.wan_vae.model import WanVAE

__all__ = [
    "PRESETS",
    "WanVAE",
    "WanVAEConfig",
    "from_diffusers_config",
    "key_map",
    "load",
    "save",
    "to_diffusers_config",
]
