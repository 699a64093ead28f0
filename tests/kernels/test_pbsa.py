"""PBSA: reference == dense masked attention, kernels (interpreted) == reference, pool updates.

Interpret mode compiles slowly, so shapes are fixed per case (one compile each, cached) and
hypothesis varies the data (selections, counts, slot lengths), which does not recompile.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax._src.lib import triton as triton_mlir  # the Triton MLIR dialect shipped with jaxlib
from jax._src.lib.mlir import ir
from jax.experimental import pallas as pl

from vidax.kernels.pbsa import (
    BlockSizes,
    block_means,
    canonicalize_selection,
    gather_blocks,
    pbsa,
    pbsa_reference,
    rotate_keys,
    selection_from_mask,
    selection_mask,
    update_pool,
)
from vidax.nn import attention

F32_TOL = 1e-5
BF16_TOL = 1e-3  # of the output scale, plus one bf16 ulp of each value (output rounding)


@dataclasses.dataclass(frozen=True)
class Case:
    b: int = 1
    n: int = 4
    n_kv: int = 2
    lq: int = 40  # ragged: 40 = 2 * 16 + 8
    k: int = 32
    num_slots: int = 6
    block_size: int = 16
    block_q: int = 16
    max_sel: int = 4

    @property
    def num_q_tiles(self) -> int:
        return -(-self.lq // self.block_q)


GQA_RAGGED = Case()
MHA_EVEN = Case(b=2, n=2, n_kv=2, lq=32, k=16, num_slots=5, max_sel=5)
# Frames whose token count is not a multiple of 16, one frame per block (block_size must divide a
# frame): 24 tokens (the Triton kernel reads 32-key windows; the TPU kernel copies several
# blocks a step, in float32 tile-aligned as they are) and 60 tokens (64-key windows; on TPU
# padded to a 64-row stride when a step copies several, as is when it copies one), the query
# tiles not aligned to the blocks, the last tile partial.
FRAME_24 = Case(n=4, n_kv=2, lq=60, num_slots=7, block_size=24, block_q=24, max_sel=4)
FRAME_60 = Case(n=2, n_kv=1, lq=60, k=16, num_slots=3, block_size=60, block_q=32, max_sel=3)


def make_inputs(case: Case, seed: int, dtype=jnp.float32, *, garbage: bool = True):
    """Random q/pools and random lists: duplicates, empty tiles, partial slots, junk past cnt."""
    rng = np.random.default_rng(seed)
    c = case
    q = rng.normal(size=(c.b, c.n, c.lq, c.k))
    pk = rng.normal(size=(c.b, c.n_kv, c.num_slots, c.block_size, c.k))
    pv = rng.normal(size=(c.b, c.n_kv, c.num_slots, c.block_size, c.k))
    idx = rng.integers(0, c.num_slots, size=(c.b, c.n_kv, c.num_q_tiles, c.max_sel))
    cnt = rng.integers(0, c.max_sel + 1, size=(c.b, c.n_kv, c.num_q_tiles))
    if garbage:  # entries past the count are ignored, whatever they hold
        junk = rng.choice([-7, c.num_slots, 10**6], size=idx.shape)
        idx = np.where(np.arange(c.max_sel) < cnt[..., None], idx, junk)
    lens = rng.integers(0, c.block_size + 1, size=(c.b, c.n_kv, c.num_slots))
    lens[..., 0] = c.block_size  # keep a full slot around
    return (
        jnp.asarray(q, dtype),
        jnp.asarray(pk, dtype),
        jnp.asarray(pv, dtype),
        jnp.asarray(idx, jnp.int32),
        jnp.asarray(cnt, jnp.int32),
        jnp.asarray(lens, jnp.int32),
    )


def dense_oracle(q, pk, pv, idx, cnt, lens, *, block_q: int, impl: str = "reference"):
    """Dense masked attention over the flattened pool via `vidax.nn.attention`, plus the LSE."""
    b, n, lq, k = q.shape
    _, n_kv, num_slots, block_size, _ = pk.shape
    g = n // n_kv
    mask = selection_mask(
        idx,
        cnt,
        num_slots=num_slots,
        block_size=block_size,
        lq=lq,
        block_q=block_q,
        slot_len=lens,
    )
    mask = jnp.repeat(mask, g, axis=1)  # (b, n, l, s)

    def tokens(pool):
        return jnp.repeat(pool.reshape(b, n_kv, -1, k), g, axis=1).transpose(0, 2, 1, 3)

    kd, vd = tokens(pk), tokens(pv)
    out = attention(q.transpose(0, 2, 1, 3), kd, vd, mask=mask, impl=impl).transpose(0, 2, 1, 3)
    has = mask.any(-1)
    out = jnp.where(has[..., None], out, jnp.zeros((), out.dtype))
    logits = jnp.einsum("bnlk,bsnk->bnls", q.astype(jnp.float32), kd.astype(jnp.float32)) * (
        k**-0.5
    )
    lse = jax.nn.logsumexp(jnp.where(mask, logits, -jnp.inf), axis=-1)
    return out, lse


def kernel_fn(case: Case, backend: str, block_sizes: BlockSizes | None = None):
    """One jitted (interpreted) kernel per case/backend: hypothesis examples reuse the compile."""
    return _kernel_fn(case.block_q, backend, block_sizes)


@functools.cache
def _kernel_fn(block_q: int, backend: str, block_sizes: BlockSizes | None):
    return jax.jit(
        functools.partial(
            pbsa,
            block_q=block_q,
            return_lse=True,
            backend=backend,
            interpret=True,
            block_sizes=block_sizes,
        )
    )


@functools.cache
def reference_fn(block_q: int):
    return jax.jit(functools.partial(pbsa_reference, block_q=block_q, return_lse=True))


@functools.cache
def dense_fn(block_q: int, impl: str = "reference"):
    return jax.jit(functools.partial(dense_oracle, block_q=block_q, impl=impl))


def assert_lse_close(lse, want, tol):
    fin = np.isfinite(np.asarray(want))
    np.testing.assert_array_equal(np.isfinite(np.asarray(lse)), fin)
    np.testing.assert_allclose(np.asarray(lse)[fin], np.asarray(want)[fin], atol=tol, rtol=tol)


# ----------------------------------------------------------------------------- reference


@pytest.mark.parametrize("impl", ["reference", "xla"])
@pytest.mark.parametrize("case", [GQA_RAGGED, MHA_EVEN], ids=["gqa_ragged", "mha_even"])
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_reference_matches_dense_mask(case, impl, seed):
    q, pk, pv, idx, cnt, lens = make_inputs(case, seed)
    out, lse = reference_fn(case.block_q)(q, pk, pv, idx, cnt, slot_len=lens)
    want, want_lse = dense_fn(case.block_q, impl)(q, pk, pv, idx, cnt, lens)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == q.shape[:3] and lse.dtype == jnp.float32
    np.testing.assert_allclose(out, want, atol=F32_TOL, rtol=F32_TOL)
    assert_lse_close(lse, want_lse, 1e-5)


def test_reference_infers_block_q_and_defaults():
    case = MHA_EVEN
    q, pk, pv, idx, cnt, _ = make_inputs(case, 0)
    out = pbsa_reference(q, pk, pv, idx, cnt)  # block_q = 32 // 2, every slot full
    want, _ = dense_fn(case.block_q)(q, pk, pv, idx, cnt, None)
    np.testing.assert_allclose(out, want, atol=F32_TOL, rtol=F32_TOL)


@settings(max_examples=20, deadline=None)
@given(
    lists=st.lists(st.lists(st.integers(-2, 9), min_size=5, max_size=5), min_size=3, max_size=3),
    counts=st.lists(st.integers(0, 5), min_size=3, max_size=3),
)
def test_canonicalize_is_the_sorted_set_of_valid_entries(lists, counts):
    num_slots = 7
    idx = jnp.asarray(lists, jnp.int32)[None, None]
    cnt = jnp.asarray(counts, jnp.int32)[None, None]
    got_idx, got_cnt = canonicalize_selection(idx, cnt, num_slots)
    for row, c, gi, gc in zip(lists, counts, got_idx[0, 0], got_cnt[0, 0], strict=True):
        want = sorted({s for s in row[:c] if 0 <= s < num_slots})
        assert int(gc) == len(want)
        assert np.asarray(gi[: len(want)]).tolist() == want
        # Padding repeats the last valid slot (0 when empty): always a readable slot.
        assert set(np.asarray(gi[len(want) :]).tolist()) <= {want[-1] if want else 0}


def test_selection_from_mask_round_trips_through_the_dense_mask():
    case = GQA_RAGGED
    rng = np.random.default_rng(13)
    slot_mask = rng.random((case.b, case.n_kv, case.num_q_tiles, case.num_slots)) < 0.5
    slot_mask[0, 0, 0] = False  # an empty tile
    idx, cnt = selection_from_mask(jnp.asarray(slot_mask), case.num_slots)
    np.testing.assert_array_equal(cnt, slot_mask.sum(-1))
    dense = selection_mask(
        idx,
        cnt,
        num_slots=case.num_slots,
        block_size=case.block_size,
        lq=case.lq,
        block_q=case.block_q,
    )
    want = np.repeat(np.repeat(slot_mask, case.block_size, -1), case.block_q, 2)[:, :, : case.lq]
    np.testing.assert_array_equal(dense, want)
    with pytest.raises(ValueError, match="more than"):
        selection_from_mask(jnp.ones((1, 1, 1, 4), bool), 3)


# ----------------------------------------------------------------------------- kernels

BACKENDS = ["tpu", "triton"]
KERNEL_CASES = [
    (GQA_RAGGED, None),
    (MHA_EVEN, BlockSizes(block_q=8, block_kv=32)),  # 2 programs per tile, 2 blocks per step
    (FRAME_24, None),
    (FRAME_60, BlockSizes(block_kv=60)),  # one unpadded block a step
    # Blocks of 60 tokens padded to a 64-row stride, 3 a step: the padding zero and masked.
    (FRAME_60, BlockSizes(block_kv=256)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "case,block_sizes",
    KERNEL_CASES,
    ids=["gqa_ragged", "mha_split", "frame_24", "frame_60", "frame_60_steps"],
)
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_kernel_matches_reference_f32(case, block_sizes, backend, seed):
    q, pk, pv, idx, cnt, lens = make_inputs(case, seed)
    out, lse = kernel_fn(case, backend, block_sizes)(q, pk, pv, idx, cnt, slot_len=lens)
    want, want_lse = reference_fn(case.block_q)(q, pk, pv, idx, cnt, slot_len=lens)
    assert out.shape == want.shape and out.dtype == want.dtype
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(out, want, atol=F32_TOL, rtol=F32_TOL)
    assert_lse_close(lse, want_lse, F32_TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "case,block_sizes",
    [(GQA_RAGGED, None), (FRAME_24, None), (FRAME_60, BlockSizes(block_kv=256))],
    ids=["gqa_ragged", "frame_24", "frame_60_steps"],
)
def test_kernel_matches_reference_bf16(backend, case, block_sizes):
    q, pk, pv, idx, cnt, lens = make_inputs(case, 1, jnp.bfloat16)
    out, lse = kernel_fn(case, backend, block_sizes)(q, pk, pv, idx, cnt, slot_len=lens)
    assert out.dtype == jnp.bfloat16
    # The spec on the same (bf16-valued) inputs in float32.
    f32 = [x.astype(jnp.float32) for x in (q, pk, pv)]
    want, want_lse = reference_fn(case.block_q)(*f32, idx, cnt, slot_len=lens)
    got, want = np.asarray(out, np.float32), np.asarray(want)
    scale = np.abs(want).max()
    bound = BF16_TOL * scale + np.abs(want) * 2.0**-8
    assert (np.abs(got - want) <= bound).all(), np.abs(got - want).max() / scale
    assert_lse_close(lse, want_lse, 1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [GQA_RAGGED, FRAME_24], ids=["gqa_ragged", "frame_24"])
def test_kernel_empty_selection_is_zero(backend, case):
    q, pk, pv, idx, cnt, lens = make_inputs(case, 2)
    # Tile 0 has no entries; tile 1 selects only slots with no valid token; tile 2 is normal.
    lens = lens.at[:, :, 1:3].set(0)
    cnt = cnt.at[:, :, 0].set(0).at[:, :, 1].set(2).at[:, :, 2].set(2)
    idx = idx.at[:, :, 1, :2].set(jnp.asarray([1, 2], jnp.int32))
    idx = idx.at[:, :, 2, :2].set(jnp.asarray([0, 3], jnp.int32))
    out, lse = kernel_fn(case, backend)(q, pk, pv, idx, cnt, slot_len=lens)
    out, lse = np.asarray(out), np.asarray(lse)
    assert np.isfinite(out).all() and not np.isnan(lse).any()
    empty = slice(0, 2 * case.block_q)
    assert (out[:, :, empty] == 0).all()
    assert (lse[:, :, empty] == -np.inf).all()
    assert np.isfinite(lse[:, :, 2 * case.block_q :]).all()
    assert np.abs(out[:, :, 2 * case.block_q :]).max() > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_duplicates_count_once(backend):
    case = GQA_RAGGED
    q, pk, pv, _, _, lens = make_inputs(case, 3)
    shape = (case.b, case.n_kv, case.num_q_tiles, case.max_sel)
    unique = jnp.broadcast_to(jnp.asarray([4, 1, 0, 0], jnp.int32), shape)
    dup = jnp.broadcast_to(jnp.asarray([1, 4, 1, 4], jnp.int32), shape)
    two = jnp.full(shape[:3], 2, jnp.int32)
    four = jnp.full(shape[:3], 4, jnp.int32)
    f = kernel_fn(case, backend)
    out_dup, _ = f(q, pk, pv, dup, four, slot_len=lens)
    out_unique, _ = f(q, pk, pv, unique, two, slot_len=lens)
    want, _ = dense_fn(case.block_q)(q, pk, pv, unique, two, lens)
    np.testing.assert_allclose(out_dup, out_unique, atol=F32_TOL, rtol=F32_TOL)
    np.testing.assert_allclose(out_dup, want, atol=F32_TOL, rtol=F32_TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_all_blocks_is_dense_attention(backend):
    case = dataclasses.replace(MHA_EVEN, max_sel=MHA_EVEN.num_slots)
    q, pk, pv, _, _, _ = make_inputs(case, 4)
    shape = (case.b, case.n_kv, case.num_q_tiles, case.max_sel)
    idx = jnp.broadcast_to(jnp.arange(case.num_slots, dtype=jnp.int32)[::-1], shape)
    cnt = jnp.full(shape[:3], case.num_slots, jnp.int32)
    out, _ = kernel_fn(case, backend)(q, pk, pv, idx, cnt, slot_len=None)
    b, n_kv, _, _, k = pk.shape
    kd = pk.reshape(b, n_kv, -1, k).transpose(0, 2, 1, 3)
    vd = pv.reshape(b, n_kv, -1, k).transpose(0, 2, 1, 3)
    want = attention(q.transpose(0, 2, 1, 3), kd, vd, impl="xla").transpose(0, 2, 1, 3)
    np.testing.assert_allclose(out, want, atol=F32_TOL, rtol=F32_TOL)


@pytest.mark.parametrize("backend", ["tpu", "triton", "reference"])
def test_kernel_gradients_match_dense_oracle(backend):
    case = GQA_RAGGED
    q, pk, pv, idx, cnt, lens = make_inputs(case, 5)
    cnt = cnt.at[:, 0, 1].set(0).at[:, 1, 1].set(3)  # one empty tile, one full one
    rng = np.random.default_rng(6)
    w_out = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
    w_lse = jnp.asarray(rng.normal(size=q.shape[:3]), jnp.float32)

    def loss(fn):
        def f(q, pk, pv):
            out, lse = fn(q, pk, pv)
            return (out * w_out).sum() + jnp.where(jnp.isfinite(lse), lse * w_lse, 0.0).sum()

        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, pk, pv)

    kernel = kernel_fn(case, backend)
    got = loss(lambda q, pk, pv: kernel(q, pk, pv, idx, cnt, slot_len=lens))
    spec = loss(lambda q, pk, pv: reference_fn(case.block_q)(q, pk, pv, idx, cnt, slot_len=lens))
    dense = loss(lambda q, pk, pv: dense_fn(case.block_q)(q, pk, pv, idx, cnt, lens))
    # Query heads 0..g-1 share KV head 0, whose tile 1 is empty: no gradient reaches them.
    rows = slice(case.block_q, 2 * case.block_q)
    assert (np.asarray(got[0])[:, : case.n // case.n_kv, rows] == 0).all()
    for g, s, d in zip(got, spec, dense, strict=True):
        assert np.isfinite(np.asarray(g)).all()
        assert np.abs(np.asarray(g)).max() > 0
        np.testing.assert_allclose(g, s, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(g, d, atol=1e-4, rtol=1e-4)


def _key_angles(case: Case, seed: int):
    rng = np.random.default_rng(seed)
    shape = (case.b, case.n_kv, case.num_slots, case.k // 2)
    return jnp.asarray(rng.uniform(-20.0, 20.0, size=shape), jnp.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "case,block_sizes",
    [(GQA_RAGGED, None), (MHA_EVEN, BlockSizes(block_q=8, block_kv=32)), *KERNEL_CASES[3:]],
    ids=["gqa_ragged", "mha_split", "frame_60", "frame_60_steps"],
)
@settings(max_examples=3, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_kernel_rotates_keys_on_read(case, block_sizes, backend, seed):
    """`key_angles` = the reference over the pool rotated first (`rotate_keys`): the TPU
    kernel rotates each copied block in VMEM (one unpadded block a step, or several at a
    padded stride), the Triton kernel rotates the query, the reference the pool in XLA. Far
    from the unrotated pool: the rotation happened."""
    q, pk, pv, idx, cnt, lens = make_inputs(case, seed)
    # Every tile lists the full slot 0 first, so that a skipped rotation cannot hide behind
    # draws in which nothing is attended (all-zero outputs either way).
    idx, cnt = idx.at[..., 0].set(0), jnp.maximum(cnt, 1)
    angles = _key_angles(case, seed)
    f = kernel_fn(case, backend, block_sizes)
    out, lse = f(q, pk, pv, idx, cnt, slot_len=lens, key_angles=angles)
    ref = reference_fn(case.block_q)
    want, want_lse = ref(q, rotate_keys(pk, angles), pv, idx, cnt, slot_len=lens)
    np.testing.assert_allclose(out, want, atol=F32_TOL, rtol=F32_TOL)
    assert_lse_close(lse, want_lse, F32_TOL)
    spec, _ = ref(q, pk, pv, idx, cnt, slot_len=lens, key_angles=angles)
    np.testing.assert_allclose(spec, want, atol=F32_TOL, rtol=F32_TOL)
    plain, _ = ref(q, pk, pv, idx, cnt, slot_len=lens)
    assert float(jnp.abs(plain - want).max()) > 0.1


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_rotates_keys_shared_by_runs_of_slots(backend):
    """Angles shared by runs of slots (a frame's blocks share its time angle): the Triton
    kernel rotates the query once per run and reuses it, and a run that returns after another
    (slots 0-1 and 4-5 equal, apart) is rotated again. Same as rotating the pool first."""
    case = GQA_RAGGED  # 6 slots
    q, pk, pv, idx, cnt, lens = make_inputs(case, 14)
    rows = _key_angles(case, 14)
    angles = rows[:, :, jnp.asarray([0, 0, 2, 2, 0, 0])]  # runs {0, 1}, {2, 3}, {4, 5}
    out, lse = kernel_fn(case, backend)(q, pk, pv, idx, cnt, slot_len=lens, key_angles=angles)
    want, want_lse = reference_fn(case.block_q)(
        q, rotate_keys(pk, angles), pv, idx, cnt, slot_len=lens
    )
    np.testing.assert_allclose(out, want, atol=F32_TOL, rtol=F32_TOL)
    assert_lse_close(lse, want_lse, F32_TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "case,block_sizes",
    [(GQA_RAGGED, None), (FRAME_60, BlockSizes(block_kv=256))],
    ids=["gqa_ragged", "frame_60_steps"],
)
def test_kernel_rotates_keys_on_read_bf16(backend, case, block_sizes):
    """In bf16 the kernels round where the reference does not (the TPU kernel the rotated
    block, the Triton kernel the rotated query): still within the bf16 bound of the spec
    computed in float32 on the same values."""
    q, pk, pv, idx, cnt, lens = make_inputs(case, 13, jnp.bfloat16)
    angles = _key_angles(case, 13)
    out, lse = kernel_fn(case, backend, block_sizes)(
        q, pk, pv, idx, cnt, slot_len=lens, key_angles=angles
    )
    assert out.dtype == jnp.bfloat16
    f32 = [x.astype(jnp.float32) for x in (q, pk, pv)]
    want, want_lse = reference_fn(case.block_q)(*f32, idx, cnt, slot_len=lens, key_angles=angles)
    got, want = np.asarray(out, np.float32), np.asarray(want)
    scale = np.abs(want).max()
    # One more bf16 rounding of a rotated operand (relative 2**-9) on logits of a few units:
    # measured 2.8e-3 - 3.6e-3 of the output scale here, 2.5e-3 on a v5e (docs/sparse_forcing.md).
    bound = 5e-3 * scale + np.abs(want) * 2.0**-8
    assert (np.abs(got - want) <= bound).all(), np.abs(got - want).max() / scale
    plain, _ = reference_fn(case.block_q)(*f32, idx, cnt, slot_len=lens)
    assert (np.abs(got - np.asarray(plain)) > bound).any()  # the rotation is not negligible
    assert_lse_close(lse, want_lse, 1e-2)


@pytest.mark.parametrize("backend", ["tpu", "triton", "reference"])
def test_rotated_read_gradients_are_those_of_the_rotated_pool(backend):
    """The pool's gradient under RoPE on read is the rotated pool's, rotated back."""
    case = GQA_RAGGED
    q, pk, pv, idx, cnt, lens = make_inputs(case, 9)
    angles = _key_angles(case, 9)
    w = jnp.asarray(np.random.default_rng(10).normal(size=q.shape), jnp.float32)
    kernel = kernel_fn(case, backend)

    def loss(q, pk, pv):
        return (kernel(q, pk, pv, idx, cnt, slot_len=lens, key_angles=angles)[0] * w).sum()

    def spec(q, pk, pv):
        out = reference_fn(case.block_q)(q, rotate_keys(pk, angles), pv, idx, cnt, slot_len=lens)
        return (out[0] * w).sum()

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, pk, pv)
    want = jax.jit(jax.grad(spec, argnums=(0, 1, 2)))(q, pk, pv)
    for g, s in zip(got, want, strict=True):
        assert np.abs(np.asarray(s)).max() > 0
        np.testing.assert_allclose(g, s, atol=1e-5, rtol=1e-5)


def _segments(x, cuts):
    return tuple(jnp.split(x, cuts, axis=2))


@pytest.mark.parametrize("backend", [*BACKENDS, "reference"])
@pytest.mark.parametrize(
    "case,block_sizes,cuts",
    [
        (GQA_RAGGED, None, (4,)),  # tile-aligned blocks: each copied from its segment
        (MHA_EVEN, BlockSizes(block_q=8, block_kv=32), (1, 3)),  # 3 segments, 2 blocks a step
        (FRAME_60, BlockSizes(block_kv=256), (2,)),  # TPU: padded to a stride, joined first
    ],
    ids=["gqa_ragged", "mha_three", "frame_60_steps"],
)
def test_kernel_reads_pool_segments_as_one_pool(case, block_sizes, cuts, backend):
    """A pool given as segments is the concatenated pool (with RoPE on read too), forward and
    backward; the gradients come back cut into the same segments."""
    q, pk, pv, idx, cnt, lens = make_inputs(case, 11)
    angles = _key_angles(case, 11)
    f = kernel_fn(case, backend, block_sizes)
    seg_k, seg_v = _segments(pk, cuts), _segments(pv, cuts)
    for rot in (None, angles):
        out, lse = f(q, seg_k, seg_v, idx, cnt, slot_len=lens, key_angles=rot)
        want, want_lse = f(q, pk, pv, idx, cnt, slot_len=lens, key_angles=rot)
        np.testing.assert_allclose(out, want, atol=F32_TOL, rtol=F32_TOL)
        assert_lse_close(lse, want_lse, F32_TOL)
    w = jnp.asarray(np.random.default_rng(12).normal(size=q.shape), jnp.float32)
    loss = lambda pk, pv: (f(q, pk, pv, idx, cnt, slot_len=lens, key_angles=angles)[0] * w).sum()
    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(seg_k, seg_v)
    want = jax.jit(jax.grad(loss, argnums=(0, 1)))(pk, pv)
    for g, full in zip(got, want, strict=True):
        assert isinstance(g, tuple) and [x.shape for x in g] == [x.shape for x in seg_k]
        np.testing.assert_allclose(jnp.concatenate(g, axis=2), full, atol=1e-5, rtol=1e-5)


def test_auto_backend_on_cpu_is_reference():
    case = MHA_EVEN
    q, pk, pv, idx, cnt, lens = make_inputs(case, 7)
    out = pbsa(q, pk, pv, idx, cnt, slot_len=lens)  # CPU, not interpreted: XLA reference
    want = pbsa_reference(q, pk, pv, idx, cnt, slot_len=lens)
    np.testing.assert_array_equal(out, want)


# ----------------------------------------------------------------------------- bad input


def _valid(case=MHA_EVEN):
    return make_inputs(case, 8, garbage=False)


@pytest.mark.parametrize("fn", [pbsa_reference, pbsa], ids=["reference", "kernel"])
@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda a: {**a, "pool_v": a["pool_v"][:, :, :-1]}, "pool_k and pool_v"),
        (lambda a: {**a, "q": a["q"][..., :-1]}, "batch or head dim"),
        (lambda a: {**a, "q": a["q"][:, :1]}, "multiple of KV heads"),
        (lambda a: {**a, "block_idx": a["block_idx"][:1]}, "block_idx must be"),
        (lambda a: {**a, "block_cnt": a["block_cnt"][..., :1]}, "block_cnt must be"),
        (lambda a: {**a, "block_cnt": a["block_cnt"] + 10}, "block_cnt values"),
        (lambda a: {**a, "block_cnt": a["block_cnt"] - 10}, "block_cnt values"),
        (lambda a: {**a, "block_idx": a["block_idx"].astype(jnp.float32)}, "integer"),
        (lambda a: {**a, "block_idx": a["block_idx"].at[..., 0].set(99)}, "outside"),
        (lambda a: {**a, "block_q": 8}, "num_q_tiles"),
        (lambda a: {**a, "slot_len": a["slot_len"] + 100}, "slot_len values"),
        (lambda a: {**a, "slot_len": a["slot_len"][..., :2]}, "slot_len must be"),
        (lambda a: {**a, "key_angles": jnp.zeros((2, 2, 5, 7))}, "key_angles must be"),
        (lambda a: {**a, "key_angles": jnp.zeros((2, 2, 5, 8), jnp.int32)}, "float"),
    ],
)
def test_bad_inputs_raise(fn, mutate, match):
    q, pk, pv, idx, cnt, lens = _valid()
    cnt = jnp.maximum(cnt, 1)  # so that the out-of-range index is a valid entry
    args = dict(q=q, pool_k=pk, pool_v=pv, block_idx=idx, block_cnt=cnt, slot_len=lens)
    args = mutate({**args, "block_q": MHA_EVEN.block_q})
    with pytest.raises(ValueError, match=match):
        fn(**args)


def test_kernel_specific_bad_inputs_raise():
    q, pk, pv, idx, cnt, _ = _valid()
    with pytest.raises(ValueError, match="segments must agree"):
        pbsa(q, (pk[:, :, :2], pk[:, :, 2:, :8]), pv, idx, cnt)
    with pytest.raises(ValueError, match="same slots"):
        pbsa(q, (pk[:, :, :2], pk[:, :, 2:]), (pv[:, :, :3], pv[:, :, 3:]), idx, cnt)
    with pytest.raises(ValueError, match="backend"):
        pbsa(q, pk, pv, idx, cnt, backend="cuda-magic")
    with pytest.raises(ValueError, match="divide"):
        pbsa(q, pk, pv, idx, cnt, block_sizes=BlockSizes(block_q=5), interpret=True)
    with pytest.raises(ValueError, match="share a dtype"):
        pbsa(q.astype(jnp.bfloat16), pk, pv, idx, cnt, interpret=True)
    with pytest.raises(ValueError, match="head dim k a power of two"):
        odd = jnp.zeros((*pk.shape[:4], 24), pk.dtype)
        pbsa(jnp.zeros((*q.shape[:3], 24)), odd, odd, idx, cnt, backend="triton", interpret=True)
    with pytest.raises(ValueError, match="positive"):
        BlockSizes(block_kv=0)


# ----------------------------------------------------------------------------- pool


def test_update_pool_writes_slots_in_place():
    case = MHA_EVEN
    _, pk, pv, _, _, lens = make_inputs(case, 9)
    rng = np.random.default_rng(10)
    m = 2
    new_shape = (case.b, case.n_kv, m, case.block_size, case.k)
    new_k = jnp.asarray(rng.normal(size=new_shape), jnp.float32)
    new_v = jnp.asarray(rng.normal(size=new_shape), jnp.float32)
    slots = jnp.asarray([[3, 0], [1, 4]], jnp.int32)  # per batch element
    want_k, want_v, want_len = (np.array(x) for x in (pk, pv, lens))
    for bi in range(case.b):
        for j in range(m):
            want_k[bi, :, int(slots[bi, j])] = new_k[bi, :, j]
            want_v[bi, :, int(slots[bi, j])] = new_v[bi, :, j]
            want_len[bi, :, int(slots[bi, j])] = 5
    step = jax.jit(update_pool, donate_argnums=(0, 1))
    got_k, got_v, got_len = step(pk, pv, new_k, new_v, slots, slot_len=lens, new_len=5)
    assert pk.is_deleted() and pv.is_deleted()  # donated: the pool was reused in place
    np.testing.assert_array_equal(got_k, want_k)
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_array_equal(got_len, want_len)


def test_update_pool_shared_slots_then_attend():
    case = MHA_EVEN
    q, pk, pv, _, _, _ = make_inputs(case, 11)
    new = jnp.ones((case.b, case.n_kv, 1, case.block_size, case.k), jnp.float32)
    pk2, pv2 = update_pool(pk, pv, new, 3.0 * new, jnp.asarray([2], jnp.int32))
    np.testing.assert_array_equal(pv2[:, :, 2], 3.0)
    np.testing.assert_array_equal(pk2[:, :, 1], pk[:, :, 1])
    # Attending to the new slot alone returns its (constant) values exactly.
    shape = (case.b, case.n_kv, case.num_q_tiles, case.max_sel)
    out = pbsa_reference(q, pk2, pv2, jnp.full(shape, 2, jnp.int32), jnp.ones(shape[:3], jnp.int32))
    np.testing.assert_allclose(out, 3.0, rtol=1e-6)


@pytest.mark.parametrize(
    "slots, match",
    [([0, 0], "distinct"), ([0, 9], "num_slots"), ([[0, 1]], "b="), ([0.0, 1.0], "integer")],
)
def test_update_pool_bad_slots_raise(slots, match):
    case = MHA_EVEN
    _, pk, pv, _, _, _ = _valid()
    new = jnp.zeros((case.b, case.n_kv, 2, case.block_size, case.k), jnp.float32)
    with pytest.raises(ValueError, match=match):
        update_pool(pk, pv, new, new, jnp.asarray(slots))
    with pytest.raises(ValueError, match="do not fit"):
        update_pool(pk, pv, new[..., :-1], new[..., :-1], jnp.asarray([0, 1]))


def test_gather_blocks_and_block_means():
    case = MHA_EVEN
    _, pk, _, _, _, lens = make_inputs(case, 12)
    per_head = jnp.asarray([[[4, 0], [2, 2]], [[1, 3], [0, 4]]], jnp.int32)  # (b, n_kv, m)
    got = gather_blocks(pk, per_head)
    for bi, h, j in np.ndindex(per_head.shape):
        np.testing.assert_array_equal(got[bi, h, j], pk[bi, h, int(per_head[bi, h, j])])
    with pytest.raises(ValueError, match="num_slots"):
        gather_blocks(pk, jnp.asarray([0, case.num_slots]))

    means = block_means(pk, slot_len=lens)
    assert means.shape == pk.shape[:3] + pk.shape[-1:] and means.dtype == jnp.float32
    for bi, h, s in np.ndindex(lens.shape):
        n_valid = int(lens[bi, h, s])
        want = np.asarray(pk[bi, h, s, :n_valid]).mean(0) if n_valid else np.zeros(case.k)
        np.testing.assert_allclose(means[bi, h, s], want, atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(block_means(pk), pk.mean(-2), atol=1e-6, rtol=1e-6)


# ----------------------------------------------------------------------------- compile checks


# Sparse Forcing sizes (Wan 1.3B chunk of 4680 queries, 64-token blocks). The lists alone are
# 12 * 37 * 600 int32 = 1.07 MB, more than v5e's 1 MiB SMEM: they must not be prefetched whole.
SF_SHAPES = dict(b=1, n=12, n_kv=12, lq=4680, k=128, num_slots=700, block_size=64, max_sel=600)


def _abstract_args(dtype, sharding=None, block_q=128, **s):
    nq = -(-s["lq"] // block_q)

    def sd(shape, dt):
        return jax.ShapeDtypeStruct(shape, dt, sharding=sharding)

    pool = (s["b"], s["n_kv"], s["num_slots"], s["block_size"], s["k"])
    return (
        sd((s["b"], s["n"], s["lq"], s["k"]), dtype),
        sd(pool, dtype),
        sd(pool, dtype),
        sd((s["b"], s["n_kv"], nq, s["max_sel"]), jnp.int32),
        sd((s["b"], s["n_kv"], nq), jnp.int32),
        sd((s["b"], s["n_kv"], s["num_slots"]), jnp.int32),
    )


def _sparse_forcing_call(backend, block_q=128, block_sizes=None):
    def f(q, pk, pv, idx, cnt, lens, key_angles=None):
        return pbsa(
            q,
            pk,
            pv,
            idx,
            cnt,
            block_q=block_q,
            slot_len=lens,
            key_angles=key_angles,
            return_lse=True,
            backend=backend,
            block_sizes=block_sizes,
        )

    return f


@pytest.mark.tpu_aot
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu")
def test_tpu_kernel_compiles_for_v5e():
    """Mosaic lowers and compiles the kernel at Sparse Forcing scale (bf16, GQA) for a v5e.

    Necessary, not sufficient: this ahead-of-time compile accepted a DMA of 60 rows into a
    64-row VMEM window that the chip's own compile refused (2026-12-06, docs/tpu.md); only a
    run on the chip proves a Mosaic kernel."""
    # Other processes on a shared host may hold libtpu's lock; compile-only use is safe to share.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    topo = topologies.get_topology_desc("v5e:1x1", "tpu")
    mesh = Mesh(np.asarray(topo.devices).reshape(1), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec())
    wan = {**WAN_480P, "max_sel": 124}  # 60-token blocks (not a multiple of bf16's 16 rows)
    for shapes, block_q, tiles, rotate in (
        (SF_SHAPES, 128, None, False),  # MHA
        ({**SF_SHAPES, "n_kv": 4, "max_sel": 200}, 128, None, False),  # GQA
        (wan, 1560, BlockSizes(block_kv=60), True),  # one unpadded block of 60 a step, RoPE
        (wan, 1560, None, True),  # 16 blocks a step, each padded to a 64-row stride, RoPE
    ):
        args = _abstract_args(jnp.bfloat16, sharding, block_q=block_q, **shapes)
        if rotate:  # RoPE on read: per-slot angles, rotated in VMEM
            s = shapes
            angles = (s["b"], s["n_kv"], s["num_slots"], s["k"] // 2)
            args = (*args, jax.ShapeDtypeStruct(angles, jnp.float32, sharding=sharding))
        call = _sparse_forcing_call("tpu", block_q=block_q, block_sizes=tiles)
        compiled = jax.jit(call).lower(*args).compile()
        assert "pbsa_tpu" in compiled.as_text()
        out_shape = jax.eval_shape(call, *args)
        assert out_shape[0].shape == args[0].shape and out_shape[1].shape == args[0].shape[:3]


# Wan 2.1 1.3B at 480p: 1560 tokens per latent frame (30 x 52), a chunk of 3 frames, one query tile
# per frame, blocks of 60 tokens (26 per frame: 1560 has no power-of-two divisor >= 16). The pool
# is sink 3 + window 6 frames + 40 memory blocks + the chunk's own 3 frames.
WAN_480P = dict(b=1, n=12, n_kv=12, lq=3 * 1560, k=128, num_slots=12 * 26 + 40, block_size=60)


def _triton_calls(lowered):
    """(backend config, Triton IR text) of every Triton custom call in a lowered program."""
    calls = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    target = "call_target_name" in child.attributes and str(
                        child.attributes["call_target_name"]
                    )
                    if target == '"__gpu$xla.gpu.triton"':
                        calls.append(child.attributes["mhlo.backend_config"])
                    walk(child)

    walk(lowered.compiler_ir().operation)
    out = []
    for cfg in calls:
        ctx = ir.Context()
        triton_mlir.dialect.register_dialect(ctx)
        module = ir.Module.parse(cfg["ir"].value_bytes, context=ctx)
        params = {k: str(cfg[k]).split(" :")[0] for k in ("grid_x", "grid_y", "grid_z")}
        params |= {k: str(cfg[k]).split(" :")[0] for k in ("num_warps", "num_stages", "name")}
        out.append(({k: v.strip('"') for k, v in params.items()}, str(module)))
    return out


@pytest.mark.parametrize("n_kv", [12, 4], ids=["mha", "gqa"])
def test_triton_kernel_lowers_for_cuda_at_wan_480p(n_kv):
    """The Triton kernel lowers for CUDA (from this CPU-only host) at Wan 480p sizes with
    60-token blocks, and its Triton IR has the grid, tiles and loop the wrapper promises.

    Fails when the kernel cannot take a block that is not a power of two (lowering raises),
    when the grid or the per-program query split is wrong, when a key tile is not the 64-key
    window of a 60-token block, or when the loop over the selection loses its dynamic trip
    count (it would then read every listed slot, selected or not).
    """
    shapes = {**WAN_480P, "n_kv": n_kv, "max_sel": 124}
    args = _abstract_args(jnp.bfloat16, block_q=1560, **shapes)
    f = _sparse_forcing_call("triton", block_q=1560)
    ((params, ttir),) = _triton_calls(jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)))
    groups = 12 // n_kv
    # Rows per program: the largest split of the 1560-row tile whose `groups * rows` pads to at
    # most 128 rows: 120 rows (MHA, 13 programs per tile), 40 rows x 3 heads (GQA, 39).
    split = {1: 13, 3: 39}[groups]
    rows = pl.next_power_of_2(groups * 1560 // split)
    assert rows == 128
    assert params == {
        "grid_x": "1",
        "grid_y": str(n_kv),
        "grid_z": str(3 * split),
        "num_warps": "8",
        "num_stages": "2",
        "name": "pbsa_triton",
    }
    # One 64-key window per selected 60-token block: q k^T then p v.
    dots = re.findall(r"tt\.dot .*: (tensor<\S+>) \* (tensor<\S+>) -> (tensor<\S+>)", ttir)
    assert dots == [
        ("tensor<128x128xbf16>", "tensor<128x64xbf16>", "tensor<128x64xf32>"),
        ("tensor<128x64xbf16>", "tensor<64x128xbf16>", "tensor<128x128xf32>"),
    ], dots
    assert len(re.findall(r"tt\.load \S+ : tensor<64x128x!tt\.ptr<bf16>>", ttir)) == 2
    # The loop over the selection runs to a count loaded from memory (block_cnt).
    (bound,) = re.findall(r"scf\.for %\S+ = %\S+ to (%\S+) step", ttir)
    assert re.search(rf"{re.escape(bound)} = tt\.load %\S+ : !tt\.ptr<i32>", ttir), bound

    def loss(q, pk, pv, idx, cnt, lens):
        return f(q, pk, pv, idx, cnt, lens)[0].astype(jnp.float32).sum()

    # Under grad the forward is the same kernel; the backward is XLA (no second kernel).
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    ((grad_params, _),) = _triton_calls(grad.trace(*args).lower(lowering_platforms=("cuda",)))
    assert grad_params == params


def test_triton_kernel_reads_segments_and_rotates_in_place_for_cuda():
    """At Wan 480p sizes, a pool given as (cache, chunk) segments with RoPE on read lowers for
    CUDA to the one Triton kernel with nothing done to the pool around it: the segments reach
    the call through reshapes only (no concatenation, no rotated copy). Inside, one loop per
    segment (its run of the ascending list) reads one unmasked 64-key window of keys and of
    values a block, and the query is rotated under a branch (only when a block's angles
    differ from the previous block's) from two 1 x 128 float32 cos/sin rows.

    Fails if the wrapper joins, pads or rotates the pool in XLA again, or if the kernel reads
    the segments through masked loads or rotates without the branch."""
    shapes = {**WAN_480P, "max_sel": 124}
    q, pk, _, idx, cnt, lens = _abstract_args(jnp.bfloat16, block_q=1560, **shapes)
    b, n_kv, slots, bs, k = pk.shape
    chunk = 3 * 26  # the chunk's own blocks: the second segment
    cache = jax.ShapeDtypeStruct((b, n_kv, slots - chunk, bs, k), jnp.bfloat16)
    own = jax.ShapeDtypeStruct((b, n_kv, chunk, bs, k), jnp.bfloat16)
    angles = jax.ShapeDtypeStruct((b, n_kv, slots, k // 2), jnp.float32)
    f = _sparse_forcing_call("triton", block_q=1560)
    call = lambda q, ck, ok, cv, ov, idx, cnt, lens, a: f(
        q, (ck, ok), (cv, ov), idx, cnt, lens, key_angles=a
    )
    lowered = (
        jax.jit(call)
        .trace(q, cache, own, cache, own, idx, cnt, lens, angles)
        .lower(lowering_platforms=("cuda",))
    )
    ((_, ttir),) = _triton_calls(lowered)
    pool_types = [f"{b}x{n_kv}x{m}x{bs}x{k}x" for m in (slots, slots - chunk, chunk)]
    pool_types.append(f"{b}x{n_kv}x{(slots - chunk) * bs}x{k}x")  # the flattened cache
    for line in lowered.as_text().splitlines():
        if any(t in line for t in pool_types):
            line = line.strip()
            ok = line.startswith("func.func public @main") or "xla.gpu.triton" in line
            assert ok or re.match(r"%\S+ = stablehlo\.reshape %arg\d+ :", line), line
    assert ttir.count("scf.for") == 2 and ttir.count("scf.if") == 2  # a loop a segment
    window = r"tensor<64x128x!tt\.ptr<bf16>>"
    assert len(re.findall(rf"tt\.load %\S+ : {window}", ttir)) == 4  # (cache, chunk) x (k, v)
    assert not re.findall(rf"tt\.load %[^:]*, [^:]* : {window}", ttir)  # no masked window load
    assert len(re.findall(r"tt\.load \S+ : tensor<1x128x!tt\.ptr<f32>>", ttir)) == 4
    dots = re.findall(r"tt\.dot .*: (tensor<\S+>) \* (tensor<\S+>) -> (tensor<\S+>)", ttir)
    assert dots[0] == ("tensor<128x128xbf16>", "tensor<128x64xbf16>", "tensor<128x64xf32>")


def test_slot_lengths_past_the_block_are_the_block():
    """Under jit (where `check_inputs` cannot see the values), a slot length above
    `block_size` reads the block, never the TPU kernel's padding."""
    q, pk, pv, idx, cnt, lens = make_inputs(FRAME_60, 7)
    tiles = BlockSizes(block_kv=256)  # blocks padded to a 64-row stride
    run = jax.jit(lambda lens: pbsa(
        q, pk, pv, idx, cnt, block_q=FRAME_60.block_q, slot_len=lens, block_sizes=tiles,
        interpret=True,
    ))  # fmt: skip
    full = jnp.full_like(lens, FRAME_60.block_size)
    np.testing.assert_allclose(run(full + 3), run(full), atol=1e-6)


def test_tpu_programs_per_selection_tile_keep_rows_bounded(monkeypatch):
    """`block_q=None` on TPU: the largest divisor of the selection tile within TPU_MAX_ROWS
    rows (a Wan 480p frame: one program of 1560 rows), and the split tiles still compute the
    same attention."""
    from vidax.kernels.pbsa import kernel as kernel_module
    from vidax.kernels.pbsa.index import PbsaDims

    def split(block_q, groups=1, backend="tpu"):
        dims = PbsaDims(
            b=1, n=groups, n_kv=1, lq=3 * block_q, k=128, num_slots=8, block_size=60,
            block_q=block_q, num_q_tiles=3, max_sel=4,
        )  # fmt: skip
        static = kernel_module._Static(
            dims=dims, scale=1.0, block_sizes=BlockSizes(), backend=backend, interpret=True
        )
        return static.q_split

    assert kernel_module.TPU_MAX_ROWS == 1600
    assert split(1560) == 1 and split(120) == 1 and split(1560, groups=2) == 2
    assert split(3120) == 2  # two frames a tile: two programs of one frame each
    assert split(1560, backend="triton") == 13  # 120 rows: Triton's register bound
    # A 16-row tile in programs of at most 8 rows: 4 programs of 4 rows a head (GQA groups of 2).
    monkeypatch.setattr(kernel_module, "TPU_MAX_ROWS", 8)
    q, pk, pv, idx, cnt, lens = make_inputs(GQA_RAGGED, 3)
    run = jax.jit(functools.partial(pbsa, block_q=16, slot_len=lens, interpret=True))
    want = pbsa_reference(q, pk, pv, idx, cnt, block_q=16, slot_len=lens)
    np.testing.assert_allclose(run(q, pk, pv, idx, cnt), want, atol=F32_TOL, rtol=F32_TOL)
