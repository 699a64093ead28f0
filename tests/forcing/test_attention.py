"""Dense and sparse cache attention against explicit references."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax.forcing import ForcingConfig, init_cache, write_chunk
from vidax.forcing import attention as forcing_attention
from vidax.forcing.attention import (
    SPARSE_PARAM_NAMES,
    SparseParams,
    chunk_positions,
    dense_attention,
    gather_attention,
    make_rope,
    select_blocks,
    selected_attention,
    sparse_attention,
    spatial_keys,
    time_angles,
)
from vidax.forcing.cache import chunk_metadata, slot_lengths, time_positions, to_blocks
from vidax.kernels.pbsa import pbsa, pbsa_reference, rotate_keys
from vidax.kernels.pbsa.index import iota_below
from vidax.nn import apply_rope
from vidax.nn.ring_attention import splash_block
from vidax.nn.rope import wan_axes_dims

B, N, K = 2, 2, 12  # head dim 12: RoPE axes (4, 4, 4)
# 2x2 = 4 tokens per frame in 2 blocks of 2; 2x3 = 6 tokens in blocks of 4 (4 + a partial 2).
GRIDS = [((2, 2), 2), ((2, 3), 4)]
ROPE = make_rope(wan_axes_dims(K), 10_000.0)
SPARSE = ForcingConfig(
    chunk_frames=1,
    sink_frames=1,
    window_frames=2,
    block_size=2,
    attention="sparse",
    memory_blocks=3,
    local_topk=2,
    memory_topk=2,
    compressed_tokens=4,
)
GRID = (2, 2)  # 4 tokens = 2 blocks per frame


def _filled_cache(cfg: ForcingConfig, chunks: int, seed: int = 0, grid=GRID):
    """One layer's cache after `chunks` random chunks (with memory and compressed ring)."""
    lay = cfg.layout(grid)
    layer = init_cache(lay, num_layers=1, batch=B, num_heads=N, head_dim=K, dtype=jnp.float32)
    layer = layer.layer(0)
    key = jax.random.key(seed)

    @jax.jit
    def write(layer, c):
        kk, kv, km = jax.random.split(jax.random.fold_in(key, c), 3)
        k = jax.random.normal(kk, (B, lay.chunk_tokens, N, K))
        v = jax.random.normal(kv, (B, lay.chunk_tokens, N, K))
        mass = jax.random.uniform(km, (B, N, lay.num_slots)) if cfg.sparse else None
        return write_chunk(layer, k, v, c, lay, mass=mass)

    for c in range(chunks):
        layer = write(layer, jnp.int32(c))
    return lay, layer


def _dense(q, k, v, layer, chunk, lay):
    fn = jax.jit(lambda q, k, v, layer, c: dense_attention(q, k, v, layer, c, lay, ROPE))
    return fn(q, k, v, layer, jnp.int32(chunk))


def _sparse(q, k, v, layer, chunk, lay, params):
    graphdef, state = nnx.split(params)
    fn = jax.jit(
        lambda q, k, v, layer, c, state: sparse_attention(
            q, k, v, layer, c, lay, ROPE, nnx.merge(graphdef, state)
        )
    )
    return fn(q, k, v, layer, jnp.int32(chunk), state)


def _qkv(lay, seed=1):
    ks = jax.random.split(jax.random.key(seed), 3)
    return [jax.random.normal(k, (B, lay.chunk_tokens, N, K)) for k in ks]


def _params(scale: float) -> SparseParams:
    p = SparseParams(N, K)
    if scale:
        rng = np.random.default_rng(0)
        state = jax.tree.map(
            lambda x: scale * rng.standard_normal(x.shape).astype(np.float32), nnx.state(p)
        )
        nnx.update(p, state)
    return p


