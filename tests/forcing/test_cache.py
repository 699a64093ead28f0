"""KV cache: positions, sink/window eviction, persistent memory and compressed ring updates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidax.forcing import ForcingConfig, init_cache, write_chunk
from vidax.forcing.cache import chunk_slot, time_positions

B, N, K = 1, 2, 4


def _chunk_kv(c: int, layout):
    """Recognisable keys/values of chunk c: every entry encodes (chunk, token)."""
    length = layout.chunk_tokens
    tok = jnp.arange(length, dtype=jnp.float32)[None, :, None, None]
    k = jnp.broadcast_to(100.0 * c + tok, (B, length, N, K))
    return k, -k


def test_time_positions_absolute_then_realigned():
    cfg = ForcingConfig(chunk_frames=2, sink_frames=2, window_frames=4, block_size=2)
    lay = cfg.layout((2, 2))
    assert cfg.horizon == 6
    frames = jnp.arange(12)
    # Before the horizon: absolute positions.
    np.testing.assert_array_equal(time_positions(frames, jnp.int32(4), lay), np.arange(12))
    # Past it: chunk at the horizon, window right before, sink unchanged.
    pos = np.asarray(time_positions(frames, jnp.int32(10), lay))
    np.testing.assert_array_equal(pos[:2], [0, 1])  # sink
    np.testing.assert_array_equal(pos[6:12], [2, 3, 4, 5, 6, 7])  # window (6..9) + chunk (10, 11)


def test_dense_window_and_sink_eviction():
    cfg = ForcingConfig(chunk_frames=2, sink_frames=2, window_frames=4, block_size=2)
    lay = cfg.layout((2, 2))  # 4 tokens = 2 blocks per frame
    cache = init_cache(lay, num_layers=1, batch=B, num_heads=N, head_dim=K, dtype=jnp.float32)
    layer = cache.layer(0)
    write = jax.jit(lambda layer, k, v, c: write_chunk(layer, k, v, c, lay))
    for c in range(7):
        k, v = _chunk_kv(c, lay)
        layer = write(layer, k, v, jnp.int32(c))
        frames = np.asarray(layer.frame[0, 0])
        expected = set(range(2)) | set(range(max(2, 2 * c - 2), 2 * c + 2))  # sink + 2 chunks
        assert set(frames[frames >= 0].tolist()) == expected
        # Every valid slot holds the keys written for its (frame, block).
        for slot in np.flatnonzero(frames >= 0):
            f, blk = int(frames[slot]), int(layer.block[0, 0, slot])
            chunk, local = divmod(f, 2)
            tok = local * 4 + blk * 2 + np.arange(2)
            np.testing.assert_array_equal(np.asarray(layer.k[0, 0, slot, :, 0]), 100 * chunk + tok)
            np.testing.assert_array_equal(np.asarray(layer.v[0, 1, slot, :, 0]), -100 * chunk - tok)
    # The ring slot of chunk c is that of chunk c - window_chunks.
    assert int(chunk_slot(jnp.int32(6), lay)) == int(chunk_slot(jnp.int32(4), lay))
    assert int(chunk_slot(jnp.int32(0), lay)) == 0


def test_sparse_memory_keeps_salient_blocks_and_compresses_the_rest():
    cfg = ForcingConfig(
        chunk_frames=1,
        sink_frames=1,
        window_frames=1,
        block_size=2,
        attention="sparse",
        memory_blocks=2,
        local_topk=1,
        memory_topk=1,
        compressed_tokens=2,
    )
    lay = cfg.layout((2, 2))  # 2 blocks per frame = per chunk
    cache = init_cache(lay, num_layers=1, batch=B, num_heads=N, head_dim=K, dtype=jnp.float32)
    layer = cache.layer(0)
    write = jax.jit(lambda layer, k, v, c, mass: write_chunk(layer, k, v, c, lay, mass=mass))
    rng = np.random.default_rng(0)
    history = {}
    for c in range(6):
        k, v = _chunk_kv(c, lay)
        # Head 0 favours block 0 of each evicted frame, head 1 block 1, growing over time.
        mass = np.zeros((B, N, lay.num_slots), np.float32)
        for slot in range(lay.num_slots):
            f, blk = int(layer.frame[0, 0, slot]), int(layer.block[0, 0, slot])
            if f >= 0:
                mass[0, 0, slot] = 0.1 * f + (1.0 if blk == 0 else 0.0) + 0.01 * rng.random()
                mass[0, 1, slot] = 0.1 * f + (1.0 if blk == 1 else 0.0) + 0.01 * rng.random()
        layer = write(layer, k, v, jnp.int32(c), jnp.asarray(mass))
        history[c] = layer
    mem = slice(lay.memory_start, lay.memory_start + lay.memory_slots)
    for head, favourite in ((0, 0), (1, 1)):
        frames = np.asarray(layer.frame[0, head, mem])
        blocks = np.asarray(layer.block[0, head, mem])
        # Frames 1..4 were evicted (5 is in the window, 0 the sink); the favourite blocks of the
        # newest ones win.
        assert sorted(frames.tolist()) == [3, 4] and set(blocks.tolist()) == {favourite}
        # Memory slots hold the keys of the frames they claim.
        for slot, f, blk in zip(range(mem.start, mem.stop), frames, blocks, strict=True):
            np.testing.assert_array_equal(
                np.asarray(layer.k[0, head, slot, :, 0]), 100 * f + blk * 2 + np.arange(2)
            )
        # The compressed ring holds the means of the two most recent losers.
        cf = np.asarray(layer.cframe[0, head])
        cb = np.asarray(layer.cblock[0, head])
        assert (cf >= 0).all()
        for i in range(2):
            expected = 100 * cf[i] + cb[i] * 2 + 0.5
            np.testing.assert_allclose(float(layer.ck[0, head, i, 0]), expected)
    # The sink never leaves.
    np.testing.assert_array_equal(np.asarray(layer.frame[0, :, : lay.sink_slots]), 0)


@pytest.mark.parametrize("memory_frames", [0, 2])
def test_bounded_memory_reads_nothing_beyond_the_context_span(memory_frames):
    """With `memory_frames`, the memory and the compressed ring hold nothing older than the
    span the next chunk may read; unbounded, the salience favouring old frames keeps them.

    Fails when stale blocks survive in the memory or the ring, or when the bound empties the
    memory instead of keeping the salient blocks inside the span."""
    cfg = ForcingConfig(
        chunk_frames=1,
        sink_frames=1,
        window_frames=1,
        block_size=2,
        attention="sparse",
        memory_blocks=2,
        local_topk=1,
        memory_topk=1,
        compressed_tokens=2,
        memory_frames=memory_frames,
    )
    assert cfg.context_frames == (4 if memory_frames else None)
    lay = cfg.layout((2, 2))  # 2 blocks per frame = per chunk
    layer = init_cache(lay, num_layers=1, batch=B, num_heads=N, head_dim=K, dtype=jnp.float32)
    layer = layer.layer(0)
    write = jax.jit(lambda layer, k, v, c, mass: write_chunk(layer, k, v, c, lay, mass=mass))
    mem = slice(lay.memory_start, lay.memory_start + lay.memory_slots)
    oldest_held = []
    for c in range(10):
        k, v = _chunk_kv(c, lay)
        # Older frames are more salient: an unbounded memory keeps the oldest blocks.
        mass = jnp.where(layer.frame >= 0, 10.0 - 0.5 * layer.frame.astype(jnp.float32), 0.0)
        layer = write(layer, k, v, jnp.int32(c), mass)
        held = np.concatenate([np.asarray(layer.frame[..., mem]), np.asarray(layer.cframe)], -1)
        held = held[held >= cfg.sink_frames]
        oldest_held.append(int(held.min()) if held.size else c)
        if memory_frames:
            # The next chunk starts at c + 1 and reads back window + memory_frames frames.
            assert oldest_held[-1] >= c + 1 - cfg.window_frames - memory_frames
    frames = np.asarray(layer.frame[..., mem])
    assert (frames >= 0).all()  # the memory stays full (of blocks inside the span)
    if memory_frames:
        assert set(frames.ravel().tolist()) <= {7, 8}
    else:
        assert oldest_held[-1] == 1  # frame 1 (the oldest evicted) is never let go


def test_partial_blocks_hold_a_frame_in_order_padded_with_zeros():
    """6 tokens per frame in blocks of 4: each frame is a full block and a partial one of 2.
    Slots hold their frame's tokens in order, the padding zeros; compressed tokens are means of
    a block's tokens and sit at their centre, padding excluded.

    Fails on frames cut across blocks (a reshape without per-frame padding), padding counted
    in a compressed mean or in a block's centre."""
    cfg = ForcingConfig(
        chunk_frames=1,
        sink_frames=1,
        window_frames=1,
        block_size=4,
        attention="sparse",
        memory_blocks=1,
        local_topk=1,
        compressed_tokens=2,
    )
    lay = cfg.layout((2, 3))
    assert lay.blocks_per_frame == 2 and lay.last_block_tokens == 2
    layer = init_cache(lay, num_layers=1, batch=B, num_heads=N, head_dim=K, dtype=jnp.float32)
    layer = layer.layer(0)
    write = jax.jit(lambda layer, k, v, c, mass: write_chunk(layer, k, v, c, lay, mass=mass))
    for c in range(4):
        k, v = _chunk_kv(c, lay)
        # Partial blocks (1) are the more salient, newer frames more than older ones.
        f = layer.frame.astype(jnp.float32)
        mass = jnp.where(layer.frame >= 0, jnp.where(layer.block == 1, 1.0, 0.5) + 0.1 * f, 0.0)
        layer = write(layer, k, v, jnp.int32(c), mass)
        frames, blocks = np.asarray(layer.frame[0, 0]), np.asarray(layer.block[0, 0])
        for slot in np.flatnonzero(frames >= 0):
            f, blk = int(frames[slot]), int(blocks[slot])
            n = 4 if blk == 0 else 2
            want = np.zeros(4)
            want[:n] = 100 * f + blk * 4 + np.arange(n)
            np.testing.assert_array_equal(np.asarray(layer.k[0, 0, slot, :, 0]), want)
    # Frames 1 and 2 were evicted; frame 2's partial block won the memory, frame 1's partial
    # and frame 2's full block went to the ring (the chunk before's full block overwritten).
    assert np.asarray(layer.frame[0, 0, lay.memory_start]) == 2
    cf, cb = np.asarray(layer.cframe[0, 0]), np.asarray(layer.cblock[0, 0])
    assert sorted(zip(cf.tolist(), cb.tolist(), strict=True)) == [(1, 1), (2, 0)]
    means = 100 * cf + 4 * cb + np.where(cb == 0, 1.5, 0.5)  # of tokens 0-3, of tokens 4-5
    np.testing.assert_allclose(np.asarray(layer.ck[0, 0, :, 0]), means)


