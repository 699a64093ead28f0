"""Chunked autoregressive generation (Self-Forcing inference) over the fixed-size KV cache.

Per chunk `c` (frames `c*C .. c*C+C-1`):

    x = noise_0
    for i, sigma in enumerate(sigmas[:-1]):              # a few steps, lax.fori_loop
        x0 = x - sigma * model(x, 1000 sigma | cache)
        x = (1 - sigma_{i+1}) x0 + sigma_{i+1} noise_{i+1}   # fresh noise (not on the last step)
    cache = clean_pass(x0, t = context_timestep)          # writes K/V (+ memory update)

`sample_chunk` is that step as a pure function; `rollout` runs it under `lax.scan` over the
chunks (one compiled program whatever the number of chunks: the chunk index is traced, the
cache has a fixed shape); `ChunkStepper` jits it once with the cache donated, for streaming,
where each chunk is decoded (`StreamDecoder`) and handed out as soon as it exists.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from vidax.forcing.cache import KVCache
from vidax.forcing.model import CausalWan, forward_chunk
from vidax.models.causal import CacheLayout
from vidax.sampling import cfg_combine, predict_x0, renoise

# Test hook: incremented each time `sample_chunk` is traced (or run eagerly).
TRACE_COUNT = {"sample_chunk": 0}


def chunk_noise(key: jax.Array, shape: tuple[int, ...], num_steps: int) -> jax.Array:
    """(num_steps, *shape) float32 noise of one chunk: the start noise and each re-noise."""
    return jax.random.normal(key, (num_steps, *shape), jnp.float32)


def sample_chunk(
    model: CausalWan,
    cache: KVCache,
    chunk: jax.Array,
    noise: Float[Array, "steps b t h w c"],
    context: Float[Array, "b s e"],
    layout: CacheLayout,
    *,
    exit_step: jax.Array | int | None = None,
) -> tuple[Float[Array, "b t h w c"], KVCache]:
    """Denoises one chunk in the config's few steps and writes it to the cache.

    Args:
      model: the causal model.
      cache: the cache of all layers.
      chunk: int32 scalar chunk index (may be traced).
      noise: (num_steps, b, chunk_frames, h, w, c) noise (`chunk_noise`).
      context: (b, s, text_dim) text embeddings.
      layout: the cache layout.
      exit_step: stop after this step (0-based) and return its x0 (training); default: all.

    Returns:
      (x0 (b, chunk_frames, h, w, c) float32, the cache with the chunk written).

    With `layout.config.guidance` > 1 the cache holds 2b rows (`CausalWan.init_cache`): the
    prompts', then the empty caption's; each step's velocity is guided (`chunk_velocity`) and
    the clean pass writes the chunk to both.
    """
    TRACE_COUNT["sample_chunk"] += 1
    cfg = layout.config
    sigmas = jnp.asarray(cfg.sigmas)
    last = cfg.num_steps - 1 if exit_step is None else exit_step
    context = guided_context(context, layout)

    def velocity(x, i):
        return chunk_velocity(model, x, sigmas[i], context, cache, chunk, layout)

    def step(i, x):
        x0 = predict_x0(x, sigmas[i], velocity(x, i))
        return renoise(x0, noise[i + 1], sigmas[i + 1])

    x = jax.lax.fori_loop(0, last, step, noise[0])
    x0 = predict_x0(x, sigmas[last], velocity(x, last))
    return x0, write_clean(model, x0, context, cache, chunk, layout)


def guided_context(context: Float[Array, "b s e"], layout: CacheLayout) -> jax.Array:
    """The context `chunk_velocity` and `write_clean` take: with a guided layout, the empty
    caption's (zero) rows after the prompts' (2b rows, as its cache has); else `context`."""
    if not layout.config.guided:
        return context
    return jnp.concatenate([context, jnp.zeros_like(context)])


def chunk_velocity(
    model: CausalWan,
    x: Float[Array, "b t h w c"],
    sigma: jax.Array,
    context: jax.Array,
    cache: KVCache,
    chunk: jax.Array,
    layout: CacheLayout,
) -> Float[Array, "b t h w c"]:
    """The velocity of chunk `x` at noise level `sigma` given the cache.

    With a guided layout (`ForcingConfig.guidance` > 1) one pass over [x; x] with
    `guided_context`'s [prompts; empty] against the cache's 2b rows, combined by
    classifier-free guidance v_u + g (v_c - v_u).
    """
    cfg = layout.config
    b = x.shape[0]
    rows = 2 if cfg.guided else 1
    t = jnp.full((rows * b,), sigma * 1000.0, jnp.float32)
    v, _ = forward_chunk(model, jnp.tile(x, (rows, 1, 1, 1, 1)), t, context, cache, chunk, layout)
    assert v is not None  # a prediction pass returns the velocity
    return cfg_combine(v[:b], v[b:], cfg.guidance) if cfg.guided else v


def write_clean(model, x0, context, cache, chunk, layout: CacheLayout) -> KVCache:
    """The clean pass: re-encodes the finished chunk at `context_timestep` into the cache (into
    both branches' rows of a guided layout's, `context` from `guided_context`)."""
    if layout.config.guided:
        x0 = jnp.tile(x0, (2, 1, 1, 1, 1))
    t = jnp.full((x0.shape[0],), layout.config.context_timestep, jnp.float32)
    _, cache = forward_chunk(model, x0, t, context, cache, chunk, layout, write=True)
    return cache


def rollout(
    model: CausalWan,
    key: jax.Array,
    context: Float[Array, "b s e"],
    layout: CacheLayout,
    num_chunks: int,
    *,
    latent_hw: tuple[int, int],
    channels: int,
) -> Float[Array, "b t h w c"]:
    """Generates `num_chunks` chunks under one `lax.scan` (call it inside `jax.jit`).

    Chunk `c` draws its noise from `jax.random.fold_in(key, c)`, so a streamed rollout with the
    same key produces the same video.

    Returns:
      (b, num_chunks * chunk_frames, h, w, c) float32 clean latents.
    """
    cfg = layout.config
    b = context.shape[0]
    shape = (b, cfg.chunk_frames, *latent_hw, channels)
    cache = model.init_cache(layout, b)

    def body(cache, chunk):
        noise = chunk_noise(jax.random.fold_in(key, chunk), shape, cfg.num_steps)
        x0, cache = sample_chunk(model, cache, chunk, noise, context, layout)
        return cache, x0

    _, chunks = jax.lax.scan(body, cache, jnp.arange(num_chunks, dtype=jnp.int32))
    out = jnp.moveaxis(chunks, 0, 1)  # (b, n, chunk_frames, h, w, c)
    return out.reshape(b, num_chunks * cfg.chunk_frames, *out.shape[3:])


class ChunkStepper:
    """One jitted chunk step, compiled once and reused for every chunk of every rollout.

    The cache argument is donated, so XLA updates it in place:

        stepper = ChunkStepper(model, layout, latent_hw=(8, 8), channels=4)
        cache = stepper.init(batch=1)
        for c in range(n):
            x0, cache = stepper(cache, c, key, context)
    """

    def __init__(
        self, model: CausalWan, layout: CacheLayout, *, latent_hw: tuple[int, int], channels: int
    ):
        self.model = model
        self.layout = layout
        self.latent_hw = tuple(latent_hw)
        self.channels = channels
        graphdef, self._state = nnx.split(model)
        self._step = _compiled_step(graphdef, layout, self.latent_hw, channels)

    def init(self, batch: int) -> KVCache:
        return self.model.init_cache(self.layout, batch)

    def __call__(
        self, cache: KVCache, chunk: int, key: jax.Array, context
    ) -> tuple[Array, KVCache]:
        return self._step(self._state, cache, jnp.asarray(chunk, jnp.int32), key, context)

    def lower(self, cache: KVCache, chunk: int, key: jax.Array, context):
        """The lowered step (for cost analysis)."""
        return self._step.lower(self._state, cache, jnp.asarray(chunk, jnp.int32), key, context)


class StreamDecoder:
    """Decodes latent chunks to pixels as they arrive, carrying the causal VAE's conv cache.

    Feeding the chunks of a video in order gives exactly `vae.decode` of the whole video: the
    decoder runs one latent frame at a time either way (frame 0 alone, then 4 pixel frames per
    latent frame). Two programs are compiled (the first frame, any later frame).
    """

    def __init__(self, vae):
        graphdef, self._state = nnx.split(vae)
        self._first, self._later = _compiled_decoder(graphdef)
        self._cache = None

    def __call__(self, z: Float[Array, "b t h w c"]) -> np.ndarray:
        """Pixels (b, f, H, W, 3) float32 in [0, 1] of the next latent frames `z`."""
        out = []
        for i in range(z.shape[1]):
            frame = z[:, i : i + 1]
            if self._cache is None:
                y, self._cache = self._first(self._state, frame)
            else:
                y, self._cache = self._later(self._state, frame, self._cache)
            out.append(np.asarray(y))
        pixels = np.concatenate(out, axis=1)
        return (np.clip(pixels, -1.0, 1.0) + 1.0) / 2.0


# Compiled programs are cached on static values (the graph, the cache layout, the latent size), so
# a new stepper or decoder for a model already seen (a server's next request) compiles nothing.
@functools.lru_cache(maxsize=8)
def _compiled_step(graphdef, layout: CacheLayout, latent_hw: tuple[int, int], channels: int):
    cfg = layout.config

    def step(state, cache, chunk, key, context):
        m = nnx.merge(graphdef, state)
        shape = (context.shape[0], cfg.chunk_frames, *latent_hw, channels)
        noise = chunk_noise(jax.random.fold_in(key, chunk), shape, cfg.num_steps)
        return sample_chunk(m, cache, chunk, noise, context, layout)

    return jax.jit(step, donate_argnums=(1,))


@functools.lru_cache(maxsize=4)
def _compiled_decoder(graphdef):
    def first(state, z):
        vae = nnx.merge(graphdef, state)
        x, _ = vae.post_quant_conv(vae.denormalize(z))
        return vae.decoder(x, None)

    def later(state, z, cache):
        vae = nnx.merge(graphdef, state)
        x, _ = vae.post_quant_conv(vae.denormalize(z))
        return vae.decoder(x, cache)

    return jax.jit(first), jax.jit(later)


def stream(
    stepper: ChunkStepper,
    key: jax.Array,
    context: Float[Array, "b s e"],
    num_chunks: int,
) -> Iterator[Float[Array, "b t h w c"]]:
    """Yields the clean latents of each chunk as soon as it is generated."""
    cache = stepper.init(context.shape[0])
    for c in range(num_chunks):
        x0, cache = stepper(cache, c, key, context)
        yield x0


def generate_latents(
    model: CausalWan,
    key: jax.Array,
    context: Float[Array, "b s e"],
    layout: CacheLayout,
    num_chunks: int,
    *,
    latent_hw: tuple[int, int],
    channels: int,
) -> Float[Array, "b t h w c"]:
    """`rollout` compiled (once per model structure, layout and length) and run."""
    graphdef, state = nnx.split(model)
    return _rollout_state(graphdef, layout, num_chunks, tuple(latent_hw), channels)(
        state, key, context
    )


@functools.lru_cache(maxsize=16)
def _rollout_state(graphdef, layout, num_chunks, latent_hw, channels):
    @jax.jit
    def run(state, key, context):
        model = nnx.merge(graphdef, state)
        return rollout(
            model, key, context, layout, num_chunks, latent_hw=latent_hw, channels=channels
        )

    return run
