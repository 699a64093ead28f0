"""Persistent block-sparse attention (PBSA): Pallas kernels over a paged pool of KV blocks.

Index format (see `vidax.kernels.pbsa.index` for the details):

- `pool_k`, `pool_v` `(b, n_kv, num_slots, block_size, k)`: per batch element and KV head, a pool
  of `num_slots` blocks of `block_size` tokens. `slot_len` `(b, n_kv, num_slots)` (optional)
  counts the valid leading tokens of each slot.
- `q` `(b, n, l, k)` is cut into `num_q_tiles` tiles of `block_q` rows; the `n // n_kv` query
  heads of a KV head share its lists.
- `block_idx` int32 `(b, n_kv, num_q_tiles, max_sel)` lists the pool slots a query tile attends
  to; `block_cnt` int32 `(b, n_kv, num_q_tiles)` how many leading entries are valid. Duplicates
  count once; a tile with no valid token gets zeros (log-sum-exp `-inf`).

One softmax runs over the union of the selected blocks, so selecting every block equals dense
attention over the pool.

Segments: `pool_k` and `pool_v` may each be a tuple of pools (same batch, heads, block size,
head dim and dtype) read as their concatenation along the slots, never concatenated: a KV
cache and the current chunk's own blocks are attended in one softmax without copying the cache
every call. The TPU kernel copies each selected block from its segment (when blocks are
tile-aligned: otherwise the wrapper joins and pads them); the Triton kernel loops over each
segment's run of a tile's ascending list in turn, reading from that segment; the reference
concatenates.

RoPE on read: with `key_angles` `(b, n_kv, num_slots, k/2)` every key of slot `s` has its
interleaved pairs rotated by `key_angles[..., s, :]` as the kernel reads it. A cache whose
blocks change position while they sit in it (Sparse Forcing's time positions) stores them
rotated by the part of their position that does not move, and is never rewritten. The TPU
kernel rotates each copied block in VMEM, one `(1, k)` cos/sin row per slot; the Triton kernel
rotates the query rows instead (`q . R(a) k = R(-a) q . k`: two multiply-adds with the
pair-swapped query, which comes in beside it, so no lane shuffle), and only when a block's
angles differ from the previous block's (a Sparse Forcing frame's blocks share one); the
reference rotates the pool in XLA first.

How the kernels run: the wrapper sorts and de-duplicates the lists (`canonicalize_selection`)
and folds the query heads of a KV head into the rows of one program, so each program handles
`rows = groups * block_q` query rows against one KV head and reads every selected block once for
the whole group. The grid is `(b, n_kv, query tiles)`; inside, an online softmax (float32) loops
over the selected blocks with a **dynamic trip count** `block_cnt`: unselected slots are never
read and cost nothing.

- `backend="tpu"` (Mosaic): the counts are scalar-prefetched (`PrefetchScalarGridSpec`); each
  program's list row and its head's slot lengths come in as SMEM blocks (prefetching every list
  would overflow SMEM, 1 MiB on v5e, at Sparse Forcing sizes). The pools stay in HBM
  (`memory_space=pl.ANY`) and the loop copies `BlockSizes.block_kv // stride` selected blocks
  per step into a double-buffered VMEM scratch, starting the next step's copies before
  computing the current one. Mosaic copies whole sublane tiles only, so for several blocks a
  step the wrapper pads each block to a tile-aligned `stride` (its size rounded up to 16 rows
  in bf16; Wan's 60-token blocks take 64, the 4 extra zero and masked).
- `backend="triton"` (GPU): the same loop reads one block per step straight from its pool
  segment with a dynamic `pl.ds` offset. Triton wants power-of-two tiles: the wrapper pads the
  rows, and `k` must be a power of two of at least 16. A `block_size` that is a power of two
  >= 16 is read as is; any other (Wan's 1560 tokens per frame cut into blocks of 40, 60 or 120)
  is read as a window of the next power of two (>= 16) of the flattened segment, starting at
  the block or, for the last blocks of the segment, earlier so that it stays in bounds, and the
  tokens outside the block are masked: no copy of the pool, no out-of-bounds read (a segment
  shorter than one window, only in toy sizes, is padded: a copy).
- `backend="reference"`: the gather-then-attend XLA path of `pbsa_reference`.

Gradients: `pbsa` is a `jax.custom_vjp`. The backward pass (`backward.pbsa_backward`) is XLA,
not Pallas: a scan over query tiles recomputes each tile's probabilities from the saved
log-sum-exp and scatter-adds its key/value gradients into the pool gradients, so it holds one
tile's gathered blocks at a time instead of the reference's whole gather.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float, Int

from vidax.kernels.pbsa.backward import pbsa_backward
from vidax.kernels.pbsa.index import (
    PbsaDims,
    canonicalize_selection,
    check_inputs,
    check_key_angles,
    full_slot_len,
    iota_below,
)
from vidax.kernels.pbsa.reference import _attend, _q_tiles, rotate_keys

BACKENDS = ("auto", "tpu", "triton", "reference")
# Query rows of one TPU program at most (`BlockSizes.block_q=None`): a Wan 480p frame's 1560
# queries run as one program reading its frame's selected blocks once (on a v5e at 30% of the
# blocks: 3.83 ms against 4.36 ms as 4 programs of 390 rows, docs/sparse_forcing.md).
TPU_MAX_ROWS = 1600
TPU_VMEM_LIMIT = 48 * 2**20  # scoped VMEM a program may use (the compiler's default: 16 MiB)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockSizes:
    """Tile sizes of the PBSA kernels (never part of a model config).

    Attributes:
        block_q: query rows (per head) of one program; must divide the selection tile
            `block_q` of the lists. None uses the largest divisor of the selection tile that
            keeps `groups * block_q` within `TPU_MAX_ROWS` rows on TPU and within 128 padded
            rows on GPU.
        block_kv: key rows per inner step on TPU, rounded down to whole pool blocks of their
            aligned stride (at least one). Larger steps amortise the loop and feed the MXU
            wider matmuls.
        num_warps: Triton warps per program; None picks 4 for `k <= 64`, else 8.
        num_stages: Triton software-pipelining stages.
    """

    block_q: int | None = None
    block_kv: int = 1024
    num_warps: int | None = None
    num_stages: int = 2

    def __post_init__(self):
        if self.block_q is not None and self.block_q <= 0:
            raise ValueError(f"BlockSizes.block_q must be positive, got {self.block_q}")
        if self.block_kv <= 0:
            raise ValueError(f"BlockSizes.block_kv must be positive, got {self.block_kv}")
        if self.num_warps is not None and self.num_warps <= 0:
            raise ValueError(f"BlockSizes.num_warps must be positive, got {self.num_warps}")
        if self.num_stages <= 0:
            raise ValueError(f"BlockSizes.num_stages must be positive, got {self.num_stages}")

    @classmethod
    def get_default(cls) -> BlockSizes:
        return cls()


@dataclasses.dataclass(frozen=True)
class _Static:
    """Everything static about one call; hashable so it can be a `custom_vjp` nondiff arg."""

    dims: PbsaDims
    scale: float
    block_sizes: BlockSizes
    backend: str
    interpret: bool

    @property
    def q_split(self) -> int:
        """Programs per selection tile."""
        d, bq = self.dims, self.block_sizes.block_q
        if bq is None and self.backend in ("triton", "tpu"):
            divisors = [c for c in range(1, d.block_q + 1) if d.block_q % c == 0]
            if self.backend == "triton":
                # A Triton program keeps its (rows, k) accumulator in registers: keep the
                # padded rows (groups * bq, rounded up to a power of two) at most 128.
                fits = [c for c in divisors if pl.next_power_of_2(d.groups * c) <= 128]
            else:
                # A Mosaic program holds a few (rows, keys per step) float32 tiles in VMEM
                # (16 MiB scoped on a v5e): at most TPU_MAX_ROWS rows. Every program reads its
                # tile's keys, so the fewer programs per tile the fewer key reads.
                fits = [c for c in divisors if d.groups * c <= TPU_MAX_ROWS]
            bq = max(fits or [1])
        return d.block_q // (bq or d.block_q)


Pool = Float[Array, "b n_kv slots bs k"] | tuple[Float[Array, "b n_kv _ bs k"], ...]


def pbsa(
    q: Float[Array, "b n l k"],
    pool_k: Pool,
    pool_v: Pool,
    block_idx: Int[Array, "b n_kv nq s"],
    block_cnt: Int[Array, "b n_kv nq"],
    *,
    block_q: int | None = None,
    scale: float | None = None,
    slot_len: Int[Array, "b n_kv slots"] | None = None,
    key_angles: Float[Array, "b n_kv slots k/2"] | None = None,
    return_lse: bool = False,
    block_sizes: BlockSizes | None = None,
    backend: str = "auto",
    interpret: bool = False,
):
    """Block-sparse attention of query tiles over their selected pool blocks (kernel).

    Same contract as `pbsa_reference` (see the module docstring for the index format).

    Args:
        q: queries `(b, n, l, k)`.
        pool_k: key pool `(b, n_kv, num_slots, block_size, k)`, or a tuple of segments whose
            slots add up to `num_slots` (module docstring).
        pool_v: value pool, same shape (and segments).
        block_idx: int `(b, n_kv, num_q_tiles, max_sel)` selected slots per query tile.
        block_cnt: int `(b, n_kv, num_q_tiles)` valid leading entries of `block_idx`.
        block_q: query rows per selection tile; None infers `l // num_q_tiles`.
        scale: logit scale, default `k ** -0.5`.
        slot_len: int `(b, n_kv, num_slots)` or `(b, num_slots)` valid tokens per slot.
        key_angles: optional float `(b, n_kv, num_slots, k/2)` RoPE angles per slot, applied to
            the keys as they are read (module docstring); no gradient flows to them.
        return_lse: also return the float32 log-sum-exp `(b, n, l)` (`-inf` for empty rows).
        block_sizes: kernel tiles, default `BlockSizes.get_default()`.
        backend: "tpu" (Mosaic), "triton" (GPU), "reference" (XLA) or "auto": the kernel of the
            default device's platform; on CPU the TPU kernel when `interpret` is set, else the
            reference.
        interpret: run the Pallas kernel in interpret mode (any host, for tests).

    Returns:
        `out` `(b, n, l, k)` in `q.dtype`, or `(out, lse)`.

    Raises:
        ValueError: for inconsistent shapes or lists (see `check_inputs`), an unknown backend,
            or tiles the chosen backend cannot run.
    """
    seg_k, seg_v = _segments(pool_k, "pool_k"), _segments(pool_v, "pool_v")
    whole_k, whole_v = _joined_shape(seg_k), _joined_shape(seg_v)
    d = check_inputs(q, whole_k, whole_v, block_idx, block_cnt, block_q=block_q, slot_len=slot_len)
    if [x.shape[2] for x in seg_k] != [x.shape[2] for x in seg_v]:
        raise ValueError("pool_k and pool_v must be cut into segments of the same slots")
    check_key_angles(key_angles, d)
    block_sizes = BlockSizes.get_default() if block_sizes is None else block_sizes
    backend = _resolve_backend(backend, interpret)
    _check_tiles(d, block_sizes, backend, q.dtype, whole_k.dtype)
    static = _Static(
        dims=d,
        scale=float(d.k**-0.5 if scale is None else scale),
        block_sizes=block_sizes,
        backend=backend,
        interpret=interpret,
    )
    idx, cnt = canonicalize_selection(block_idx, block_cnt, d.num_slots)
    lens = full_slot_len(
        slot_len, b=d.b, n_kv=d.n_kv, num_slots=d.num_slots, block_size=d.block_size
    )
    angles = None if key_angles is None else key_angles.astype(jnp.float32)
    out, lse = _pbsa(q, seg_k, seg_v, idx, cnt, lens, angles, static)
    return (out, lse) if return_lse else out


def _segments(pool, name: str) -> tuple[Array, ...]:
    """A pool or a tuple of pool segments as a non-empty tuple of 5-D arrays that agree on
    everything but their slots."""
    segs = tuple(pool) if isinstance(pool, (tuple, list)) else (pool,)
    if not segs or any(x.ndim != 5 for x in segs):
        raise ValueError(f"{name} must be (b, n_kv, num_slots, block_size, k) or a tuple of such")
    first = segs[0]
    for x in segs[1:]:
        if (
            x.shape[:2] != first.shape[:2]
            or x.shape[3:] != first.shape[3:]
            or x.dtype != first.dtype
        ):
            raise ValueError(
                f"{name} segments must agree on (b, n_kv, ., block_size, k) and dtype, got "
                f"{[(x.shape, str(x.dtype)) for x in segs]}"
            )
    return segs


def _joined_shape(segs: tuple[Array, ...]) -> jax.ShapeDtypeStruct:
    b, n_kv, _, bs, k = segs[0].shape
    slots = sum(x.shape[2] for x in segs)
    return jax.ShapeDtypeStruct((b, n_kv, slots, bs, k), segs[0].dtype)


def _join(segs: tuple[Array, ...]) -> Array:
    """The segments as one pool (a copy when there are several)."""
    return segs[0] if len(segs) == 1 else jnp.concatenate(segs, axis=2)


def _split(pool: Array, like: tuple[Array, ...]) -> tuple[Array, ...]:
    """Inverse of `_join`: the pool cut into segments of `like`'s slots."""
    return tuple(jnp.split(pool, _segment_starts(like)[1:], axis=2))