def test_cache_shapes_do_not_grow():
    cfg = ForcingConfig(chunk_frames=1, sink_frames=1, window_frames=2, block_size=4)
    lay = cfg.layout((2, 2))
    cache = init_cache(lay, num_layers=2, batch=B, num_heads=N, head_dim=K, dtype=jnp.float32)
    shapes = jax.tree.map(lambda x: x.shape, cache)
    nbytes = cache.nbytes()
    layer = cache.layer(1)
    write = jax.jit(lambda layer, k, v, c: write_chunk(layer, k, v, c, lay))
    for c in range(5):
        k, v = _chunk_kv(c, lay)
        layer = write(layer, k, v, jnp.int32(c))
    cache = cache.set_layer(1, layer)
    assert jax.tree.map(lambda x: x.shape, cache) == shapes and cache.nbytes() == nbytes
    assert nbytes == 2 * 2 * B * N * lay.num_slots * 4 * K * 4


def test_write_rejects_wrong_chunk_size():
    cfg = ForcingConfig(chunk_frames=1, sink_frames=1, window_frames=1, block_size=4)
    lay = cfg.layout((2, 2))
    layer = init_cache(lay, num_layers=1, batch=B, num_heads=N, head_dim=K, dtype=jnp.float32)
    k = jnp.zeros((B, 8, N, K))
    with pytest.raises(ValueError):
        write_chunk(layer.layer(0), k, k, jnp.int32(0), lay)
