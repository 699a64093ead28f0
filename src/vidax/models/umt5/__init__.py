"""UMT5 text encoder (umT5-XXL, Wan 2.1's prompt encoder)."""

from vidax.models.umt5.config import PRESETS, UMT5Config, from_hf_config
from vidax.models.umt5.convert import key_map, load
from vidax.models.umt5.model import (
    UMT5Attention,
    UMT5Block,
    UMT5Encoder,
    UMT5FeedForward,
    position_buckets,
    relative_position_bucket,
)
from vidax.models.umt5.tokenizer import Tokenizer

__all__ = [
    "PRESETS",
    "Tokenizer",
    "UMT5Attention",
    "UMT5Block",
    "UMT5Config",
    "UMT5Encoder",
    "UMT5FeedForward",
    "from_hf_config",
    "key_map",
    "load",
    "position_buckets",
    "relative_position_bucket",
]
