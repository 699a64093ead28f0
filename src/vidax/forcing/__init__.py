"""Sparse Forcing: chunk-autoregressive video diffusion with a persistent block-sparse KV cache.

- `ForcingConfig` / `CacheLayout`: chunking, few-step schedule, sink/window/memory budgets.
- `CausalWan`, `forward_chunk`, `forward_full`: the causal wrapper of a Wan transformer.
- `KVCache`: fixed-size per-layer cache (sink, persistent memory, window ring, compressed ring).
- `dense_attention` (Self-Forcing) and `sparse_attention` (selected + compressed branches, affinely combined,
  over the PBSA kernel).
- `rollout`, `generate_latents`, `ChunkStepper`, `StreamDecoder`: generation, compiled once.
- `load_causal` (presets such as "tiny-causal" are in `vidax.models.registry`); `command.stream_generate` for `vidax generate
  --stream`; `train` for causal initialisation and self-rollout training.
"""

from vidax.forcing.attention import SparseParams, dense_attention, sparse_attention
from vidax.forcing.cache import KVCache, init_cache, write_chunk
from vidax.forcing.model import CausalWan, forward_chunk, forward_full, load, save
from vidax.forcing.rollout import (
    ChunkStepper,
    StreamDecoder,
    generate_latents,
    rollout,
    sample_chunk,
    stream,
)
from vidax.forcing.weights import load_causal
from vidax.models.causal import CacheLayout, ForcingConfig

__all__ = [
    "CacheLayout",
    "CausalWan",
    "ChunkStepper",
    "ForcingConfig",
    "KVCache",
    "SparseParams",
    "StreamDecoder",
    "dense_attention",
    "forward_chunk",
    "forward_full",
    "generate_latents",
    "init_cache",
    "load",
    "load_causal",
    "rollout",
    "sample_chunk",
    "save",
    "sparse_attention",
    "stream",
    "write_chunk",
]
