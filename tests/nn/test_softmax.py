"""The shared online softmax: one pass, block by block and merged partials against jax.nn."""

import jax
import jax.numpy as jnp
import numpy as np

from vidax.nn.attention import attention_reference
from vidax.nn.softmax import (
    attend_blocks,
    merge_partials,
    normalize,
    online_softmax_step,
    softmax_stats,
)


def _masked(rows=6, keys=10, seed=0):
    """Logits (rows, keys) masked at random, row 0 fully masked, and values (keys, 3)."""
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(3 * rng.standard_normal((rows, keys)), jnp.float32)
    keep = jnp.asarray(rng.random((rows, keys)) > 0.4).at[0].set(False).at[1, 0].set(True)
    v = jnp.asarray(rng.standard_normal((keys, 3)), jnp.float32)
    return jnp.where(keep, logits, -jnp.inf), keep, v


def _want(logits, keep, v):
    """jax.nn on the rows that have a key."""
    probs = jax.nn.softmax(logits, axis=-1, where=keep)
    return jnp.where(keep, probs, 0.0) @ v, jax.nn.logsumexp(logits, axis=-1)


def test_one_pass_is_the_softmax_and_an_empty_row_is_zero():
    logits, keep, v = _masked()
    p, shift, total = softmax_stats(logits)
    out, lse = normalize(p @ v, shift, total)
    want_out, want_lse = _want(logits, keep, v)
    np.testing.assert_allclose(out[1:], want_out[1:], atol=1e-6)
    np.testing.assert_allclose(lse[1:], want_lse[1:], atol=1e-5)
    # The masked row: output 0 and lse -inf, not NaN; and gradients stay finite.
    np.testing.assert_array_equal(out[0], 0.0)
    assert bool(jnp.isneginf(lse[0]))

    def loss(x):
        p, shift, total = softmax_stats(jnp.where(keep, x, -jnp.inf))
        return normalize(p @ v, shift, total)[0].sum()

    assert bool(jnp.all(jnp.isfinite(jax.grad(loss)(jnp.where(keep, logits, 0.0)))))


def test_a_row_over_several_axes_is_one_softmax():
    logits, keep, v = _masked(keys=12)
    p, shift, total = softmax_stats(logits.reshape(6, 3, 4), axis=(-2, -1))
    out, lse = normalize(p.reshape(6, 12) @ v, shift, total)
    want_out, want_lse = _want(logits, keep, v)
    np.testing.assert_allclose(out[1:], want_out[1:], atol=1e-6)
    np.testing.assert_allclose(lse[1:], want_lse[1:], atol=1e-5)


def test_online_steps_equal_one_pass():
    logits, _, v = _masked(keys=12)
    m = jnp.full((6,), -jnp.inf)
    total = jnp.zeros((6,))
    acc = jnp.zeros((6, 3))
    # The first block leaves some rows without any key yet (m = -inf), the case the
    # correction must not turn into NaN.
    for cut in (slice(0, 2), slice(2, 7), slice(7, 12)):
        p, correction, m, total = online_softmax_step(m, total, logits[:, cut])
        acc = acc * correction[:, None] + p @ v[cut]
    out, lse = normalize(acc, m, total)
    p, shift, total1 = softmax_stats(logits)
    want_out, want_lse = normalize(p @ v, shift, total1)
    np.testing.assert_allclose(out, want_out, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse, atol=1e-5)


def _qkv(b=2, length=37, s=40, n=4, k=16, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, length, n, k)), jnp.float32)
    kv = [jnp.asarray(rng.standard_normal((b, s, n, k)), jnp.float32) for _ in range(2)]
    return q, *kv


def test_partials_over_disjoint_keys_merge_exactly():
    q, k, v = _qkv()
    want = attention_reference(q, k, v, scale=0.25)
    left = attend_blocks(q, k[:, :24], v[:, :24], scale=0.25, block=8)
    # The right half is padded to 24 keys, of which 16 count.
    pad = ((0, 0), (0, 8), (0, 0), (0, 0))
    right = attend_blocks(q, jnp.pad(k[:, 24:], pad), jnp.pad(v[:, 24:], pad), scale=0.25, valid=16)
    out, lse = merge_partials(left, right)
    np.testing.assert_allclose(out, want, atol=2e-6)
    logits = jnp.einsum("blnk,bsnk->bnls", q, k) * 0.25
    np.testing.assert_allclose(lse, jax.nn.logsumexp(logits, axis=-1), atol=1e-5)
    # A partial over no valid key contributes nothing.
    empty = attend_blocks(q, k[:, :8], v[:, :8], scale=0.25, valid=0)
    assert bool(jnp.all(jnp.isneginf(empty[1])))
    np.testing.assert_allclose(merge_partials(left, empty)[0], left[0], atol=1e-7)
