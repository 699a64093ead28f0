"""Self-attention of a chunk over the KV cache: dense (Self-Forcing) and sparse (Sparse Forcing).

Both take the chunk's *raw* queries, keys and values (the transformer block runs with
`angles=None`, so RoPE is applied here, where the positions of cached frames are known) and one
layer's `KVCache`. The chunk always attends to itself in full (bidirectional inside the chunk):
its own keys are appended to the cache's blocks as extra pool slots, so one softmax covers the
cache and the chunk.

RoPE of cached keys: a cached token's (h, w) never changes, its time position does (past the
horizon, `time_positions`). The cache stores keys with their spatial rotation (`spatial_keys`,
applied once when a chunk is written) and every read rotates the time lanes by one angle per
slot (`time_angles`): the PBSA kernel does it on read, in VMEM, so the sparse path never
rewrites the pool; the XLA paths rotate the slots they read. The time and space lanes of RoPE
are disjoint, so the two rotations compose to exactly the rotation at (t, h, w).

Sparse attention (native-sparse-attention style, two branches):

- *selected*: each query tile (one latent frame by default) attends to the union of the sink
  blocks, its top-`local_topk` window blocks and its top-`memory_topk` persistent-memory blocks,
  ranked by `softmax(mean(q_tile) . k_cmp)`, through the PBSA kernel (`vidax.kernels.pbsa`), in
  one softmax together with the chunk itself;
- *compressed*: every query attends to the compressed tokens of all cached blocks and of the
  compressed ring (coarse view of the whole history).

`o = (1 - w) * o_selected + w * o_compressed`, with `w = tanh(q W_b + b_b)` per head and query:
an affine combination (the coefficients sum to 1, so the output keeps the scale of an attention
output whatever the gate), zero at init. A sigmoid or softmax gate could reach 0 only at -inf,
where its gradient vanishes; `tanh` is 0 with a live gradient, so a freshly initialised layer
is exactly the dense layer restricted to the selection and still learns to mix in the
compressed branch.

The compression `k_cmp = mean(k_block) + mean(k_block) W_k` (same for v) is zero-initialised
too. The block scores get a gradient through the *selected* branch as well, by a straight-through
scored top-k: `s_b - stop_gradient(s_b)` (`s_b` the log score probability of block `b` for the
tile) is added to the logits of every key of each selected block. The forward is unchanged (the
term is exactly 0); the backward hands the scorer the gradient of a soft selection, so the
salience that decides which blocks the persistent memory keeps (the score probability mass,
`write_chunk`) is learned from what the selected attention needs. The PBSA kernels take no
logit bias: the surrogate lives on the `gather` path (what training runs, and "auto" on a CPU);
on the PBSA backends the selected branch is forward-identical and passes the scorer no gradient.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float

from vidax.forcing.cache import (
    KVCache,
    block_lengths,
    chunk_metadata,
    slot_lengths,
    time_positions,
    to_blocks,
)
from vidax.kernels.pbsa import block_means, pbsa, rotate_keys
from vidax.kernels.pbsa.index import iota_below
from vidax.models.causal import CacheLayout
from vidax.nn import apply_rope, rope_angles, video_positions
from vidax.nn.attention import attention
from vidax.nn.layers import param
from vidax.nn.ring_attention import block_attention
from vidax.nn.rope import rotate_pairs
from vidax.nn.softmax import merge_partials, normalize, softmax_stats

_EMPTY = -1e30  # compressed score of an empty slot


class SparseParams(nnx.Module):
    """The learned parts of one layer's sparse attention: branch weight and block compression.

    Zero-initialised (see the module docstring): at init the sparse layer is the dense one
    restricted to the selected blocks.

    Attributes:
      branch_kernel, branch_bias: (n, k), (n,) the compressed branch's weight
        `w = tanh(q W + b)` per head.
      compress_k, compress_v: (n, k, k) linear corrections of the block-mean keys / values.
    """

    def __init__(self, num_heads: int, head_dim: int, *, rngs: nnx.Rngs | None = None):
        del rngs  # deterministic (zero) init
        n, k = num_heads, head_dim
        self.branch_kernel = param(jnp.zeros((n, k), jnp.float32), (None, None))
        self.branch_bias = param(jnp.zeros((n,), jnp.float32), (None,))
        self.compress_k = param(jnp.zeros((n, k, k), jnp.float32), (None, None, None))
        self.compress_v = param(jnp.zeros((n, k, k), jnp.float32), (None, None, None))


# Parameter names of `SparseParams`, in checkpoint order; the retired unnormalised gates.
SPARSE_PARAM_NAMES = ("branch_kernel", "branch_bias", "compress_k", "compress_v")
RETIRED_SPARSE_PARAMS = ("gate_kernel", "gate_bias")


def make_sparse_params(num_layers: int, num_heads: int, head_dim: int) -> SparseParams:
    """`SparseParams` stacked on a leading "layers" axis (scanned with the blocks)."""

    @nnx.vmap(
        in_axes=None,
        out_axes=0,
        axis_size=num_layers,
        transform_metadata={nnx.PARTITION_NAME: "layers"},
    )
    def make():
        return SparseParams(num_heads, head_dim)

    return make()


# -- RoPE helpers ---------------------------------------------------------------------------------


def chunk_positions(chunk_start, layout: CacheLayout) -> Float[Array, "l 3"]:
    """(t, h, w) RoPE positions of the current chunk's tokens."""
    c = layout.config
    t0 = time_positions(jnp.asarray(chunk_start), chunk_start, layout)
    grid = video_positions(c.chunk_frames, *layout.grid_hw)
    return grid + jnp.stack([t0, 0.0 * t0, 0.0 * t0])[None]  # one time offset for every token