def _segment_starts(segs: tuple[Array, ...]) -> tuple[int, ...]:
    """The joined pool's slot at which each segment starts."""
    return tuple(int(x) for x in np.cumsum([0] + [x.shape[2] for x in segs])[:-1])


def _resolve_backend(backend: str, interpret: bool) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown pbsa backend {backend!r}; choose from {BACKENDS}")
    if backend != "auto":
        return backend
    platform = jax.default_backend()
    if platform == "tpu":
        return "tpu"
    if platform in ("gpu", "cuda", "rocm"):
        return "triton"
    return "tpu" if interpret else "reference"


def _check_tiles(d: PbsaDims, bs: BlockSizes, backend: str, q_dtype, kv_dtype) -> None:
    if bs.block_q is not None and d.block_q % bs.block_q:
        raise ValueError(
            f"BlockSizes.block_q={bs.block_q} must divide the selection tile block_q={d.block_q}"
        )
    if q_dtype != kv_dtype:
        raise ValueError(f"q and the pool must share a dtype, got {q_dtype} and {kv_dtype}")
    if backend == "triton" and (d.k < 16 or d.k & (d.k - 1)):
        raise ValueError(f"the triton backend needs head dim k a power of two >= 16, got {d.k}")


# ----------------------------------------------------------------------------- custom VJP


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _pbsa(q, pool_k, pool_v, idx, cnt, lens, angles, static: _Static):
    return _forward(q, pool_k, pool_v, idx, cnt, lens, angles, static)


