"""Shared layers and pure functions: attention core, RoPE, norms, embeddings, modulation."""

from vidax.nn.attention import attention
from vidax.nn.embeddings import timestep_embedding
from vidax.nn.layers import FeedForward, LayerNorm, Linear, RMSNorm, last_axis, modulate
from vidax.nn.rope import apply_rope, rope_angles, video_positions

__all__ = [
    "FeedForward",
    "LayerNorm",
    "Linear",
    "RMSNorm",
    "apply_rope",
    "attention",
    "last_axis",
    "modulate",
    "rope_angles",
    "timestep_embedding",
    "video_positions",
]