def _read_keys(layer, lay, start):
    """The cached keys as attention reads them: the stored keys (spatial RoPE) rotated at their
    slot's time position (t, 0, 0), per token: (b, n, slots, bs, k)."""
    t = time_positions(layer.frame, start, lay)  # (b, n, s)
    b, n, s, bs, kd = layer.k.shape
    pos = jnp.broadcast_to(jnp.stack([t, 0 * t, 0 * t], -1)[:, :, :, None], (b, n, s, bs, 3))
    return apply_rope(
        layer.k.reshape(b * n, s * bs, 1, kd), ROPE(pos).reshape(b * n, s * bs, kd // 2)
    ).reshape(b, n, s, bs, kd)


@pytest.mark.parametrize("grid, block", GRIDS, ids=["blocks", "partial-blocks"])
@pytest.mark.parametrize("chunk", [1, 9])  # before and past the horizon
def test_stored_spatial_keys_read_at_their_time_are_the_full_rope(grid, block, chunk):
    """What the cache stores (`spatial_keys`) rotated on read by its slot's `time_angles` is
    the chunk's keys rotated at their (t, h, w) positions: the split of RoPE is exact."""
    cfg = ForcingConfig(chunk_frames=2, sink_frames=2, window_frames=4, block_size=block)
    lay = cfg.layout(grid)
    k = jax.random.normal(jax.random.key(0), (B, lay.chunk_tokens, N, K))
    start = jnp.int32(chunk * cfg.chunk_frames)
    full = to_blocks(apply_rope(k, ROPE(chunk_positions(start, lay))), lay)
    frames, _ = chunk_metadata(jnp.int32(chunk), lay)
    angles = time_angles(frames, start, lay, ROPE)  # (blocks, k/2), one angle per block
    stored = to_blocks(spatial_keys(k, lay, ROPE), lay)
    read = jax.vmap(jax.vmap(lambda x: rotate_keys(x[None, None], angles[None, None])[0, 0]))
    np.testing.assert_allclose(read(stored), full, atol=1e-6, rtol=1e-6)
    # The stored keys are not the fully rotated ones (time lanes differ for frames past 0).
    assert float(jnp.abs(stored - full).max()) > 1e-2


def _explicit(q, k, v, layer, lay, chunk, keep):
    """Reference: softmax over rotated cached tokens of the `keep` (b, n, slots) slots + chunk."""
    return _explicit_jit(q, k, v, layer, lay, jnp.int32(chunk), keep)


@functools.partial(jax.jit, static_argnums=4)
def _explicit_jit(q, k, v, layer, lay, chunk, keep):
    start = chunk * lay.config.chunk_frames
    angles = ROPE(chunk_positions(start, lay))
    qr, kr = apply_rope(q, angles), apply_rope(k, angles)
    b, n, s, bs, kd = layer.k.shape
    ck = _read_keys(layer, lay, start).reshape(b, n, s * bs, kd)
    cv = layer.v.reshape(b, n, s * bs, kd)
    keys = jnp.concatenate([ck, kr.transpose(0, 2, 1, 3)], axis=2)
    vals = jnp.concatenate([cv, v.transpose(0, 2, 1, 3)], axis=2)
    ok = iota_below(bs, jnp.where(keep, slot_lengths(layer.frame, layer.block, lay), 0))
    ok = jnp.concatenate([ok.reshape(b, n, s * bs), jnp.ones((b, n, q.shape[1]), bool)], -1)
    logits = jnp.einsum("blnk,bnsk->bnls", qr, keys) / np.sqrt(kd)
    logits = jnp.where(ok[:, :, None], logits, -jnp.inf)
    return jnp.einsum("bnls,bnsk->blnk", jax.nn.softmax(logits, -1), vals)


@pytest.mark.parametrize("grid, block", GRIDS, ids=["blocks", "partial-blocks"])
@pytest.mark.parametrize("chunks", [0, 2, 6])
def test_dense_attention_matches_explicit(chunks, grid, block):
    """Growing (0, 2 chunks cached) and full (6) caches. Empty slots and the padding of partial
    blocks hold NaN: a dense read that touched them (instead of the filled prefix's tokens
    only) would return NaN."""
    cfg = ForcingConfig(chunk_frames=1, sink_frames=1, window_frames=2, block_size=block)
    lay, layer = _filled_cache(cfg, chunks, grid=grid)
    q, k, v = _qkv(lay)
    empty = ~iota_below(block, slot_lengths(layer.frame, layer.block, lay))[..., None]
    poisoned = dataclasses.replace(
        layer, k=jnp.where(empty, jnp.nan, layer.k), v=jnp.where(empty, jnp.nan, layer.v)
    )
    out, mass = _dense(q, k, v, poisoned, chunks, lay)
    assert mass is None
    keep = jnp.ones(layer.frame.shape, bool)
    ref = _explicit(q, k, v, layer, lay, chunks, keep)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("grid, block", GRIDS, ids=["blocks", "partial-blocks"])
def test_sparse_selecting_every_block_is_dense(grid, block):
    # All window + memory blocks; with partial blocks, their padding is masked in every branch.
    cfg = dataclasses.replace(SPARSE, local_topk=4, memory_topk=3, block_size=block)
    lay, layer = _filled_cache(cfg, 7, grid=grid)
    assert (layer.frame >= 0).all()  # memory and window full, with evictions behind them
    q, k, v = _qkv(lay)
    dense, _ = _dense(q, k, v, layer, 7, lay)
    sparse, mass = _sparse(q, k, v, layer, 7, lay, _params(0.0))
    np.testing.assert_allclose(sparse, dense, atol=2e-5, rtol=1e-5)
    # The mass is a distribution over the cache slots (per tile, averaged over tiles).
    np.testing.assert_allclose(mass.sum(-1), 1.0, rtol=1e-5)
    # Trained gates and compression change the output: the equality above is not vacuous.
    other, _ = _sparse(q, k, v, layer, 7, lay, _params(0.3))
    assert float(jnp.abs(other - dense).max()) > 1e-3


# "gather" duplicates test_gather_attention_equals_pbsa_reference (gather == reference): slow.
@pytest.mark.parametrize("backend", ["auto", pytest.param("gather", marks=pytest.mark.slow)])
def test_sparse_selected_branch_matches_masked_reference(backend):
    lay, layer = _filled_cache(dataclasses.replace(SPARSE, pbsa_backend=backend), 7, seed=3)
    q, k, v = _qkv(lay, seed=4)
    start = jnp.int32(7)
    out, _ = _sparse(q, k, v, layer, 7, lay, _params(0.0))
    # Recompute the selection the layer makes and attend explicitly to those slots.
    angles = ROPE(chunk_positions(start, lay))
    qr = apply_rope(q, angles)
    b, n, s, _, kd = layer.k.shape
    kbar = _read_keys(layer, lay, start).mean(axis=3)
    qbar = qr.reshape(b, lay.num_query_tiles, -1, n, kd).mean(axis=2)
    scores = jnp.einsum("bqnk,bnsk->bnqs", qbar, kbar) / np.sqrt(kd)
    idx = select_blocks(jnp.where((layer.frame >= 0)[:, :, None], scores, -jnp.inf), lay)
    assert lay.num_query_tiles == 1
    keep = jax.nn.one_hot(idx[:, :, 0], s, dtype=jnp.int32).sum(-2) > 0
    # 1 sink block pair + 2 local + 2 memory = 6 distinct slots out of 2 + 3 + 4.
    assert int(keep.sum(-1).min()) == lay.max_selected == 6
    ref = _explicit(q, k, v, layer, lay, 7, keep)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-5)


