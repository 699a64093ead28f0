"""CLIP ViT image encoder (ViT-H/14, Wan 2.1 image-to-video's image encoder)."""

from vidax.models.clip_vision.config import PRESETS, CLIPVisionConfig, from_hf_config
from vidax.models.clip_vision.convert import IGNORED, PREFIXES, key_map, load
from vidax.models.clip_vision.model import CLIPVisionEncoder
from vidax.models.clip_vision.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, preprocess

# transformers classes whose checkpoints `load` reads (`config.json`'s "architectures").
ARCHITECTURES = ("CLIPVisionModel", "CLIPVisionModelWithProjection", "CLIPModel")

__all__ = [
    "ARCHITECTURES",
    "IGNORED",
    "OPENAI_CLIP_MEAN",
    "OPENAI_CLIP_STD",
    "PREFIXES",
    "PRESETS",
    "CLIPVisionConfig",
    "CLIPVisionEncoder",
    "from_hf_config",
    "key_map",
    "load",
    "preprocess",
]
