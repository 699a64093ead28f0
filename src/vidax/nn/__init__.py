"""Shared layers and pure functions: attention core, RoPE, norms, embeddings, modulation."""

from vidax.nn.attention import attention
from vidax.nn.embeddings import timestep_embedding
from vidax.nn.layers import FeedForward, LayerNorm, Linear, RMSNorm, expand_left, modulate
from vidax.nn.rope import apply_rope, rope_angles, video_positions

__all__ = [
    "FeedForward",
    "LayerNorm",
    "Linear",
    "RMSNorm",
    "apply_rope",
    "attention",
    "expand_left",
    "modulate",
    "rope_angles",
    "timestep_embedding",
    "video_positions",
]