def test_sparse_gradients_reach_compression_and_branch_weight():
    lay, layer = _filled_cache(SPARSE, 7)
    q, k, v = _qkv(lay)
    graphdef, state = nnx.split(_params(0.05))

    def loss(state, q):
        o, _ = sparse_attention(q, k, v, layer, jnp.int32(7), lay, ROPE, nnx.merge(graphdef, state))
        return jnp.sum(o * jnp.cos(o))

    grads, gq = jax.jit(jax.grad(loss, argnums=(0, 1)))(state, q)
    for name in SPARSE_PARAM_NAMES:
        g = np.asarray(grads[name][...])
        assert np.isfinite(g).all() and np.abs(g).max() > 0, name
    assert np.isfinite(np.asarray(gq)).all()


def test_gather_attention_equals_pbsa_reference():
    """The XLA:CPU fast path of the selected branch is the kernel's spec on its inputs."""
    b, n, slots, bs, kd, tile, nq, m = 2, 3, 9, 4, 8, 5, 3, 4
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (b, tile * nq, n, kd))
    pool_k = jax.random.normal(ks[1], (b, n, slots, bs, kd))
    pool_v = jax.random.normal(ks[2], (b, n, slots, bs, kd))
    # Distinct slots per tile (a random permutation's head); slots empty, partial (a frame's
    # last block) and full.
    idx = jnp.argsort(jax.random.uniform(ks[3], (b, n, nq, slots)), axis=-1)[..., :m]
    idx = idx.astype(jnp.int32)
    slot_len = jnp.broadcast_to(jnp.arange(slots, dtype=jnp.int32) % (bs + 1), (b, n, slots))
    out = gather_attention(q, pool_k, pool_v, idx, slot_len, tile, 0.3)
    ref = pbsa_reference(
        q.swapaxes(1, 2), pool_k, pool_v, idx, jnp.full((b, n, nq), m, jnp.int32),
        block_q=tile, scale=0.3, slot_len=slot_len,
    )  # fmt: skip
    np.testing.assert_allclose(out, ref.swapaxes(1, 2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("grid,block", [(GRID, 2), ((2, 3), 4)], ids=["even", "ragged"])
@pytest.mark.parametrize(
    "sink,chunks",
    [(1, 0), (1, 7), (2, 1), (0, 7)],
    ids=["sink-empty", "steady", "sink-half-written", "no-sink"],
)
def test_dense_shared_is_the_same_attention(grid, block, sink, chunks, monkeypatch):
    """`dense_shared` (sink and chunk blocks densely, the tiles' own picks through PBSA, merged
    by log-sum-exp; PBSA alone until the sink is written) == PBSA over the whole lists."""
    _check_dense_shared(grid, block, sink, chunks, "reference", monkeypatch)


@pytest.mark.parametrize(
    "grid,block,sink,chunks",
    [
        ((2, 3), 4, 1, 7),
        pytest.param(GRID, 2, 1, 7, marks=pytest.mark.slow),
        pytest.param((2, 3), 4, 2, 1, marks=pytest.mark.slow),
        pytest.param(GRID, 2, 0, 7, marks=pytest.mark.slow),
    ],
    ids=["ragged-steady", "even-steady", "ragged-sink-half-written", "even-no-sink"],
)
def test_dense_shared_on_the_tpu_kernels(grid, block, sink, chunks, monkeypatch):
    """The same with the TPU kernel and splash, interpreted on this CPU."""
    _check_dense_shared(grid, block, sink, chunks, "tpu", monkeypatch)


def _check_dense_shared(grid, block, sink, chunks, backend, monkeypatch):
    if backend == "tpu":  # the Mosaic kernel, interpreted on this CPU, and splash's dense half
        monkeypatch.setattr(forcing_attention, "pbsa", functools.partial(pbsa, interpret=True))
        splash = lambda q, k, v, scale: splash_block(
            q, k, v, k.shape[1], scale=scale, interpret=True
        )
        monkeypatch.setattr(forcing_attention, "_dense_with_lse", splash)
    cfg = dataclasses.replace(
        SPARSE, block_size=block, pbsa_backend=backend, sink_frames=sink, window_frames=2
    )
    lay, layer = _filled_cache(cfg, chunks, seed=5, grid=grid)
    assert lay.ragged == (block == 4)
    shared = dataclasses.replace(cfg, dense_shared=True).layout(grid)
    q, k, v = _qkv(lay, seed=6)
    want, mass = _sparse(q, k, v, layer, chunks, lay, _params(0.3))
    got, got_mass = _sparse(q, k, v, layer, chunks, shared, _params(0.3))
    tol = 2e-3 if backend == "tpu" else 2e-5  # splash's interpreter: bf16 probabilities
    np.testing.assert_allclose(got, want, atol=tol, rtol=tol)
    np.testing.assert_array_equal(got_mass, mass)
    # The split ran once the sink was written (and only then): a broken dense part shows.
    b, lq, n, _ = q.shape
    broken = lambda q, k, v, scale: (jnp.zeros(q.shape), jnp.zeros((b, n, lq)))
    monkeypatch.setattr(forcing_attention, "_dense_with_lse", broken)
    off, _ = _sparse(q, k, v, layer, chunks, shared, _params(0.3))
    assert (float(jnp.abs(off - want).max()) > 1e-2) == (chunks >= sink)


def test_dense_shared_is_refused_for_dense_attention_and_odd_lists():
    with pytest.raises(ValueError, match="dense_shared applies to attention='sparse'"):
        ForcingConfig(dense_shared=True)
    lay = dataclasses.replace(SPARSE, dense_shared=True, pbsa_backend="reference").layout(GRID)
    x = jnp.zeros((B, lay.chunk_tokens, N, K))
    pool = jnp.zeros((B, N, lay.num_slots + lay.chunk_blocks, 2, K))
    lengths = jnp.full(pool.shape[:3], 2, jnp.int32)
    short = jnp.zeros((B, N, lay.num_query_tiles, 3), jnp.int32)
    with pytest.raises(ValueError, match="dense_shared reads lists"):
        selected_attention(x, pool, pool, short, lengths, lay, 0.3, backend="reference")
