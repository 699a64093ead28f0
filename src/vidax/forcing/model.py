"""The causal wrapper: a Wan transformer run chunk by chunk over a KV cache.

`CausalWan` holds the weights: an unchanged `WanTransformer` (same architecture and checkpoint
layout as the bidirectional model it is initialised from) plus the per-layer `SparseParams` of
Sparse Forcing. Which attention runs is not part of the weights: every function takes the
`ForcingConfig`, so one checkpoint serves the dense (Self-Forcing) and the sparse path.

- `forward_chunk`: one chunk against the cache (block-causal by construction); optionally writes
  the chunk's keys and values into the cache (the clean pass). The blocks are scanned here with
  the cache threaded through the scan carry, so every layer's cache is read and written in place.
- `forward_full`: the uncached equivalent over a whole sequence with a block-causal (sink +
  window) mask and per-frame timesteps; used for teacher-/diffusion-forcing training and as the
  test oracle of the cached path.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from vidax.checkpoint import CheckpointError, Rule, load_model, open_checkpoint, save_model
from vidax.forcing.attention import (
    RETIRED_SPARSE_PARAMS,
    SPARSE_PARAM_NAMES,
    SparseParams,
    dense_attention,
    make_rope,
    make_sparse_params,
    sparse_attention,
    spatial_keys,
)
from vidax.forcing.cache import KVCache, init_cache, write_chunk
from vidax.models.causal import CacheLayout, ForcingConfig
from vidax.models.dit_stages import VideoDiT
from vidax.models.wan import WanConfig, WanTransformer
from vidax.models.wan import key_map as wan_key_map
from vidax.nn import video_positions
from vidax.nn.scan import scan_layers


class CausalWan(nnx.Module):
    """Weights of a causal (chunk-autoregressive) Wan model: transformer + sparse-attention heads.

    Attributes:
      transformer: the `WanTransformer` (blocks run with RoPE applied by the cache attention).
      sparse: `SparseParams` stacked over layers (unused by dense attention).
    """

    def __init__(self, config: WanConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.transformer = WanTransformer(config, rngs=rngs)
        self.sparse: SparseParams = make_sparse_params(
            config.num_layers, config.num_heads, config.head_dim
        )

    @classmethod
    def from_transformer(cls, transformer: VideoDiT) -> CausalWan:
        """Wraps trained bidirectional weights (sparse heads zero: sparse starts as dense).

        Raises:
          ValueError: `transformer` is not a Wan transformer (the causal model builds on one).
        """
        if not isinstance(transformer, WanTransformer):
            raise ValueError(
                f"a causal model builds on a Wan transformer, got {type(transformer).__name__}"
            )
        model = nnx.eval_shape(lambda: cls(transformer.config, rngs=nnx.Rngs(0)))
        model.transformer = transformer
        model.sparse = make_sparse_params(
            transformer.config.num_layers, transformer.config.num_heads, transformer.config.head_dim
        )
        return model

    def layout(self, forcing: ForcingConfig, latent_hw: tuple[int, int]) -> CacheLayout:
        """The cache layout for latents of spatial size `latent_hw` (checked against the patch)."""
        _, ph, pw = self.config.patch_size
        h, w = latent_hw
        if h % ph or w % pw:
            raise ValueError(f"latent size {latent_hw} is not divisible by the patch ({ph}, {pw})")
        if self.config.patch_size[0] != 1:
            raise ValueError("chunked generation needs a temporal patch of 1")
        return forcing.layout((h // ph, w // pw))

    def init_cache(self, layout: CacheLayout, batch: int) -> KVCache:
        """The empty cache of `batch` videos (2 * batch rows when the layout's config is
        guided: the unconditional branch's rows follow the prompts')."""
        c = self.config
        return init_cache(
            layout,
            num_layers=c.num_layers,
            batch=2 * batch if layout.config.guided else batch,
            num_heads=c.num_heads,
            head_dim=c.head_dim,
            dtype=c.compute_dtype,
        )


def forward_chunk(
    model: CausalWan,
    x: Float[Array, "b t h w c"],
    timestep: Float[Array, " b"],
    context: Float[Array, "b s e"],
    cache: KVCache,
    chunk: jax.Array,
    layout: CacheLayout,
    *,
    write: bool = False,
) -> tuple[Float[Array, "b t h w c"] | None, KVCache]:
    """Flow prediction for one chunk given the cache; with `write`, the clean cache pass.

    Args:
      model: the causal model.
      x: (b, chunk_frames, h, w, c) latent chunk.
      timestep: (b,) timesteps in [0, 1000].
      context: (b, s, text_dim) text embeddings.
      cache: the cache of all layers.
      chunk: int32 scalar index of the chunk (may be traced).
      layout: the cache layout (its config chooses dense or sparse attention).
      write: write the chunk's keys/values (and memory updates) into the cache; the flow
        prediction is then not computed (None).

    Returns:
      (v (b, chunk_frames, h, w, c) float32 or None, the cache, updated when `write`).
    """
    tr = model.transformer
    cfg = layout.config
    if x.shape[1] != cfg.chunk_frames:
        raise ValueError(f"a chunk has {cfg.chunk_frames} latent frames, got input {x.shape}")
    chunk = jnp.asarray(chunk, jnp.int32)
    start = chunk * cfg.chunk_frames
    tokens, grid = tr.embed(x)
    if grid[1:] != layout.grid_hw:
        raise ValueError(f"chunk token grid {grid[1:]} does not match the layout {layout.grid_hw}")
    cond = tr.condition(timestep, context)
    rope = make_rope(tr.config.rope_axes_dims, tr.config.rope_theta)

    def step(layers, carry, i):
        block, params = layers
        h, cache = carry
        layer = cache.layer(i)

        def attend(q, k, v):
            mass: jax.Array | None  # dense attention keeps no block mass
            if cfg.sparse:
                o, mass = sparse_attention(q, k, v, layer, start, layout, rope, params)
            else:
                o, mass = dense_attention(q, k, v, layer, start, layout, rope)
            return o, (k, v, mass)

        h, (k, v, mass) = block.call_with_aux(h, cond, None, attend)
        if write:
            k = spatial_keys(k, layout, rope)  # what the cache stores (attention module)
            cache = cache.set_layer(i, write_chunk(layer, k, v, chunk, layout, mass=mass))
        return h, cache

    tokens, cache = scan_layers(
        (tr.blocks, model.sparse),
        (tokens, cache),
        step,
        xs=jnp.arange(tr.config.num_layers),
        remat=tr.config.remat,
    )
    if write:
        return None, cache
    return tr.unembed(tokens, cond, grid), cache


def block_causal_mask(num_frames: int, tokens_per_frame: int, forcing: ForcingConfig) -> Array:
    """(l, l) bool: token of frame a may attend frame a' iff chunk(a') <= chunk(a) and a' lies
    in the sink or in the window of chunk(a) (the mask of the cached rollout)."""
    chunk = np.arange(num_frames) // forcing.chunk_frames
    q, k = chunk[:, None], chunk[None, :]
    ok = (k <= q) & ((k >= q - forcing.window_chunks) | (k < forcing.sink_chunks))
    ok = np.repeat(np.repeat(ok, tokens_per_frame, 0), tokens_per_frame, 1)
    return jnp.asarray(ok)


def masked_attention(
    q: Float[Array, "b l n k"], k: Float[Array, "b l n k"], v: Float[Array, "b l n k"], mask
) -> Float[Array, "b l n k"]:
    """softmax(q k^T / sqrt(k) | mask) v, float32, laid out as head-major batched matmuls
    (several times faster than token-major einsums on XLA:CPU). `mask` (l, s) bool."""
    scale = q.shape[-1] ** -0.5
    qh, kh, vh = (a.swapaxes(1, 2).astype(jnp.float32) for a in (q, k, v))
    logits = jnp.where(mask, (qh * scale) @ kh.swapaxes(-1, -2), jnp.finfo(jnp.float32).min)
    return (jax.nn.softmax(logits, axis=-1) @ vh).swapaxes(1, 2).astype(q.dtype)


def forward_full(
    model: CausalWan,
    x: Float[Array, "b t h w c"],
    timesteps: Float[Array, "b t"],
    context: Float[Array, "b s e"],
    forcing: ForcingConfig,
) -> Float[Array, "b t h w c"]:
    """Uncached block-causal forward of a whole sequence with per-frame timesteps (dense).

    Every chunk sees itself and the earlier chunks of its sink and window, at absolute RoPE
    positions: the same function the cached rollout computes while the video is no longer than
    `horizon + chunk_frames` (positions are re-aligned past that, which one sequence cannot
    express).

    Args:
      model: the causal model.
      x: (b, t, h, w, c) latents, t a multiple of `chunk_frames`.
      timesteps: (b, t) timestep of every latent frame (e.g. 0 for clean context).
      context: (b, s, text_dim) text embeddings.
      forcing: chunking, sink and window.

    Returns:
      (b, t, h, w, c) float32 flow prediction.
    """
    tr = model.transformer
    b, t = x.shape[:2]
    forcing.num_chunks(t)
    if t - forcing.chunk_frames > forcing.horizon:
        raise ValueError(
            f"forward_full covers at most horizon + chunk = "
            f"{forcing.horizon + forcing.chunk_frames} frames, got {t}"
        )
    if timesteps.shape != (b, t):
        raise ValueError(f"timesteps must be (b, t) = {(b, t)}, got {timesteps.shape}")
    tokens, grid = tr.embed(x)
    per_frame = grid[1] * grid[2]
    cond = tr.condition(jnp.repeat(timesteps.astype(jnp.float32), per_frame, axis=1), context)
    angles = tr.rope(grid, video_positions(*grid))
    mask = block_causal_mask(t, per_frame, forcing)
    attend = lambda q, k, v: masked_attention(q, k, v, mask)
    tokens = tr.run_blocks(tokens, cond, angles, self_attention=attend)
    return tr.unembed(tokens, cond, grid)


# -- checkpoints ----------------------------------------------------------------------------------


def key_map(config: WanConfig, *, retired_gates: bool = False) -> list[Rule]:
    """Checkpoint layout: the diffusers Wan keys plus `sparse_attention.{i}.*` per layer.

    With `retired_gates`, the branch weight is read from the retired gate format (`gate_kernel`
    (n, k, 2), `gate_bias` (n, 2): the compressed branch's column), which only `load` uses and
    only for all-zero gates (where both formats are the dense layer restricted to the selection).
    """
    rules = [
        Rule(r.source, f"transformer.{r.target}", r.transform, r.inverse)
        for r in wan_key_map(config)
    ]
    for name in SPARSE_PARAM_NAMES:
        rules.append(Rule(f"sparse_attention.{{i}}.{name}", f"sparse.{name}"))
    if retired_gates:
        legacy = {"branch_kernel": "gate_kernel", "branch_bias": "gate_bias"}
        rules = [
            Rule(f"sparse_attention.{{i}}.{legacy[n]}", r.target, lambda x: x[..., 1])
            if (n := r.target.removeprefix("sparse.")) in legacy
            else r
            for r in rules
        ]
    return rules


def save(
    model: CausalWan,
    path: str | os.PathLike,
    *,
    metadata: dict | None = None,
    dtype: str | np.dtype | None = None,
) -> None:
    """Writes the model's weights (safetensors, `key_map` layout), cast to `dtype` if given."""
    save_model(
        model,
        path,
        key_map(model.config),
        metadata=metadata,
        dtype=None if dtype is None else jnp.dtype(dtype),
    )


def load(path: str | os.PathLike, config: WanConfig) -> CausalWan:
    """A `CausalWan` from a checkpoint written by `save`.

    Raises:
      CheckpointError: the file does not match `config`, or it holds the retired unnormalised
        branch gates (`gate_kernel`/`gate_bias`, before the affine combination) with non-zero
        values: those heads were trained for a different output and are not reinterpreted.
        All-zero retired gates (e.g. a dense model's untouched heads) load as a zero branch
        weight, the same function.
    """
    reader = open_checkpoint(path)
    retired = any(f"sparse_attention.0.{n}" in reader for n in RETIRED_SPARSE_PARAMS)
    if retired:
        trained = sorted(
            key
            for key in reader
            if key.startswith("sparse_attention.")
            and key.rsplit(".", 1)[-1] in RETIRED_SPARSE_PARAMS
            and np.any(np.asarray(reader[key]) != 0)
        )
        if trained:
            raise CheckpointError(
                f"{path}: trained sparse heads in the retired gate format ({trained[0]}: "
                "o = (1 + g_sel) o_sel + g_cmp o_cmp) do not carry over to the affine branch "
                "combination; retrain the sparse stage (vidax train causal --only sparse)"
            )
    rules = key_map(config, retired_gates=retired)
    return load_model(lambda: CausalWan(config, rngs=nnx.Rngs(0)), path, rules)
