"""Shared layers and functions against independent formulations."""

import jax.numpy as jnp
import numpy as np
import pytest

from vidax.nn import apply_rope, attention, rope_angles, timestep_embedding, video_positions
from vidax.nn.layers import layer_norm
from vidax.nn.rope import rotate_pairs


def test_rope_is_a_complex_rotation_and_preserves_norms():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 6, 2, 8)).astype(np.float32)
    angles = rng.uniform(-3, 3, (6, 4)).astype(np.float32)
    got = np.asarray(apply_rope(jnp.asarray(x), jnp.asarray(angles)))
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * angles)[None, :, None, :]
    want = np.stack([z.real, z.imag], -1).reshape(x.shape)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


def test_rotate_pairs_rotates_arrays_in_their_own_shape():
    """Per-head blocks (b, n, m, bs, k) with per-token angles, as the forcing cache rotates
    them, equal `apply_rope` on the same tokens laid out (b * n, tokens, 1, k)."""
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((2, 3, 4, 5, 8)), jnp.bfloat16)
    angles = jnp.asarray(rng.uniform(-3, 3, (2, 3, 4, 5, 4)), jnp.float32)
    got = rotate_pairs(x, angles)
    assert got.dtype == jnp.bfloat16
    want = apply_rope(x.reshape(6, 20, 1, 8), angles.reshape(6, 20, 4)).reshape(x.shape)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    assert not np.array_equal(np.asarray(got, np.float32), np.asarray(x, np.float32))


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
