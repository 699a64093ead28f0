"""Chunked rollout: cached == uncached block-causal forward, compile once, per-chunk cost and KV
as the layout dictates, the Pallas kernels (interpreted) == the reference path."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.forcing.conftest import SMALL

from vidax.forcing import ChunkStepper, ForcingConfig, forward_full, generate_latents, stream
from vidax.forcing import attention as forcing_attention
from vidax.forcing.rollout import TRACE_COUNT, chunk_noise
from vidax.kernels.pbsa import pbsa
from vidax.sampling import predict_x0, renoise

HW, C = (4, 4), SMALL.in_channels  # latent 4x4 -> 2x2 tokens per frame
DENSE = ForcingConfig(
    chunk_frames=2, timesteps=(1000.0, 500.0), shift=3.0, sink_frames=2, window_frames=4,
    block_size=2,
)  # fmt: skip


def _uncached_rollout(model, key, context, cfg: ForcingConfig, num_chunks: int):
    """The same sampler, every forward a full-sequence block-causal pass (no cache); guided
    configs combine the prompt's and the empty caption's passes over the same past."""
    cond = jax.jit(lambda x, t: forward_full(model, x, t, context, cfg))
    empty = jax.jit(lambda x, t: forward_full(model, x, t, jnp.zeros_like(context), cfg))

    def full(x, t):
        if not cfg.guided:
            return cond(x, t)
        v_u = empty(x, t)
        return v_u + cfg.guidance * (cond(x, t) - v_u)

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


def test_guided_rollout_equals_uncached_cfg(small_model, context):
    """guidance > 1: each step v_u + g (v_c - v_u), the empty caption's rows beside the
    prompt's in one cache of twice the batch, both conditioned on the same generated past."""
    guided = dataclasses.replace(DENSE, guidance=2.5)
    layout = small_model.layout(guided, HW)
    # (layers, batch, ...) leaves: two cache rows per video.
    assert {x.shape[1] for x in jax.tree.leaves(small_model.init_cache(layout, 1))} == {2}
    key = jax.random.key(3)
    cached = generate_latents(small_model, key, context, layout, 3, latent_hw=HW, channels=C)
    uncached = _uncached_rollout(small_model, key, context, guided, 3)
    np.testing.assert_allclose(cached, uncached, atol=5e-4, rtol=5e-4)
    plain = generate_latents(
        small_model, key, context, small_model.layout(DENSE, HW), 3, latent_hw=HW, channels=C
    )
    assert float(jnp.abs(plain - cached).max()) > 1e-2
    with pytest.raises(ValueError, match="guidance must be >= 1"):
        dataclasses.replace(DENSE, guidance=0.5)


def test_partial_blocks_do_not_change_the_dense_rollout(small_model, context):
    """Blocks of 3 on 4-token frames (a full block and a partial one of 1 token per frame)
    give the rollout of blocks that divide the frame: the padding is never attended.

    Fails on a partial block's padding read as keys, or a frame's tokens cut across blocks."""
    key = jax.random.key(3)
    outs = []
    for block in (2, 3):
        layout = small_model.layout(dataclasses.replace(DENSE, block_size=block), HW)
        assert layout.ragged == (block == 3)
        # 6 chunks: past the horizon (re-aligned positions), a length no other test compiles.
        outs.append(
            generate_latents(small_model, key, context, layout, 6, latent_hw=HW, channels=C)
        )
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-5, rtol=1e-5)


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


def test_chunk_step_flops_grow_linearly_with_the_attended_span(small_model, context):
    """The compiled chunk step's FLOPs (XLA cost analysis of its HLO) grow with the cache span
    by the attention matmuls over the extra cached tokens, linearly.

    Fails when the attention stops reading the cache (no growth), reads it more than once per
    pass or attends cache to cache (super-linear growth), or when the step stops attending the
    cache in one of its passes (growth below one layer's matmuls).
    """
    key = jax.random.key(0)
    flops = {}
    for window in (4, 8, 16):
        layout = small_model.layout(dataclasses.replace(DENSE, window_frames=window), HW)
        stepper = ChunkStepper(small_model, layout, latent_hw=HW, channels=C)
        flops[window] = stepper.lower(stepper.init(1), 1, key, context).cost_analysis()["flops"]
    per_frame = (flops[8] - flops[4]) / 4
    np.testing.assert_allclose((flops[16] - flops[8]) / 8, per_frame, rtol=0.02)
    # q.k and p.v over one frame's tokens for every query of the chunk, in each of the
    # num_steps denoising passes and the clean pass: 2 matmuls x 2 FLOPs per multiply-add.
    tokens = HW[0] * HW[1] // 4  # 2x2 patches
    one_layer = (
        (DENSE.num_steps + 1) * SMALL.num_heads * DENSE.chunk_frames * tokens * tokens
        * 4 * SMALL.head_dim
    )  # fmt: skip
    # XLA counts a scanned layer body once or per layer; softmax and masking add a little.
    assert one_layer <= per_frame <= 1.5 * SMALL.num_layers * one_layer, per_frame / one_layer