def _pbsa_fwd(q, pool_k, pool_v, idx, cnt, lens, angles, static: _Static):
    out, lse = _forward(q, pool_k, pool_v, idx, cnt, lens, angles, static)
    return (out, lse), (q, pool_k, pool_v, idx, cnt, lens, angles, out, lse)


def _pbsa_bwd(static: _Static, res, cotangents):
    q, seg_k, seg_v, idx, cnt, lens, angles, out, lse = res
    d_out, d_lse = cotangents
    pool_k, pool_v = _join(seg_k), _join(seg_v)
    if angles is not None:  # the keys attention saw; their gradient rotated back (R^T = R(-a))
        pool_k = rotate_keys(pool_k, angles)
    dq, dk, dv = pbsa_backward(
        q, pool_k, pool_v, idx, cnt, lens, out, lse, d_out, d_lse, static.dims, static.scale
    )
    d_angles = None
    if angles is not None:
        dk = rotate_keys(dk, -angles)
        d_angles = jnp.zeros_like(angles)  # positions are not learned
    return dq, _split(dk, seg_k), _split(dv, seg_v), None, None, None, d_angles


_pbsa.defvjp(_pbsa_fwd, _pbsa_bwd)


def _forward(q, seg_k, seg_v, idx, cnt, lens, angles, static: _Static):
    d = static.dims
    if static.backend == "tpu":
        o, lse = _call_tpu(_rows(q, static), seg_k, seg_v, idx, cnt, lens, angles, static)
        return _unrows(o, lse, q.dtype, static)
    if static.backend == "triton":
        o, lse = _call_triton(_rows(q, static), seg_k, seg_v, idx, cnt, lens, angles, static)
        return _unrows(o, lse, q.dtype, static)
    pool_k, pool_v = _join(seg_k), _join(seg_v)
    if angles is not None:
        pool_k = rotate_keys(pool_k, angles)  # rotated in XLA, then read as stored
    return _attend(q, pool_k, pool_v, idx, cnt, lens, d, static.scale)


