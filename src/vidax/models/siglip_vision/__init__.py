"""SigLIP image encoder (so400m-patch14-384, HunyuanVideo-1.5 image-to-video's image encoder)."""

from vidax.models.siglip_vision.config import PRESETS, SiglipVisionConfig, from_hf_config
from vidax.models.siglip_vision.convert import IGNORED, PREFIXES, key_map, load
from vidax.models.siglip_vision.model import SiglipVisionEncoder
from vidax.models.siglip_vision.preprocess import SIGLIP_MEAN, SIGLIP_STD, preprocess

# transformers classes whose checkpoints `load` reads (`config.json`'s "architectures").
ARCHITECTURES = ("SiglipVisionModel", "SiglipModel")

__all__ = [
    "ARCHITECTURES",
    "IGNORED",
    "PREFIXES",
    "PRESETS",
    "SIGLIP_MEAN",
    "SIGLIP_STD",
    "SiglipVisionConfig",
    "SiglipVisionEncoder",
    "from_hf_config",
    "key_map",
    "load",
    "preprocess",
]