def spatial_keys(k: Float[Array, "b l n k"], layout: CacheLayout, rope) -> Float[Array, "b l n k"]:
    """The chunk's raw keys rotated at (0, h, w): what the cache stores (module docstring)."""
    grid = video_positions(layout.config.chunk_frames, *layout.grid_hw)
    return apply_rope(k, rope(grid * jnp.asarray([[0.0, 1.0, 1.0]])))


def time_angles(frame: Array, chunk_start, layout: CacheLayout, rope) -> Float[Array, "... k/2"]:
    """RoPE angles (..., k/2) of cached frames `frame` (...) at their time positions while the
    chunk at `chunk_start` is denoised: the time lanes' angles, 0 on the spatial lanes."""
    t = time_positions(frame, chunk_start, layout)
    zero = jnp.zeros_like(t)
    return rope(jnp.stack([t, zero, zero], axis=-1))


def make_rope(axes_dims: tuple[int, ...], theta: float):
    """positions (..., 3) -> angles (..., k/2) of the transformer's RoPE."""
    return lambda positions: rope_angles(positions, axes_dims, theta)


# -- dense ----------------------------------------------------------------------------------------


def _attend_pool(q, pool_k, pool_v, slot_len, scale):
    """Dense attention of q (b, l, n, k) over the valid tokens of a pool; (out f32, lse).

    `slot_len` (b, n, slots) int32: valid leading tokens of each slot (0: empty). Laid out as
    head-major batched matmuls (heads in front of tokens), which XLA:CPU runs several times
    faster than token-major einsums. A row with no valid key gets 0 (lse -inf).
    """
    f32 = jnp.float32
    b, n, s, j, k = pool_k.shape
    qh = q.astype(f32).swapaxes(1, 2) * scale  # (b, n, l, k)
    keys = pool_k.astype(f32).reshape(b, n, s * j, k)
    logits = qh @ keys.swapaxes(-1, -2)  # (b, n, l, s * j)
    ok = iota_below(j, slot_len).reshape(b, n, 1, s * j)
    p, shift, total = softmax_stats(jnp.where(ok, logits, -jnp.inf))
    o, lse = normalize(p @ pool_v.astype(f32).reshape(b, n, s * j, k), shift, total)
    return o.swapaxes(1, 2), lse  # (b, l, n, k), (b, n, l)