def _rows(q: Array, static: _Static) -> Array:
    """`(b, n, l, k)` -> `(b, n_kv, num_programs_q, groups * bq, k)`: a group's heads as rows."""
    d, split = static.dims, static.q_split
    bq = d.block_q // split
    x = _q_tiles(q, d).reshape(d.b, d.n_kv, d.groups, d.num_q_tiles, split, bq, d.k)
    x = x.transpose(0, 1, 3, 4, 2, 5, 6)
    return x.reshape(d.b, d.n_kv, d.num_q_tiles * split, d.groups * bq, d.k)


def _unrows(o: Array, lse: Array, dtype, static: _Static):
    """Inverse of `_rows` for the output and the log-sum-exp (drops padded rows)."""
    d, split = static.dims, static.q_split
    bq = d.block_q // split
    rows = d.groups * bq
    o = o[..., :rows, :].reshape(d.b, d.n_kv, d.num_q_tiles, split, d.groups, bq, d.k)
    o = o.transpose(0, 1, 4, 2, 3, 5, 6).reshape(d.b, d.n, d.num_q_tiles * d.block_q, d.k)
    lse = lse[..., :rows].reshape(d.b, d.n_kv, d.num_q_tiles, split, d.groups, bq)
    lse = lse.transpose(0, 1, 4, 2, 3, 5).reshape(d.b, d.n, d.num_q_tiles * d.block_q)
    return o[:, :, : d.lq].astype(dtype), lse[:, :, : d.lq]


def _pad_rows(x: Array, rows: int) -> Array:
    pad = rows - x.shape[-2]
    return x if pad == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pad), (0, 0)])


# ----------------------------------------------------------------------------- TPU (Mosaic)


