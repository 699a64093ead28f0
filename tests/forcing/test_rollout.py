"""Chunked rollout: cached == uncached block-causal forward, compile once, flat per-chunk cost."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.forcing.conftest import SMALL

from vidax.forcing import ChunkStepper, ForcingConfig, forward_full, generate_latents, stream
from vidax.forcing.rollout import TRACE_COUNT, chunk_noise
from vidax.sampling import predict_x0, renoise

HW, C = (4, 4), SMALL.in_channels  # latent 4x4 -> 2x2 tokens per frame
DENSE = ForcingConfig(
    chunk_frames=2, timesteps=(1000.0, 500.0), shift=3.0, sink_frames=2, window_frames=4,
    block_size=2,
)  # fmt: skip


def _uncached_rollout(model, key, context, cfg: ForcingConfig, num_chunks: int):
    """The same sampler, every forward a full-sequence block-causal pass (no cache)."""
    full = jax.jit(lambda x, t: forward_full(model, x, t, context, cfg))
    sigmas = cfg.sigmas
    b, f = context.shape[0], cfg.chunk_frames
    video = []
    for c in range(num_chunks):
        noise = chunk_noise(jax.random.fold_in(key, c), (b, f, *HW, C), cfg.num_steps)
        x = noise[0]
        for i in range(cfg.num_steps):
            seq = jnp.concatenate([*video, x], axis=1)
            t = np.concatenate([np.zeros(c * f), np.full(f, sigmas[i] * 1000.0)])
            v = full(seq, jnp.asarray(np.broadcast_to(t, (b, len(t))), jnp.float32))[:, -f:]
            x0 = predict_x0(x, sigmas[i], v)
            if i + 1 < cfg.num_steps:
                x = renoise(x0, noise[i + 1], sigmas[i + 1])
        video.append(x0)
    return jnp.concatenate(video, axis=1)


def test_cached_rollout_equals_uncached_block_causal(small_model, context):
    key = jax.random.key(3)
    layout = small_model.layout(DENSE, HW)
    cached = generate_latents(small_model, key, context, layout, 3, latent_hw=HW, channels=C)
    assert cached.shape == (1, 6, *HW, C)
    uncached = _uncached_rollout(small_model, key, context, DENSE, 3)
    np.testing.assert_allclose(cached, uncached, atol=2e-4, rtol=2e-4)
    # Chunks really condition on their past: another first chunk changes the later ones.
    other = generate_latents(
        small_model, jax.random.key(4), context, layout, 3, latent_hw=HW, channels=C
    )
    assert float(jnp.abs(other - cached).max()) > 1e-2


@pytest.mark.slow
def test_sparse_selecting_everything_equals_dense_rollout(zero_init_model, context):
    """Zero-initialised sparse heads + budgets covering the cache = the dense rollout."""
    model = zero_init_model
    sparse = dataclasses.replace(
        DENSE, attention="sparse", local_topk=8, memory_blocks=0, memory_topk=0
    )
    key = jax.random.key(5)
    outs = [
        generate_latents(model, key, context, model.layout(cfg, HW), 3, latent_hw=HW, channels=C)
        for cfg in (DENSE, sparse)
    ]
    np.testing.assert_allclose(outs[1], outs[0], atol=2e-4, rtol=2e-4)


def test_stream_compiles_once_and_matches_scan(small_model, context):
    layout = small_model.layout(DENSE, HW)
    key = jax.random.key(9)
    stepper = ChunkStepper(small_model, layout, latent_hw=HW, channels=C)
    before = TRACE_COUNT["sample_chunk"]
    chunks = list(stream(stepper, key, context, 3))
    assert TRACE_COUNT["sample_chunk"] - before == 1  # one trace for 3 chunks
    assert stepper._step._cache_size() == 1
    # The fixed-size cache a rollout leaves behind has the shapes it started with.
    cache = stepper.init(1)
    shapes = jax.tree.map(lambda x: x.shape, cache)
    for c in range(8):
        _, cache = stepper(cache, c, key, context)
    assert jax.tree.map(lambda x: x.shape, cache) == shapes
    assert TRACE_COUNT["sample_chunk"] - before == 1 and stepper._step._cache_size() == 1
    # Same noise per chunk as the scanned rollout (compiled by the test above for 3 chunks).
    scanned = generate_latents(small_model, key, context, layout, 3, latent_hw=HW, channels=C)
    np.testing.assert_allclose(jnp.concatenate(chunks, axis=1), scanned, atol=1e-5)
    # The scanned rollout traces its chunk step once too, whatever the number of chunks.
    before = TRACE_COUNT["sample_chunk"]
    generate_latents(small_model, key, context, layout, 5, latent_hw=HW, channels=C)
    assert TRACE_COUNT["sample_chunk"] - before == 1


def test_per_chunk_cost_is_flat(small_model, context):
    """The chunk step is one program with fixed buffers: its cost cannot depend on the chunk."""
    layout = small_model.layout(DENSE, HW)
    stepper = ChunkStepper(small_model, layout, latent_hw=HW, channels=C)
    cache = stepper.init(1)
    key = jax.random.key(0)
    lowered = [stepper.lower(cache, c, key, context) for c in (1, 10, 50)]
    assert len({low.as_text() for low in lowered}) == 1  # identical HLO for chunk 1, 10, 50
    flops = lowered[0].cost_analysis()["flops"]
    # The measure is sensitive to the cache: a 4x longer window costs more per chunk.
    wide = small_model.layout(dataclasses.replace(DENSE, window_frames=16), HW)
    wide_step = ChunkStepper(small_model, wide, latent_hw=HW, channels=C)
    wide_flops = wide_step.lower(wide_step.init(1), 1, key, context).cost_analysis()["flops"]
    assert wide_flops > flops > 0