def dense_attention(
    q: Float[Array, "b l n k"],
    k: Float[Array, "b l n k"],
    v: Float[Array, "b l n k"],
    cache: KVCache,
    chunk_start,
    layout: CacheLayout,
    rope,
) -> tuple[Float[Array, "b l n k"], None]:
    """The chunk attends to the filled part of the cache and to itself (Self-Forcing).

    As in Self-Forcing, the cache grows: chunk `c` attends only the chunks written before it,
    up to the sink and a full window, and never the empty slots. A dense cache fills as a
    prefix (chunk `c < sink_chunks + window_chunks` is written at slot `c * chunk_blocks`), so
    each fill level is one program over a static prefix of the slots, chosen by a `lax.switch`
    (all levels compile into one program, one runs). With no mask left, the attention is one
    fused call (`_fused_attention`). The cache must hold exactly chunks `0 .. c-1`, which is
    what every rollout writes. A layout with persistent memory (a sparse one) is read whole,
    its empty slots masked.

    Args:
      q, k, v: (b, l, n, k) raw (un-rotated) projections of the chunk's tokens.
      cache: one layer's cache.
      chunk_start: int32 scalar first latent frame of the chunk.
      layout: the cache layout.
      rope: `make_rope(...)` of the transformer.

    Returns:
      (o (b, l, n, k) in q's dtype, None): no attention mass (dense keeps no salience).
    """
    c = layout.config
    if layout.memory_slots:
        # A sparse layout read densely (tests: sparse selecting every block): the memory does
        # not fill as a prefix, so every slot is read and the empty ones are masked.
        pool_k, pool_v, lengths, qr, angles = _with_chunk(q, k, v, cache, chunk_start, layout, rope)
        pool_k = rotate_keys(_join(pool_k), angles)
        o, _ = _attend_pool(qr, pool_k, _join(pool_v), lengths, q.shape[-1] ** -0.5)
        return o.astype(q.dtype), None
    full = c.sink_chunks + c.window_chunks
    level = jnp.clip(jnp.asarray(chunk_start) // c.chunk_frames, 0, full)
    branches = [
        functools.partial(
            _dense_prefix, slots=filled * layout.chunk_blocks, layout=layout, rope=rope
        )
        for filled in range(full + 1)
    ]
    o = jax.lax.switch(level, branches, q, k, v, cache, jnp.asarray(chunk_start))
    return o.astype(q.dtype), None


def _dense_prefix(q, k, v, cache: KVCache, chunk_start, *, slots: int, layout, rope):
    """Attention of the chunk over the first `slots` cache slots (all filled) and itself."""
    angles = rope(chunk_positions(chunk_start, layout))
    qr, kr = apply_rope(q, angles), apply_rope(k, angles)
    keys, values = kr.swapaxes(1, 2), v.swapaxes(1, 2)  # (b, n, l, k)
    if slots:
        head = lambda x: x[:, :, :slots]
        angles = time_angles(head(cache.frame), chunk_start, layout, rope)
        # The prefix holds whole frames (head-major here).
        tokens = lambda x: _frame_tokens(x, layout).swapaxes(1, 2)
        cached_k = tokens(rotate_keys(head(cache.k), angles))
        cached_v = tokens(head(cache.v))
        keys = jnp.concatenate([cached_k.astype(q.dtype), keys], axis=2)
        values = jnp.concatenate([cached_v.astype(q.dtype), values], axis=2)
    return _fused_attention(qr, keys, values)


def _fused_attention(
    q: Float[Array, "b l n k"], keys: Float[Array, "b n s k"], values: Float[Array, "b n s k"]
) -> Float[Array, "b l n k"]:
    """Unmasked attention in one fused call: on a GPU or TPU `vidax.nn.attention`'s "auto"
    (cuDNN flash attention where it takes the inputs; splash attention for long sequences on a
    TPU, where the float32 logits of a Wan-sized chunk over its cache would take 6 GiB a
    layer); on a CPU head-major batched matmuls with float32 logits, the fastest XLA:CPU layout
    (`jax.nn.dot_product_attention`'s token-major XLA path measured 1.3x slower on the
    tiny-causal chunk)."""
    scale = q.shape[-1] ** -0.5
    if jax.devices()[0].platform in ("gpu", "tpu"):
        return attention(q, keys.swapaxes(1, 2), values.swapaxes(1, 2), scale=scale, impl="auto")
    f32 = jnp.float32
    logits = (q.astype(f32).swapaxes(1, 2) * scale) @ keys.astype(f32).swapaxes(-1, -2)
    o = jax.nn.softmax(logits, axis=-1) @ values.astype(f32)
    return o.swapaxes(1, 2)


def _with_chunk(q, k, v, cache: KVCache, chunk_start, layout: CacheLayout, rope):
    """The cache's pool followed by the chunk's own blocks, their lengths and key angles, and
    the rotated queries.

    Returns:
      pool_k, pool_v: two segments, the cache's blocks (b, n, slots, bs, k) as stored (keys
      with their spatial RoPE only) and the chunk's (b, n, chunk_blocks, bs, k) (keys fully
      rotated), one pool of slots + chunk_blocks slots that PBSA reads without joining them
      (`_join` for the XLA paths); int32 slot lengths (b, n, slots +
      chunk_blocks): valid leading tokens of each slot (0: empty; a frame's partial last block
      is shorter); q rotated (b, l, n, k); float32 key angles (b, n, slots + chunk_blocks, k/2)
      that complete each slot's rotation (`rotate_keys`, or PBSA's RoPE on read): the cached
      slots' time angles, 0 for the chunk's. The chunk's blocks are the last `chunk_blocks`
      slots.
    """
    angles = rope(chunk_positions(chunk_start, layout))
    qr, kr = apply_rope(q, angles), apply_rope(k, angles)
    pool_k = (cache.k.astype(q.dtype), to_blocks(kr, layout))
    pool_v = (cache.v.astype(q.dtype), to_blocks(v, layout))
    b, n = cache.frame.shape[:2]
    _, own_blocks = chunk_metadata(jnp.int32(0), layout)
    own = jnp.broadcast_to(block_lengths(own_blocks, layout), (b, n, layout.chunk_blocks))
    lengths = jnp.concatenate([slot_lengths(cache.frame, cache.block, layout), own], axis=2)
    cached = time_angles(cache.frame, chunk_start, layout, rope)
    key_angles = jnp.concatenate(
        [cached, jnp.zeros((b, n, layout.chunk_blocks, cached.shape[-1]), cached.dtype)], axis=2
    )
    return pool_k, pool_v, lengths, qr, key_angles


def _join(pool: Array | tuple[Array, ...]) -> Array:
    """`_with_chunk`'s pool segments as one array (a copy of the cache: XLA paths only)."""
    return jnp.concatenate(pool, axis=2) if isinstance(pool, tuple) else pool


# -- sparse ---------------------------------------------------------------------------------------


def _compress(pool, slot_len, weight, angles=None):
    """Compressed tokens of pool blocks: mean over the block's valid tokens (`slot_len`),
    rotated by the slots' `angles` (b, n, slots, k/2) when given, plus a learned linear
    correction. One angle per slot: the rotated mean is the mean of the rotated keys."""
    mean = block_means(pool, slot_len=slot_len)
    if angles is not None:
        mean = rotate_pairs(mean, angles)
    return mean + jnp.einsum("bnsk,nkj->bnsj", mean, weight.astype(jnp.float32))


def gather_attention(
    q: Float[Array, "b l n k"],
    pool_k: Float[Array, "b n slots bs k"],
    pool_v: Float[Array, "b n slots bs k"],
    idx: Array,
    slot_len: Array,
    tile: int,
    scale: float,
    bias: Float[Array, "b n nq m"] | None = None,
) -> Float[Array, "b l n k"]:
    """Selected-block attention as gather + head-major batched matmuls (an XLA:CPU fast path).

    The same function as `pbsa_reference` for duplicate-free lists (what `select_blocks` plus
    the chunk's own slots give): each tile of `tile` query rows attends to one softmax over its
    listed slots, the tokens past each slot's length masked. `pbsa_reference` is the spec and
    test oracle and lays its einsums out token-major, which XLA:CPU runs about 2x slower; on
    accelerators the `pbsa` kernel is the fast path.

    Args:
      q: (b, l, n, k) rotated queries, l a multiple of `tile`.
      pool_k, pool_v: (b, n, slots, bs, k) the pool (cache blocks, then the chunk's).
      idx: int32 (b, n, l / tile, m) distinct slots per query tile.
      slot_len: int32 (b, n, slots) valid leading tokens of each slot (0: empty).
      tile: query rows per selection.
      scale: logit scale.
      bias: optional (b, n, l / tile, m) float added to the logits of every key of each listed
        slot (the straight-through selection surrogate of `sparse_attention`).

    Returns:
      (b, l, n, k) float32.
    """
    f32 = jnp.float32
    b, lq, n, k = q.shape
    nq, m = idx.shape[2:]
    bs = pool_k.shape[3]
    take = lambda pool: jnp.take_along_axis(pool[:, :, None], idx[..., None, None], axis=3)
    keys = take(pool_k.astype(f32)).reshape(b, n, nq, m * bs, k)
    values = take(pool_v.astype(f32)).reshape(b, n, nq, m * bs, k)
    lengths = jnp.take_along_axis(
        jnp.broadcast_to(slot_len[:, :, None], (b, n, nq, slot_len.shape[-1])), idx, 3
    )
    ok = iota_below(bs, lengths).reshape(b, n, nq, 1, m * bs)
    qh = q.astype(f32).swapaxes(1, 2).reshape(b, n, nq, tile, k) * scale
    logits = qh @ keys.swapaxes(-1, -2)  # (b, n, nq, tile, m * bs)
    if bias is not None:
        logits = logits + jnp.repeat(bias.astype(f32), bs, axis=-1)[..., None, :]
    logits = jnp.where(ok, logits, -jnp.inf)
    p, shift, total = softmax_stats(logits)
    o, _ = normalize(p @ values, shift, total)
    return o.reshape(b, n, lq, k).swapaxes(1, 2)


def select_blocks(scores: Float[Array, "b n nq slots"], layout: CacheLayout) -> Array:
    """Selected cache slots per query tile: sink (all), local top-k, memory top-k.

    Args:
      scores: compressed-attention logits of each tile on each slot, -inf where empty.

    Returns:
      int32 (b, n, nq, max_selected) slot lists (empty slots may be listed: `slot_len` masks
      them).
    """
    c = layout.config
    b, n, nq, _ = scores.shape
    sink = jnp.broadcast_to(
        jnp.arange(layout.sink_slots, dtype=jnp.int32), (b, n, nq, layout.sink_slots)
    )
    parts = [sink]
    lo = layout.window_start
    _, local = jax.lax.top_k(scores[..., lo : lo + layout.window_slots], c.local_topk)
    parts.append(local.astype(jnp.int32) + lo)
    if c.memory_topk:
        lo = layout.memory_start
        _, mem = jax.lax.top_k(scores[..., lo : lo + layout.memory_slots], c.memory_topk)
        parts.append(mem.astype(jnp.int32) + lo)
    return jnp.concatenate(parts, axis=-1)


def selected_backend(backend: str) -> str:
    """What runs the selected branch for `ForcingConfig.pbsa_backend`: PBSA's "auto" is its
    reference on a CPU, so there the gather path, the same function laid out for XLA:CPU (1.4x
    faster per tiny-causal chunk, benchmarks/sparse_forcing.py)."""
    if backend == "auto" and jax.devices()[0].platform == "cpu":
        return "gather"
    return backend


def selected_attention(
    qr: Float[Array, "b l n k"],
    pool_k: Array | tuple[Array, ...],
    pool_v: Array | tuple[Array, ...],
    idx: Array,
    lengths: Array,
    layout: CacheLayout,
    scale: float,
    *,
    backend: str,
    key_angles: Array | None = None,
    bias: Array | None = None,
) -> Float[Array, "b l n k"]:
    """Sparse Forcing's selected branch: one softmax per query tile over its listed slots.

    Args:
      qr: (b, l, n, k) rotated queries; pool_k, pool_v, lengths, key_angles: the pool
        `_with_chunk` builds (pools (b, n, slots, bs, k) or tuples of segments of one).
      idx: int32 (b, n, nq, s) pool slots per query tile, every entry valid.
      layout: the cache layout (its `query_tile`).
      scale: logit scale.
      backend: "gather" (`gather_attention`) or a PBSA backend (`selected_backend`'s result).
      key_angles: optional float32 (b, n, slots, k/2) rotation completing each slot's keys
        (PBSA rotates them on read; the gather path rotates the pool first); None: the pool's
        keys are final.
      bias: optional (b, n, nq, s) logit bias per listed slot; the gather path only (the PBSA
        kernels take none).
    """
    if backend == "gather":  # the XLA path reads one array
        keys, values = _join(pool_k), _join(pool_v)
        if key_angles is not None:
            keys = rotate_keys(keys, key_angles)
        return gather_attention(qr, keys, values, idx, lengths, layout.query_tile, scale, bias=bias)
    if bias is not None:
        raise ValueError(f"the PBSA kernels take no logit bias (backend {backend!r})")
    if layout.config.dense_shared:
        return _dense_shared(qr, pool_k, pool_v, idx, lengths, key_angles, layout, scale, backend)
    o, _ = _pbsa_lists(qr, pool_k, pool_v, idx, lengths, key_angles, layout, scale, backend)
    return o


def _pbsa_lists(qr, pool_k, pool_v, idx, lengths, key_angles, layout: CacheLayout, scale, backend):
    """PBSA of every query tile over all of its listed slots: (o (b, l, n, k), lse (b, n, l))."""
    cnt = jnp.full(idx.shape[:3], idx.shape[-1], jnp.int32)
    o, lse = pbsa(
        qr.transpose(0, 2, 1, 3),  # pbsa wants (b, n, l, k)
        pool_k,
        pool_v,
        idx,
        cnt,
        block_q=layout.query_tile,
        scale=scale,
        slot_len=lengths,
        key_angles=key_angles,
        backend=backend,
        return_lse=True,
    )
    return o.transpose(0, 2, 1, 3), lse


def _frame_tokens(blocks: Float[Array, "b n m bs k"], layout: CacheLayout):
    """Whole frames' blocks -> their tokens (b, frames * tokens_per_frame, n, k), each frame's
    partial last block's padding cut."""
    b, n, m, _, k = blocks.shape
    frames = m // layout.blocks_per_frame
    x = blocks.reshape(b, n, frames, -1, k)[:, :, :, : layout.tokens_per_frame]
    return x.reshape(b, n, -1, k).swapaxes(1, 2)


def _dense_with_lse(q, k, v, *, scale: float):
    """Unmasked attention with its log-sum-exp: ((b, l, n, k) float32, (b, n, l)); splash on a
    TPU (forward only), the jnp online softmax elsewhere (cuDNN's fused call returns no
    log-sum-exp)."""
    tpu = jax.devices()[0].platform == "tpu"
    return block_attention(q, k, v, k.shape[1], scale=scale, tpu=tpu)


def _dense_shared(
    qr, pool_k, pool_v, idx, lengths, key_angles, layout: CacheLayout, scale, backend
):
    """`ForcingConfig.dense_shared`: the sink and chunk blocks every tile lists, densely in one
    kernel call, merged by log-sum-exp with PBSA over each tile's own picks (disjoint sets, so
    the same softmax as PBSA over the whole lists)."""
    c, sink, own, slots = layout.config, layout.sink_slots, layout.chunk_blocks, layout.num_slots
    picks = idx.shape[-1] - sink - own
    if picks != c.local_topk + c.memory_topk:
        raise ValueError(
            f"dense_shared reads lists as sink ({sink}), picks ({c.local_topk + c.memory_topk}), "
            f"the chunk's own ({own}) slots; got {idx.shape[-1]} entries"
        )

    def part(x):  # the sink's and the chunk's blocks of a pool, its segments or its angles
        cache, chunk = x if isinstance(x, tuple) else (x[:, :, :slots], x[:, :, slots:])
        return jnp.concatenate([cache[:, :, :sink], chunk], 2)

    def shared(pool, angles=None):  # the sink's and the chunk's whole frames: (b, tokens, n, k)
        blocks = part(pool) if angles is None else rotate_keys(part(pool), part(angles))
        return _frame_tokens(blocks, layout)

    def split(qr, pool_k, pool_v, idx, lengths, key_angles):
        keys, values = shared(pool_k, key_angles), shared(pool_v)
        o, lse = _dense_with_lse(qr, keys, values, scale=scale)
        if picks:
            mine = idx[..., sink : sink + picks]
            o_picks, lse_picks = _pbsa_lists(
                qr, pool_k, pool_v, mine, lengths, key_angles, layout, scale, backend
            )
            o, _ = merge_partials((o, lse), (o_picks.astype(jnp.float32), lse_picks))
        return o.astype(qr.dtype)

    def whole(qr, pool_k, pool_v, idx, lengths, key_angles):  # PBSA's output: qr's dtype
        args = (qr, pool_k, pool_v, idx, lengths, key_angles, layout, scale, backend)
        return _pbsa_lists(*args)[0]

    # The sink is written whole frames at a time, in order, and a written slot is full: until
    # every sink slot has tokens, PBSA (which masks empty slots) takes the whole lists.
    ready = jnp.all(lengths[:, :, :sink] > 0) if sink else jnp.bool_(True)
    args = (qr, pool_k, pool_v, idx, lengths, key_angles)
    return jax.lax.cond(ready, split, whole, *args)


def sparse_attention(
    q: Float[Array, "b l n k"],
    k: Float[Array, "b l n k"],
    v: Float[Array, "b l n k"],
    cache: KVCache,
    chunk_start,
    layout: CacheLayout,
    rope,
    params: SparseParams,
    *,
    select: Array | None = None,
    straight_through: bool = True,
) -> tuple[Float[Array, "b l n k"], Float[Array, "b n slots"]]:
    """Sparse Forcing attention of the chunk over one layer's cache (see the module docstring).

    Args:
      q, k, v: (b, l, n, k) raw projections of the chunk's tokens.
      cache: one layer's cache.
      chunk_start: int32 scalar first latent frame of the chunk.
      layout: the cache layout (its config must be sparse).
      rope: `make_rope(...)` of the transformer.
      params: this layer's `SparseParams`.
      select: optional int32 (b, n, nq, s) slot lists overriding the learned selection (tests).
      straight_through: on the `gather` path, add the scored top-k surrogate
        `s_b - stop_gradient(s_b)` to the selected blocks' logits (forward unchanged; the
        scorer gets the selected branch's gradient). The PBSA kernels take no logit bias.

    Returns:
      (o (b, l, n, k) in q's dtype, mass (b, n, slots) float32): the compressed-score
      probability mass the chunk's query tiles put on each cache slot (summed over tiles and
      averaged over them), the salience signal.
    """
    c = layout.config
    b, lq, n, kd = q.shape
    scale = kd**-0.5
    f32 = jnp.float32
    pool_k, pool_v, lengths, qr, key_angles = _with_chunk(q, k, v, cache, chunk_start, layout, rope)
    slots = layout.num_slots
    valid = lengths[:, :, :slots] > 0  # the cache part
    cached_len, cached_angles = lengths[:, :, :slots], key_angles[:, :, :slots]
    # Compressed tokens of the cached blocks (rotated keys, as attention sees them).
    k_cmp = _compress(cache.k, cached_len, params.compress_k[...], cached_angles)
    v_cmp = _compress(cache.v, cached_len, params.compress_v[...])

    # Scores: mean query of each tile against the compressed keys.
    nq = layout.num_query_tiles
    q_tiles = qr.astype(f32).reshape(b, nq, lq // nq, n, kd).mean(axis=2)  # (b, nq, n, k)
    scores = jnp.einsum("bqnk,bnsk->bnqs", q_tiles, k_cmp) * scale
    # A finite floor (not -inf) keeps the softmax of an all-empty cache NaN-free; empty slots
    # still rank below every real one and get no mass.
    scores = jnp.where(valid[:, :, None], scores, _EMPTY)
    log_prob = jax.nn.log_softmax(scores, axis=-1)
    prob = jnp.where(valid[:, :, None], jnp.exp(log_prob), 0.0)
    mass = prob.mean(axis=2)

    # Selected branch: one PBSA softmax over the selected cache blocks and the chunk itself.
    if select is None:
        select = select_blocks(jax.lax.stop_gradient(scores), layout)
    own = jnp.arange(slots, slots + layout.chunk_blocks, dtype=jnp.int32)
    idx = jnp.concatenate([select, jnp.broadcast_to(own, (*select.shape[:3], own.size))], -1)
    backend = selected_backend(c.pbsa_backend)
    bias = None
    if backend == "gather" and straight_through:
        # Exactly 0 forward (log_prob is finite: empty slots score a finite floor); the
        # chunk's own slots are not scored and get no surrogate.
        s_b = jnp.take_along_axis(log_prob, select, axis=-1)
        s_b = s_b - jax.lax.stop_gradient(s_b)
        bias = jnp.concatenate([s_b, jnp.zeros((*s_b.shape[:3], own.size), f32)], -1)
    o_sel = selected_attention(
        qr,
        pool_k,
        pool_v,
        idx,
        lengths,
        layout,
        scale,
        backend=backend,
        key_angles=key_angles,
        bias=bias,
    )
    o_sel = o_sel.astype(f32)

    # Compressed branch: every query over all compressed tokens (cache blocks + ring).
    key_parts, value_parts, ok_parts = [k_cmp], [v_cmp], [valid]
    if c.compressed_tokens:
        ring_angles = time_angles(cache.cframe, chunk_start, layout, rope)
        key_parts.append(rotate_pairs(cache.ck.astype(f32), ring_angles))
        value_parts.append(cache.cv.astype(f32))
        ok_parts.append(cache.cframe >= 0)
    keys, values, ok = (jnp.concatenate(x, axis=2) for x in (key_parts, value_parts, ok_parts))
    o_cmp, lse_cmp = _attend_pool(
        qr, keys[:, :, :, None], values[:, :, :, None], ok.astype(jnp.int32), scale
    )

    # Affine combination, zero at init (module docstring): (1 - w) o_sel + w o_cmp.
    w = jnp.tanh(
        jnp.einsum("blnk,nk->bln", q.astype(f32), params.branch_kernel[...].astype(f32))
        + params.branch_bias[...].astype(f32)[None, None]  # (n,) over (b, l)
    )
    # A query with no compressed token yet (the first chunks) keeps the selected branch alone.
    w = jnp.where(jnp.isfinite(lse_cmp).swapaxes(1, 2), w, 0.0)[..., None]
    o = o_sel + w * (o_cmp - o_sel)
    return o.astype(q.dtype), mass