def _tpu_block_stride(block_size: int, dtype) -> int:
    """Rows a pool block takes in the VMEM buffer when a step copies several: its size rounded
    up to the sublane tile (8 for 32-bit, 16 for 16-bit dtypes), so every copy is whole tiles."""
    tile = 8 * (4 // jnp.dtype(dtype).itemsize)
    return -(-block_size // tile) * tile


def _tpu_steps(d: PbsaDims, block_kv: int, dtype) -> tuple[int, int]:
    """(blocks copied per inner step, rows each takes in the VMEM buffer)."""
    stride = _tpu_block_stride(d.block_size, dtype)
    steps = max(1, min(block_kv // stride, d.max_sel))
    return steps, stride if steps > 1 else d.block_size


def _rotation_rows(angles: Array) -> tuple[Array, Array]:
    """Per-slot angles `(b, n_kv, slots, k/2)` -> lane rows `(b, n_kv, slots, k)` float32:
    `cos` per lane and `sin` signed so that a key row `x` rotates as
    `x * cos + swap_pairs(x) * sin` (`swap_pairs` exchanges lanes 2j and 2j + 1)."""
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    lanes = lambda x: jnp.repeat(x, 2, axis=-1)
    sign = jnp.tile(jnp.asarray([-1.0, 1.0], jnp.float32), angles.shape[-1])
    return lanes(cos), lanes(sin) * sign.reshape((1,) * (angles.ndim - 1) + (-1,))


def _call_tpu(rows_q, seg_k, seg_v, idx, cnt, lens, angles, static: _Static):
    d = static.dims
    b, n_kv, n_prog, rows, k = rows_q.shape
    # Sublane-align the rows (8 for 32-bit, 16 for 16-bit dtypes); padded rows are dropped.
    align = 8 * (4 // jnp.dtype(rows_q.dtype).itemsize)
    rows_p = -(-rows // align) * align
    rows_q = _pad_rows(rows_q, rows_p)
    dtype = seg_k[0].dtype
    steps, stride = _tpu_steps(d, static.block_sizes.block_kv, dtype)
    if stride != d.block_size:
        # Mosaic copies whole sublane tiles only: pad each block to its stride (zeros, masked
        # by the slot lengths). One extra pass over the pool, segments joined on the way (a
        # pool built at a tile-aligned block size, e.g. 64 rather than 60, is read in place).
        pad = [(0, 0)] * 3 + [(0, stride - d.block_size), (0, 0)]
        seg_k, seg_v = (jnp.pad(_join(seg_k), pad),), (jnp.pad(_join(seg_v), pad),)
    seg_starts = _segment_starts(seg_k)
    rotate = angles is not None
    kernel = functools.partial(
        _pbsa_tpu_kernel,
        scale=static.scale,
        steps=steps,
        stride=stride,
        num_q_tiles=d.num_q_tiles,
        q_split=static.q_split,
        rotate=rotate,
        seg_starts=seg_starts,
    )
    rotation_specs, rotation_args = [], []
    if rotate:
        # The (b, h) rows of every slot, VMEM-resident across the head's query programs (the
        # block index does not change along the grid's last axis, so they are copied once).
        row = pl.BlockSpec((None, None, d.num_slots, k), lambda b, h, i, _: (b, h, 0, 0))
        rotation_specs, rotation_args = [row, row], list(_rotation_rows(angles))
    split = static.q_split

    def tile_map(b, h, i, cnt_ref):  # the selection tile of program i
        del cnt_ref
        return b, h, jax.lax.div(i, split), 0, 0

    def row_map(b, h, i, cnt_ref):
        del cnt_ref
        return b, h, i, 0, 0

    grid_spec = pltpu.PrefetchScalarGridSpec(
        # Only the counts are prefetched whole (they set the trip counts); each program's list
        # and the slot lengths arrive as small SMEM blocks, so SMEM (1 MiB on v5e) holds a few
        # rows of the lists, never all of them.
        num_scalar_prefetch=1,
        grid=(b, n_kv, n_prog),
        in_specs=[
            # Blocks end in (1, size) of unit-padded arrays: Mosaic wants the last two block
            # dims equal to the array's (or (8, 128)-aligned).
            pl.BlockSpec((None, None, None, 1, d.max_sel), tile_map, memory_space=pltpu.SMEM),
            pl.BlockSpec(
                (None, None, 1, d.num_slots),
                lambda b, h, i, _: (b, h, 0, 0),
                memory_space=pltpu.SMEM,
            ),
            pl.BlockSpec((None, None, None, rows_p, k), row_map),
            *[pl.BlockSpec(memory_space=pl.ANY)] * (2 * len(seg_k)),
            *rotation_specs,
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, rows_p, k), row_map),
            pl.BlockSpec((None, None, None, rows_p, 1), row_map),
        ],
        scratch_shapes=[
            pltpu.VMEM((2, steps * stride, k), dtype),
            pltpu.VMEM((2, steps * stride, k), seg_v[0].dtype),
            pltpu.SemaphoreType.DMA((2, 2)),
        ],
    )
    o, lse = pl.pallas_call(
        kernel,
        grid_spec=grid_spec,
        out_shape=[
            jax.ShapeDtypeStruct((b, n_kv, n_prog, rows_p, k), rows_q.dtype),
            jax.ShapeDtypeStruct((b, n_kv, n_prog, rows_p, 1), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel"),
            # A program of 1,560 rows holds (rows, block_kv) float32 logits and probabilities:
            # with the rotation rows the default 16 MiB scope was 0.2 MiB short (v5e, Wan
            # 480p); VMEM is 128 MiB on v5e/v6e, 64 MiB on v7x.
            vmem_limit_bytes=TPU_VMEM_LIMIT,
        ),
        # The TPU interpreter models DMAs and semaphores and fills fresh buffers with NaN, so
        # a read of a block that was never copied would show up in the tests.
        interpret=pltpu.InterpretParams() if static.interpret else False,
        name="pbsa_tpu",
    )(
        cnt.reshape(-1),
        idx[:, :, :, None],
        lens[:, :, None],
        rows_q,
        *seg_k,
        *seg_v,
        *rotation_args,
    )
    return o, lse[..., 0]


def _rotate_rows(ref, cos: Array, sin: Array) -> None:
    """Rotates the interleaved pairs of the key rows in `ref` (rows, k) in place, in float32:
    `x * cos + swap_pairs(x) * sin` with `(1, k)` lane rows from `_rotation_rows`."""
    x = ref[...].astype(jnp.float32)
    k = x.shape[-1]
    even = jax.lax.rem(jax.lax.broadcasted_iota(jnp.int32, (1, k), 1), 2) == 0
    # pltpu.roll follows jnp.roll: shift 1 brings lane j - 1 to j, shift k - 1 lane j + 1.
    swapped = jnp.where(even, pltpu.roll(x, k - 1, 1), pltpu.roll(x, 1, 1))
    ref[...] = (x * cos + swapped * sin).astype(ref.dtype)


def _program_tile(num_q_tiles: int, q_split: int):
    """This program's batch b and kv head h, and the flat index of its query tile (tile
    i / q_split of (b, h)) in the count and list arrays."""
    b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    # lax.div/rem (truncating, fine for these non-negative ints): Python's floor `//` and `%`
    # lower through sign(), which Mosaic only lowers with a real TPU attached.
    return b, h, (b * pl.num_programs(1) + h) * num_q_tiles + jax.lax.div(i, q_split)


def _pbsa_tpu_kernel(
    cnt_ref,
    idx_ref,
    len_ref,
    q_ref,
    *refs,
    scale: float,
    steps: int,
    stride: int,
    num_q_tiles: int,
    q_split: int,
    rotate: bool,
    seg_starts: tuple[int, ...],
):
    n_seg = len(seg_starts)
    k_hbm_refs, v_hbm_refs, refs = refs[:n_seg], refs[n_seg : 2 * n_seg], refs[2 * n_seg :]
    if rotate:
        cos_ref, sin_ref = refs[:2]
    o_ref, lse_ref, k_scratch_ref, v_scratch_ref, sem_scratch_ref = refs[2 * rotate :]
    b, h, tile = _program_tile(num_q_tiles, q_split)
    cnt = cnt_ref[tile]
    num_steps = jax.lax.div(cnt + steps - 1, steps)

    def entry(step, u):
        # Past the count, repeat the last valid slot: in bounds, and masked out below.
        return jnp.minimum(step * steps + u, cnt - 1)

    def copies(step, buf, seg=0, units=None):
        """The step's block copies (of blocks `units`, default all) from segment `seg`
        (slots outside it clamped into it)."""
        out = []
        lo = seg_starts[seg]
        hi = seg_starts[seg + 1] if seg + 1 < n_seg else None
        for u in range(steps) if units is None else units:
            slot = idx_ref[0, entry(step, u)] - lo
            slot = jnp.maximum(slot, 0) if hi is None else jnp.clip(slot, 0, hi - lo - 1)
            rows = pl.ds(u * stride, stride)
            for src, dst, kind in (
                (k_hbm_refs[seg], k_scratch_ref, 0),
                (v_hbm_refs[seg], v_scratch_ref, 1),
            ):
                out.append(
                    pltpu.make_async_copy(
                        src.at[b, h, slot], dst.at[buf, rows], sem_scratch_ref.at[kind, buf]
                    )
                )
        return out

    def start(step, buf):
        if n_seg == 1:
            for c in copies(step, buf):
                c.start()
            return
        # Each block comes from the segment holding its slot; the waits below count bytes, so
        # any segment's descriptors of the same shape wait for them.
        for u in range(steps):
            slot = idx_ref[0, entry(step, u)]
            for seg in range(n_seg):
                inside = slot >= seg_starts[seg]
                if seg + 1 < n_seg:
                    inside &= slot < seg_starts[seg + 1]

                @pl.when(inside)
                def _start(seg=seg, u=u):
                    for c in copies(step, buf, seg, units=(u,)):
                        c.start()

    @pl.when(cnt > 0)
    def _prefetch_first():
        start(0, 0)

    q = q_ref[...]
    rows = q.shape[0]
    width = steps * stride
    # One row of column indices: the mask is built on it and broadcast over the query rows
    # (measured the same as a (rows, width) mask on a v5e; fewer vector ops).
    col = jax.lax.broadcasted_iota(jnp.int32, (1, width), 1)

    def body(step, carry):
        acc, m_prev, l_prev = carry
        buf = jax.lax.rem(step, 2)

        @pl.when(step + 1 < num_steps)
        def _prefetch_next():
            start(step + 1, 1 - buf)

        for c in copies(step, buf):
            c.wait()
        if rotate:
            # RoPE on read: rotate each copied block in place by its slot's angles.
            for u in range(steps):
                slot = idx_ref[0, entry(step, u)]
                _rotate_rows(
                    k_scratch_ref.at[buf, pl.ds(u * stride, stride)],
                    cos_ref[pl.ds(slot, 1), :],
                    sin_ref[pl.ds(slot, 1), :],
                )
        k = k_scratch_ref[buf]
        v = v_scratch_ref[buf]
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        s = s * scale
        # Column c of block u (u * stride <= c) is valid below u * stride + its slot's length.
        end = jnp.zeros((1, width), jnp.int32)
        for u in range(steps):
            e = step * steps + u
            lim = jnp.where(e < cnt, len_ref[0, idx_ref[0, entry(step, u)]], 0)
            end = jnp.where(col >= u * stride, u * stride + lim, end)
        s = jnp.where(col < end, s, -jnp.inf)
        m_next = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
        # Rows with nothing valid yet keep m = -inf; shift them by 0 so exp() gives 0, not NaN.
        m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next)
        alpha = jnp.exp(m_prev - m_safe)
        p = jnp.exp(s - m_safe)
        l_next = alpha * l_prev + p.sum(axis=-1, keepdims=True)
        pv = jax.lax.dot_general(
            p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )
        return alpha * acc + pv, m_next, l_next

    init = (
        jnp.zeros((rows, q.shape[1]), jnp.float32),
        jnp.full((rows, 1), -jnp.inf, jnp.float32),
        jnp.zeros((rows, 1), jnp.float32),
    )
    acc, m, denom = jax.lax.fori_loop(0, num_steps, body, init)
    has = denom > 0
    l_safe = jnp.where(has, denom, 1.0)
    o_ref[...] = (acc / l_safe).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(has, m + jnp.log(l_safe), -jnp.inf)


# ----------------------------------------------------------------------------- GPU (Triton)


def _call_triton(rows_q, seg_k, seg_v, idx, cnt, lens, angles, static: _Static):
    d = static.dims
    b, n_kv, n_prog, rows, k = rows_q.shape
    rows_p = max(16, pl.next_power_of_2(rows))
    rows_q = _pad_rows(rows_q, rows_p)
    window = _triton_window(d.block_size)

    def flat(seg):  # (b, n_kv, slots, bs, k) -> (b, n_kv, slots * bs, k), at least one window
        x = seg.reshape(b, n_kv, -1, k)
        if x.shape[2] < window:  # a segment smaller than one window (tiny tests): pad it
            x = jnp.pad(x, ((0, 0), (0, 0), (0, window - x.shape[2]), (0, 0)))
        return x

    flat_k, flat_v = [flat(x) for x in seg_k], [flat(x) for x in seg_v]
    firsts = _segment_starts(seg_k)
    # The canonical lists are ascending, so each segment's slots are one run of a tile's list:
    # `bounds[..., i:i + 2]` delimits segment i's run (the kernel loops over each in turn).
    live = iota_below(d.max_sel, cnt)
    cuts = [(live & (idx < first)).sum(-1, dtype=jnp.int32) for first in firsts[1:]]
    bounds = jnp.stack([jnp.zeros_like(cnt), *cuts, cnt], axis=-1)
    kernel = functools.partial(
        _pbsa_triton_kernel,
        scale=static.scale,
        block_size=d.block_size,
        window=window,
        segments=tuple((first, f.shape[2]) for first, f in zip(firsts, flat_k, strict=True)),
        rotate=angles is not None,
        max_sel=d.max_sel,
        num_slots=d.num_slots,
        num_q_tiles=d.num_q_tiles,
        q_split=static.q_split,
    )
    q_spec = pl.BlockSpec((None, None, None, rows_p, k), lambda b, h, i: (b, h, i, 0, 0))
    per_head = lambda x: pl.BlockSpec((None, None, *x.shape[2:]), lambda b, h, i: (b, h, 0, 0))
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    operands = [rows_q, *flat_k, *flat_v, idx.reshape(-1), bounds.reshape(-1), lens.reshape(-1)]
    in_specs = [q_spec, *map(per_head, flat_k), *map(per_head, flat_v), hbm, hbm, hbm]
    if angles is not None:
        # q . R(a) k = R(-a) q . k: the kernel rotates the query rows (by the pair-swapped rows
        # passed beside them: no lane shuffle in the loop) instead of each block's keys, and
        # only when a block's angles differ from the previous block's: `group` numbers the
        # runs of slots with equal angles (a Sparse Forcing frame's blocks share one angle).
        cos, sin = _rotation_rows(angles)
        same = jnp.all(angles[..., 1:, :] == angles[..., :-1, :], axis=-1)
        group = jnp.cumsum(jnp.pad(~same, ((0, 0), (0, 0), (1, 0))), -1, dtype=jnp.int32)
        operands += [_swap_pairs(rows_q), cos, sin, group.reshape(-1)]
        in_specs += [q_spec, per_head(cos), per_head(sin), hbm]
    bsz = static.block_sizes
    o, lse = pl.pallas_call(
        kernel,
        grid=(b, n_kv, n_prog),
        in_specs=in_specs,
        out_specs=[
            pl.BlockSpec((None, None, None, rows_p, k), lambda b, h, i: (b, h, i, 0, 0)),
            pl.BlockSpec((None, None, None, rows_p), lambda b, h, i: (b, h, i, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((b, n_kv, n_prog, rows_p, k), rows_q.dtype),
            jax.ShapeDtypeStruct((b, n_kv, n_prog, rows_p), jnp.float32),
        ],
        compiler_params=plgpu.CompilerParams(
            num_warps=bsz.num_warps or (4 if k <= 64 else 8), num_stages=bsz.num_stages
        ),
        interpret=static.interpret,
        name="pbsa_triton",
    )(*operands)
    return o, lse


def _swap_pairs(x: Array) -> Array:
    """Lanes 2j and 2j + 1 of the last axis exchanged."""
    return x.reshape(*x.shape[:-1], -1, 2)[..., ::-1].reshape(x.shape)


def _triton_window(block_size: int) -> int:
    """Keys the Triton kernel loads per selected block: the block itself when it is a power of
    two of at least 16 (`tl.dot`'s minimum), else the next such power of two."""
    return max(16, pl.next_power_of_2(block_size))


def _pbsa_triton_kernel(
    *refs,
    scale: float,
    block_size: int,
    window: int,
    segments: tuple[tuple[int, int], ...],
    rotate: bool,
    max_sel: int,
    num_slots: int,
    num_q_tiles: int,
    q_split: int,
):
    """One program: `rows` query rows against its tile's selected blocks.

    `refs`: the query rows, the flattened key segments, the value segments, then (flat, in
    HBM) the lists, each tile's segment bounds in its list and the slot lengths; with `rotate`
    the pair-swapped query rows, the per-slot cos / signed-sin lane rows and the slots' angle
    groups; then the output and the log-sum-exp. `segments`: (first slot, flattened rows) of
    each pool segment."""
    nseg = len(segments)
    q_ref, refs = refs[0], refs[1:]
    k_refs, v_refs, refs = refs[:nseg], refs[nseg : 2 * nseg], refs[2 * nseg :]
    idx_ref, bounds_ref, len_ref, *rest = refs
    o_ref, lse_ref = rest[-2:]
    b, h, tile = _program_tile(num_q_tiles, q_split)
    n_kv = pl.num_programs(1)
    list_base = tile * max_sel
    len_base = (b * n_kv + h) * num_slots
    q = q_ref[...]
    rows, k = q.shape
    # exp2 is the native instruction: fold log2(e) into the scale, convert back for the LSE.
    qk_scale = scale * math.log2(math.e)
    tok = jnp.arange(window, dtype=jnp.int32)

    def window_of(local, lim, flat):
        """(start row, valid-token mask) of the keys of a segment's `local`-th block."""
        begin = local * block_size
        if window == block_size:  # the block is a power-of-two tile: read it as is
            return begin, tok < lim
        # A window of `window` keys holding the block, moved back at the end of the segment
        # so the read stays in bounds; keys outside the block's valid tokens are masked.
        start = jnp.minimum(begin, flat - window)
        off = begin - start
        return start, (tok >= off) & (tok < off + lim)

    def rotated(slot):  # R(-a) q for the slot's angles a (q . R(a) k = R(-a) q . k)
        qs_ref, cos_ref, sin_ref = rest[:3]
        row, f32 = pl.ds(slot, 1), jnp.float32
        rot = q_ref[...].astype(f32) * cos_ref[row, :] - qs_ref[...].astype(f32) * sin_ref[row, :]
        return rot.astype(q.dtype)

    def step(segment):
        first, flat = segments[segment]

        def body(j, carry):
            acc, m_prev, l_prev, qj, group_prev = carry
            slot = idx_ref[list_base + j]
            start, ok = window_of(slot - first, len_ref[len_base + slot], flat)
            keys = pl.ds(start, window)
            kb, vb = k_refs[segment][keys, :], v_refs[segment][keys, :]
            if rotate:  # rotate the query again only when the angles change
                group = rest[3][len_base + slot]
                qj = jax.lax.cond(group != group_prev, rotated, lambda _: qj, slot)
                group_prev = group
            s = plgpu.dot(qj, kb, trans_b=True) * qk_scale
            s = jnp.where(ok[None, :], s, -jnp.inf)
            m_next = jnp.maximum(m_prev, s.max(axis=-1))
            m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next)
            alpha = jnp.exp2(m_prev - m_safe)
            p = jnp.exp2(s - m_safe[:, None])
            l_next = alpha * l_prev + p.sum(axis=-1)
            acc = alpha[:, None] * acc + plgpu.dot(p.astype(vb.dtype), vb)
            return acc, m_next, l_next, qj, group_prev

        return body

    carry = (
        jnp.zeros((rows, k), jnp.float32),
        jnp.full((rows,), -jnp.inf, jnp.float32),
        jnp.zeros((rows,), jnp.float32),
        q,  # the query as attended (rotated for the current angle group with `rotate`)
        jnp.int32(-1),  # that angle group (none yet)
    )
    bounds_base = tile * (nseg + 1)
    for i in range(nseg):  # each segment's run of the ascending list, one unmasked read a block
        lo, hi = bounds_ref[bounds_base + i], bounds_ref[bounds_base + i + 1]
        carry = jax.lax.fori_loop(lo, hi, step(i), carry)
    acc, m, denom = carry[:3]
    has = denom > 0
    l_safe = jnp.where(has, denom, 1.0)
    o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(has, (m + jnp.log2(l_safe)) * math.log(2.0), -jnp.inf)
