"""Shared layers and functions against independent formulations."""

import jax.numpy as jnp
import numpy as np
import pytest

from vidax.nn import apply_rope, attention, rope, rope_angles, timestep_embedding, video_positions
from vidax.nn.layers import layer_norm
from vidax.nn.rope import rotate_pairs


@pytest.mark.parametrize("lane_dense", [False, True])
def test_rope_is_a_complex_rotation_and_preserves_norms(lane_dense, monkeypatch):
    """Both layouts of `rotate_pairs`, fed per-pair or per-lane angles."""
    monkeypatch.setattr(rope, "lane_dense_rope", lambda: lane_dense)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 6, 2, 8)).astype(np.float32)
    angles = rng.uniform(-3, 3, (6, 4)).astype(np.float32)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * angles)[None, :, None, :]
    want = np.stack([z.real, z.imag], -1).reshape(x.shape)
    for a in (angles, np.repeat(angles, 2, axis=-1)):
        got = np.asarray(apply_rope(jnp.asarray(x), jnp.asarray(a)))
        np.testing.assert_allclose(got, want, atol=1e-5)
        np.testing.assert_allclose(
            np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5
        )
    with pytest.raises(ValueError, match="head dim 8"):
        apply_rope(jnp.asarray(x), jnp.zeros((6, 3)))


def test_rope_layouts_agree_in_low_precision():
    """The lane-dense layout (a TPU's) rounds like the pair layout: the same products and
    sums, cast back to bf16."""
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((2, 3, 5, 4, 16)), jnp.bfloat16)
    positions = jnp.asarray(rng.uniform(0, 40, (2, 3, 5, 4, 3)), jnp.float32)
    pairs = rope_angles(positions, (4, 6, 6))
    lanes = rope_angles(positions, (4, 6, 6), per_lane=True)
    np.testing.assert_array_equal(np.repeat(np.asarray(pairs), 2, -1), np.asarray(lanes))
    want = rotate_pairs(x, pairs, lane_dense=False).astype(jnp.float32)
    for a, lane_dense in ((lanes, True), (pairs, True), (lanes, False)):
        got = rotate_pairs(x, a, lane_dense=lane_dense)
        assert got.dtype == jnp.bfloat16
        # At most one bf16 rounding step apart (float32 sums may round differently).
        np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2**-7, atol=1e-6)


def test_rope_relative_property():
    """<R(p)q, R(p')k> depends only on p - p'."""
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((1, 1, 1, 12)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 1, 1, 12)), jnp.float32)
    dims = (4, 4, 4)

    def score(pq, pk):
        aq = rope_angles(jnp.asarray([pq], jnp.float32), dims)
        ak = rope_angles(jnp.asarray([pk], jnp.float32), dims)
        return float(jnp.sum(apply_rope(q, aq) * apply_rope(k, ak)))

    assert score((3, 1, 2), (1, 0, 0)) == pytest.approx(score((7, 4, 9), (5, 3, 7)), rel=1e-4)


def test_video_positions_offset_and_scale():
    pos = video_positions(2, 3, 4, offset=(10.0, 0.0, 0.0), scale=(1.0, 2.0, 0.5))
    assert pos.shape == (24, 3)
    np.testing.assert_allclose(pos[0], [10, 0, 0])
    np.testing.assert_allclose(pos[-1], [11, 4, 1.5])


def test_rope_rejects_odd_axes():
    with pytest.raises(ValueError, match="even"):
        rope_angles(jnp.zeros((2, 2)), (3, 4))
    with pytest.raises(ValueError, match="rope axes"):
        rope_angles(jnp.zeros((2, 3)), (4, 4))


@pytest.mark.parametrize("masked", [False, True])
def test_attention_implementations_agree(masked):
    rng = np.random.default_rng(2)
    q, k, v = (
        jnp.asarray(rng.standard_normal(s), jnp.float32)
        for s in [(2, 5, 3, 8), (2, 7, 3, 8), (2, 7, 3, 8)]
    )
    mask = None
    if masked:
        mask = jnp.asarray(rng.uniform(size=(2, 1, 5, 7)) > 0.3).at[..., 0].set(True)
    ref = attention(q, k, v, mask=mask, impl="reference")
    np.testing.assert_allclose(attention(q, k, v, mask=mask, impl="xla"), ref, atol=1e-5)
    # softmax(q k^T / sqrt(d)) v by hand
    logits = np.einsum("blnk,bsnk->bnls", q, k) / np.sqrt(8)
    if mask is not None:
        logits = np.where(np.asarray(mask), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(ref, np.einsum("bnls,bsnk->blnk", p, v), atol=1e-5)


def test_attention_rejects_bad_input():
    x = jnp.zeros((1, 2, 1, 4))
    with pytest.raises(ValueError, match="unknown attention impl"):
        attention(x, x, x, impl="flash3")
    with pytest.raises(ValueError, match="do not match"):
        attention(x, jnp.zeros((1, 2, 1, 6)), jnp.zeros((1, 2, 1, 6)))


def test_layer_norm_matches_numpy():
    x = np.random.default_rng(3).standard_normal((4, 9)).astype(np.float32)
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(layer_norm(jnp.asarray(x), 1e-6), want, atol=1e-5)


def test_timestep_embedding_shape_and_order():
    emb = timestep_embedding(jnp.asarray([0.0, 10.0]), 8)
    assert emb.shape == (2, 8)
    np.testing.assert_allclose(emb[0], [1, 1, 1, 1, 0, 0, 0, 0], atol=1e-7)  # cos first
    assert timestep_embedding(jnp.zeros((3, 4)), 6).shape == (3, 4, 6)