def test_live_kv_grows_to_the_layout_budget_then_stays_flat(small_model, context):
    """Per chunk, the KV the cache holds grows by one chunk until sink + window are full, then
    stays flat, holding exactly the sink and the last window (every layer alike).

    Fails on a cache that keeps growing, evicts the wrong chunk, forgets the sink, or writes a
    chunk more than once (at a denoising pass instead of the clean one).
    """
    layout = small_model.layout(DENSE, HW)
    stepper = ChunkStepper(small_model, layout, latent_hw=HW, channels=C)
    cache = stepper.init(1)
    key = jax.random.key(2)
    f, itemsize = DENSE.chunk_frames, cache.k.dtype.itemsize
    chunk_bytes = (
        2 * SMALL.num_layers * SMALL.num_heads * layout.chunk_tokens * SMALL.head_dim * itemsize
    )
    live = []
    for c in range(7):
        _, cache = stepper(cache, c, key, context)
        frame = np.asarray(cache.frame)  # (L, b, n, slots)
        held = frame >= 0
        assert (held == held[:1, :1, :1]).all()  # every layer and head alike
        # Bytes of the valid key and value blocks, over layers and heads.
        live.append(int(held.sum()) * layout.block_size * 2 * SMALL.head_dim * itemsize)
        kept = range(max(DENSE.sink_chunks, c - DENSE.window_chunks + 1), c + 1)
        want = set(range(DENSE.sink_frames)) | {k * f + i for k in kept for i in range(f)}
        assert set(frame[0, 0, 0][held[0, 0, 0]].tolist()) == want
    budget = DENSE.sink_chunks + DENSE.window_chunks
    want_bytes = [min(c + 1, budget) * chunk_bytes for c in range(7)]
    assert live == want_bytes


# Sparse Forcing on 2x6 = 12 tokens per frame in blocks of 6: not a power of two, so the Triton
# kernel reads clamped 16-key windows (the last blocks of the pool end it); a 1-frame sink,
# 2-frame window, 2 memory blocks and a compressed ring, so 5 chunks evict into the memory and
# read it back; early chunks select empty slots (no valid token).
PALLAS_HW = (4, 12)
SPARSE_ODD = ForcingConfig(
    chunk_frames=1, timesteps=(1000.0, 500.0), shift=3.0, sink_frames=1, window_frames=2,
    block_size=6, attention="sparse", memory_blocks=2, local_topk=2, memory_topk=1,
    compressed_tokens=2,
)  # fmt: skip


def _sparse_odd_rollout(model, context, backend: str):
    cfg = dataclasses.replace(SPARSE_ODD, pbsa_backend=backend)
    layout = model.layout(cfg, PALLAS_HW)
    return generate_latents(
        model, jax.random.key(1), context, layout, 5, latent_hw=PALLAS_HW, channels=C
    )


@pytest.fixture(scope="module")
def sparse_odd_reference(small_model, context):
    return _sparse_odd_rollout(small_model, context, "reference")


@pytest.mark.parametrize("backend", ["triton", "tpu"])
def test_sparse_rollout_through_pallas_kernels_matches_reference(
    small_model, context, sparse_odd_reference, backend, monkeypatch
):
    """The sparse model's rollout with its selected branch on a Pallas kernel (interpreted on
    this CPU) equals the rollout on the XLA reference (`pbsa_reference`). Fails when a kernel
    reads the wrong keys for a block size that is not a power of two, for empty slots, or
    for the chunk's own blocks at the end of the pool."""
    want = sparse_odd_reference
    # A CPU runs a Pallas kernel only in interpret mode, which ForcingConfig does not name.
    monkeypatch.setattr(forcing_attention, "pbsa", functools.partial(pbsa, interpret=True))
    got = _sparse_odd_rollout(small_model, context, backend)
    assert got.shape == want.shape == (1, 5, *PALLAS_HW, C)
    assert np.isfinite(np.asarray(got)).all()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
