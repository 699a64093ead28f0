"""Configuration of chunked autoregressive generation: chunking, schedule, cache and sparsity.

`ForcingConfig` holds everything that does not depend on the video size; `CacheLayout` adds the
token grid of one latent frame and derives every static size of the per-layer KV cache (slots,
regions, budgets), validating the budgets against it. Sizes in frames are latent frames.

Cache regions (per layer and head; a region is a run of KV blocks of `block_size` tokens):

    [ sink | persistent memory | local window ring ]        + compressed ring (sparse only)

- *sink*: the first `sink_frames` of the video, kept for the whole rollout.
- *memory* (sparse): `memory_blocks` salient blocks kept from frames that left the window.
- *window*: the last `window_frames` frames before the current chunk, a ring written one chunk
  at a time (chunk `c` overwrites chunk `c - window_chunks`).
- *compressed* (sparse): `compressed_tokens` mean-pooled (key, value) tokens of blocks the memory
  discarded, a ring of the most recent ones.

The current chunk's keys and values are not part of the cache: every forward computes them and
attends to them beside the cache; only the clean (t = 0) pass writes them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from vidax.sampling import shift_sigmas

ATTENTION = ("dense", "sparse")
PBSA_BACKENDS = ("auto", "reference", "tpu", "triton", "gather")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ForcingConfig:
    """Chunked autoregressive sampling and its attention cache.

    Attributes:
      chunk_frames: latent frames generated per chunk (Self-Forcing: 3).
      timesteps: the few denoising timesteps of a chunk in [0, 1000], descending, before the
        shift (Self-Forcing: 1000, 750, 500, 250).
      shift: flow-matching time shift applied to `timesteps / 1000` (Self-Forcing: 5).
      context_timestep: timestep of the clean pass that writes a finished chunk to the cache.
      sink_frames: first frames kept for the whole rollout (a multiple of `chunk_frames`, or 0).
      window_frames: frames before the current chunk attended in full (a multiple of
        `chunk_frames`).
      attention: "dense" (Self-Forcing: all cached tokens) or "sparse" (Sparse Forcing).
      block_size: tokens per KV block. Any size: a frame whose tokens it does not divide ends
        in a partial block (padded, its missing tokens masked), e.g. Wan 480p's 1560 tokens in
        blocks of 64 = 24 full blocks and one of 24 tokens. On a TPU prefer a multiple of 16
        (bf16's sublane tile): the PBSA kernel then copies blocks straight from the cache;
        other sizes are padded to the tile, a copy of the cache every forward.
      memory_blocks: persistent-memory budget in blocks (sparse).
      local_topk: window blocks each query tile selects (sparse; at most the window's blocks).
      memory_topk: memory blocks each query tile selects (sparse; at most `memory_blocks`).
      compressed_tokens: size of the ring of compressed discarded blocks (sparse; 0 disables).
      memory_frames: reach of the persistent memory (sparse; 0: any age): it keeps blocks of at
        most the `memory_frames` frames before the window, and older blocks leave the memory and
        the compressed ring, so a chunk reads nothing older than `context_frames` (besides the
        sink). Sets sparse and dense at equal context span (`benchmarks/sparse_forcing.py`).
      salience_decay: gamma of the salience average u <- gamma u + (1 - gamma) mass.
      query_tile: query rows sharing one selection; None = one latent frame.
      pbsa_backend: backend of the selected branch: one of `vidax.kernels.pbsa.pbsa`'s
        ("auto", "reference", "tpu", "triton"), or "gather" (gather + batched matmuls in XLA,
        `vidax.forcing.attention.gather_attention`: the fast path on a CPU). "auto" is the
        kernel on a GPU/TPU and "gather" on a CPU.
      dense_shared: sparse, where the selected branch runs a PBSA kernel: the blocks every
        query tile lists (the sink and the chunk's own) are attended in one dense kernel call
        (splash on a TPU) and merged by log-sum-exp with PBSA over each tile's own picks, once
        the sink is written (before, PBSA takes all). The same function; faster only when
        PBSA's query tiles are small (tiles of 120 at Wan size; with one selection per frame
        it decoded 1.19x slower on a TPU v5e, docs/sparse_forcing.md); inference only on a
        TPU (splash's log-sum-exp has no derivative; training runs "gather"), and the
        "gather" path computes it in one piece.
      guidance: classifier-free guidance of each denoising step at inference (1: none, the
        Self-Forcing default). Above 1 the empty caption runs beside the prompt in the same
        batch, with cache rows of its own (twice the cache and compute):
        v = v_u + guidance (v_c - v_u).
    """

    chunk_frames: int = 3
    timesteps: tuple[float, ...] = (1000.0, 750.0, 500.0, 250.0)
    shift: float = 5.0
    context_timestep: float = 0.0
    sink_frames: int = 3
    window_frames: int = 15
    attention: str = "dense"
    block_size: int = 8
    memory_blocks: int = 0
    local_topk: int = 0
    memory_topk: int = 0
    compressed_tokens: int = 0
    memory_frames: int = 0
    salience_decay: float = 0.9
    query_tile: int | None = None
    pbsa_backend: str = "auto"
    dense_shared: bool = False
    guidance: float = 1.0

    @property
    def guided(self) -> bool:
        """Whether steps run classifier-free guided (a second, unconditional cache row)."""
        return self.guidance != 1.0

    def __post_init__(self):
        if not self.guidance >= 1.0:
            raise ValueError(f"ForcingConfig.guidance must be >= 1, got {self.guidance}")
        ints = ("chunk_frames", "block_size")
        for name in ints:
            if getattr(self, name) < 1:
                raise ValueError(f"ForcingConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "sink_frames",
            "window_frames",
            "memory_blocks",
            "local_topk",
            "memory_topk",
            "compressed_tokens",
            "memory_frames",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"ForcingConfig.{name} must be >= 0, got {getattr(self, name)}")
        c = self.chunk_frames
        for name in ("sink_frames", "window_frames"):
            if getattr(self, name) % c:
                raise ValueError(
                    f"ForcingConfig.{name}={getattr(self, name)} must be a multiple of "
                    f"chunk_frames={c} (the cache is written one chunk at a time)"
                )
        if self.window_frames < c:
            raise ValueError(
                f"window_frames={self.window_frames} must hold at least one chunk "
                f"({c} frames): a chunk must see the one before it"
            )
        if not self.timesteps:
            raise ValueError("ForcingConfig.timesteps must not be empty")
        t = np.asarray(self.timesteps, np.float64)
        if t.max() > 1000 or t.min() <= 0 or np.any(np.diff(t) >= 0):
            raise ValueError(
                f"timesteps must be strictly descending in (0, 1000], got {self.timesteps}"
            )
        if not (self.shift > 0 and math.isfinite(self.shift)):
            raise ValueError(f"shift must be a finite number > 0, got {self.shift}")
        if not 0 <= self.context_timestep < t.min():
            raise ValueError(
                f"context_timestep={self.context_timestep} must lie in [0, {t.min()}) (below "
                "every denoising timestep)"
            )
        if self.pbsa_backend not in PBSA_BACKENDS:
            raise ValueError(
                f"pbsa_backend must be one of {PBSA_BACKENDS}, got {self.pbsa_backend!r}"
            )
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {self.attention!r}")
        if not 0.0 <= self.salience_decay < 1.0:
            raise ValueError(f"salience_decay must be in [0, 1), got {self.salience_decay}")
        if self.dense_shared and self.attention != "sparse":
            raise ValueError("ForcingConfig.dense_shared applies to attention='sparse' only")
        if self.query_tile is not None and self.query_tile < 1:
            raise ValueError(f"query_tile must be positive, got {self.query_tile}")
        if self.attention == "dense":
            extra = {
                n: getattr(self, n)
                for n in (
                    "memory_blocks",
                    "local_topk",
                    "memory_topk",
                    "compressed_tokens",
                    "memory_frames",
                )
                if getattr(self, n)
            }
            if extra:
                raise ValueError(f"dense attention takes no sparse budgets, got {extra}")
        else:
            if self.local_topk < 1:
                raise ValueError("sparse attention needs local_topk >= 1")
            if self.memory_topk > self.memory_blocks:
                raise ValueError(
                    f"memory_topk={self.memory_topk} is larger than the memory budget "
                    f"memory_blocks={self.memory_blocks}"
                )
            if 0 < self.memory_frames < c:
                raise ValueError(
                    f"memory_frames={self.memory_frames} must be 0 or at least chunk_frames={c}: "
                    "the window evicts a chunk at a time, up to a chunk older than the window"
                )

    # -- derived --------------------------------------------------------------------------------

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    @property
    def sigmas(self) -> np.ndarray:
        """(num_steps + 1,) float32 noise levels of a chunk, shifted, ending at 0."""
        s = shift_sigmas(np.asarray(self.timesteps, np.float64) / 1000.0, self.shift)
        return np.append(s, 0.0).astype(np.float32)

    @property
    def sink_chunks(self) -> int:
        return self.sink_frames // self.chunk_frames

    @property
    def window_chunks(self) -> int:
        return self.window_frames // self.chunk_frames

    @property
    def sparse(self) -> bool:
        return self.attention == "sparse"

    @property
    def horizon(self) -> int:
        """Largest time position a chunk starts at (positions are re-aligned past it).

        Frames keep absolute positions until the video is this long; after that the current
        chunk stays at `horizon`, the window just before it, the sink at 0.., and memory in the
        chunk-long band between sink and window, so relative distances stay those of training.
        """
        extra = self.chunk_frames if self.sparse else 0
        return self.sink_frames + self.window_frames + extra

    @property
    def context_frames(self) -> int | None:
        """Context span in frames: the sink plus the frames just before the chunk whose blocks
        it can read (the window, and `memory_frames` more for a bounded memory).

        `sink + window` (dense, or sparse without memory), `+ memory_frames` for a bounded
        memory, None for a memory that keeps blocks of any age.
        """
        span = self.sink_frames + self.window_frames
        if not (self.sparse and self.memory_blocks):
            return span
        return span + self.memory_frames if self.memory_frames else None

    def num_chunks(self, latent_frames: int) -> int:
        """Chunks of a video of `latent_frames`; a clear error when the chunk does not divide."""
        if latent_frames < 1 or latent_frames % self.chunk_frames:
            raise ValueError(
                f"{latent_frames} latent frames cannot be cut into chunks of "
                f"{self.chunk_frames} frames: use a multiple of {self.chunk_frames}"
            )
        return latent_frames // self.chunk_frames

    def layout(self, grid_hw: tuple[int, int]) -> CacheLayout:
        """The cache layout for latent frames of `grid_hw` tokens (validated)."""
        h, w = grid_hw
        return CacheLayout(config=self, grid_hw=(h, w))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheLayout:
    """Static sizes of the KV cache of one video size; regions are ranges of block slots.

    Attributes:
      config: the forcing config.
      grid_hw: (h', w') tokens of one latent frame.
    """

    config: ForcingConfig
    grid_hw: tuple[int, int]

    def __post_init__(self):
        c = self.config
        if len(self.grid_hw) != 2 or min(self.grid_hw) < 1:
            raise ValueError(f"grid_hw must be two positive ints, got {self.grid_hw}")
        if c.query_tile is not None and self.chunk_tokens % c.query_tile:
            raise ValueError(
                f"query_tile={c.query_tile} does not divide the {self.chunk_tokens} tokens of "
                "a chunk"
            )
        if c.sparse:
            if c.local_topk > self.window_slots:
                raise ValueError(
                    f"local_topk={c.local_topk} blocks is larger than the local window "
                    f"({c.window_frames} frames = {self.window_slots} blocks of {c.block_size} "
                    "tokens)"
                )
            if c.memory_blocks > self.window_slots:
                raise ValueError(
                    f"memory budget memory_blocks={c.memory_blocks} is larger than the window "
                    f"({self.window_slots} blocks): memory only keeps blocks the window evicts"
                )
            if 0 < c.compressed_tokens < self.chunk_blocks:
                raise ValueError(
                    f"compressed_tokens={c.compressed_tokens} must be 0 or at least the "
                    f"{self.chunk_blocks} blocks of a chunk (one chunk is compressed at a time)"
                )

    @property
    def tokens_per_frame(self) -> int:
        return self.grid_hw[0] * self.grid_hw[1]

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def blocks_per_frame(self) -> int:
        """Blocks of one frame, the last one partial when `block_size` does not divide it."""
        return -(-self.tokens_per_frame // self.config.block_size)

    @property
    def last_block_tokens(self) -> int:
        """Tokens of a frame's last block (`block_size` unless the frame ends a partial block)."""
        return self.tokens_per_frame - (self.blocks_per_frame - 1) * self.config.block_size

    @property
    def ragged(self) -> bool:
        """Whether a frame ends in a partial block (padded in the cache, masked when read)."""
        return self.last_block_tokens != self.config.block_size

    @property
    def chunk_blocks(self) -> int:
        return self.blocks_per_frame * self.config.chunk_frames

    @property
    def chunk_tokens(self) -> int:
        return self.tokens_per_frame * self.config.chunk_frames

    @property
    def query_tile(self) -> int:
        return self.config.query_tile or self.tokens_per_frame

    @property
    def num_query_tiles(self) -> int:
        return self.chunk_tokens // self.query_tile

    @property
    def sink_slots(self) -> int:
        return self.config.sink_frames * self.blocks_per_frame

    @property
    def memory_slots(self) -> int:
        return self.config.memory_blocks

    @property
    def window_slots(self) -> int:
        return self.config.window_frames * self.blocks_per_frame

    @property
    def memory_start(self) -> int:
        return self.sink_slots

    @property
    def window_start(self) -> int:
        return self.sink_slots + self.memory_slots

    @property
    def num_slots(self) -> int:
        return self.sink_slots + self.memory_slots + self.window_slots

    @property
    def max_selected(self) -> int:
        """Blocks one query tile attends in the cache: sink + local top-k + memory top-k."""
        c = self.config
        return self.sink_slots + c.local_topk + c.memory_topk

    def cache_tokens(self) -> int:
        """Key/value tokens stored per layer and head (cache + compressed ring; with partial
        blocks, their padding included)."""
        return self.num_slots * self.block_size + self.config.compressed_tokens

    def peak_tokens(self) -> int:
        """Key/value tokens alive per layer and head while a chunk is denoised (cache + chunk)."""
        return self.cache_tokens() + self.chunk_tokens
