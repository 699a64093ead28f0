"""CLIP ViT image encoder (ViT-H/14, Wan 2.1 image-to-video's image encoder)."""

from vidax.models.clip_vision.config import PRESETS, CLIPVisionConfig, from_hf_config
from vidax.models.clip_vision.convert import IGNORED, key_map, load
from vidax.models.clip_vision.model import (
    CLIPAttention,
    CLIPEncoderLayer,
    CLIPVisionEncoder,
    gelu,
    quick_gelu,
)
from vidax.models.clip_vision.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, preprocess

__all__ = [
    "IGNORED",
    "OPENAI_CLIP_MEAN",
    "OPENAI_CLIP_STD",
    "PRESETS",
    "CLIPAttention",
    "CLIPEncoderLayer",
    "CLIPVisionConfig",
    "CLIPVisionEncoder",
    "from_hf_config",
    "gelu",
    "key_map",
    "load",
    "preprocess",
    "quick_gelu",
]
