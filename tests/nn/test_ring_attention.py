"""Chunked, ring and splash attention against the reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from vidax.nn.attention import attention, attention_chunked, attention_reference
from vidax.nn.ring_attention import ring_attention, splash_block
from vidax.planner import load_topology
from vidax.planner.hlo import analyze_hlo
from vidax.sharding.rules import compose_strategy, use_mesh


def _qkv(b=2, length=37, s=None, n=4, k=16, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    s = length if s is None else s
    q = jnp.asarray(rng.standard_normal((b, length, n, k)), dtype)
    kv = [jnp.asarray(rng.standard_normal((b, s, n, k)), dtype) for _ in range(2)]
    return q, *kv


@pytest.mark.parametrize("block", [8, 37, 1024])
def test_chunked_equals_reference(block):
    q, k, v = _qkv()
    mask = jnp.asarray(np.random.default_rng(1).random((2, 4, 37, 37)) > 0.3)
    for m in (None, mask):
        want = attention_reference(q, k, v, mask=m, scale=0.25)
        got = attention_chunked(q, k, v, mask=m, scale=0.25, block=block)
        np.testing.assert_allclose(got, want, atol=2e-6)


@pytest.mark.parametrize(
    ("shape", "axes", "tensor", "length"),
    [
        ((2, 4), ("data", "seq"), False, 37),  # padded to 40
        ((8,), ("seq",), False, 37),  # padded to 40: the last shard holds 2 real tokens
        ((1, 4, 2), ("data", "seq", "tensor"), True, 32),
    ],
)
def test_ring_attention_equals_reference(shape, axes, tensor, length):
    q, k, v = _qkv(length=length)
    want = attention_reference(q, k, v, scale=0.25)
    mesh = jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(axes))
    with use_mesh(mesh, compose_strategy("ring", tensor=tensor)):
        run = jax.jit(lambda q, k, v: attention(q, k, v, scale=0.25))  # auto -> ring
        compiled = run.lower(q, k, v).compile()
        got = compiled(q, k, v)
    np.testing.assert_allclose(got, want, atol=2e-6)
    ring = dict(zip(axes, shape, strict=True))["seq"]
    # k and v travel ring - 1 steps.
    assert compiled.as_text().count("collective-permute-start") in (0, 2 * (ring - 1))
    assert compiled.as_text().count("collective-permute") >= 2 * (ring - 1)


def test_auto_uses_ring_only_for_self_attention_under_a_ring_strategy():
    mesh = jax.make_mesh((8,), ("seq",), axis_types=(AxisType.Auto,))
    q, k, v = _qkv(length=32, s=8)  # cross-attention: 8 text tokens
    with use_mesh(mesh, compose_strategy("ring")):
        text = jax.jit(lambda q, k, v: attention(q, k, v)).lower(q, k, v).as_text()
    assert "collective_permute" not in text
    q, k, v = _qkv(length=32)
    with use_mesh(mesh, compose_strategy("gather")):
        text = jax.jit(lambda q, k, v: attention(q, k, v)).lower(q, k, v).as_text()
    assert "collective_permute" not in text


def test_ring_bad_input():
    q, k, v = _qkv(length=32)
    with pytest.raises(ValueError, match="needs an active mesh"):
        ring_attention(q, k, v, scale=0.25)
    mesh = jax.make_mesh((8,), ("seq",), axis_types=(AxisType.Auto,))
    with use_mesh(mesh, compose_strategy("ring")):
        with pytest.raises(ValueError, match="self-attention"):
            ring_attention(q, k[:, :8], v[:, :8], scale=0.25)
        with pytest.raises(ValueError, match="does not take a mask"):
            attention(q, k, v, mask=jnp.ones((2, 4, 32, 32), bool), impl="ring")


def test_splash_block_equals_reference_in_interpret_mode():
    """The per-device splash path (padding to 128 lanes, masked tail keys, log-sum-exp)."""
    q, k, v = _qkv(b=1, length=200, n=2, k=64, dtype=jnp.bfloat16)
    out, lse = splash_block(q, k, v, 150, scale=0.125, interpret=True)
    want = attention_reference(q, k[:, :150], v[:, :150], scale=0.125)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want, np.float32), atol=2e-2)
    q32, k32 = q.astype(jnp.float32), k[:, :150].astype(jnp.float32)
    logits = jnp.einsum("blnk,bsnk->bnls", q32, k32) * 0.125
    np.testing.assert_allclose(lse, jax.nn.logsumexp(logits, axis=-1), atol=2e-2)


@pytest.mark.tpu_aot
def test_splash_without_a_mesh_compiles_for_one_tpu():
    """One chip, no mesh: "splash" runs the kernel over all of q, k, v (the padded tail keys
    masked), as "auto" picks for long sequences on a TPU."""
    pytest.importorskip("libtpu")
    from jax.sharding import SingleDeviceSharding

    topo = load_topology("v5e:1x1")
    one = SingleDeviceSharding(topo.devices[0])
    q = jax.ShapeDtypeStruct((1, 1002, 2, 128), jnp.bfloat16, sharding=one)
    kv = jax.ShapeDtypeStruct((1, 3000, 2, 128), jnp.bfloat16, sharding=one)
    f = jax.jit(lambda q, k, v: attention(q, k, v, impl="splash"))
    compiled = f.lower(q, kv, kv).compile()
    assert "splash_mha_fwd" in compiled.as_text()
    assert jax.eval_shape(f, q, kv, kv).shape == q.shape


@pytest.mark.tpu_aot
@pytest.mark.parametrize("tokens", [1024, 1002])
def test_splash_compiles_for_tpu_and_splits_queries(tokens):
    """Each device runs the kernel on its own query shard (padded when tokens do not divide),
    against all keys; the HLO walk prices it."""
    pytest.importorskip("libtpu")
    from jax.sharding import Mesh

    topo = load_topology("v5e:2x2")
    mesh = Mesh(np.array(topo.devices).reshape(1, 4, 1), ("data", "seq", "tensor"))
    sds = jax.ShapeDtypeStruct((2, tokens, 4, 128), jnp.bfloat16)
    with use_mesh(mesh, compose_strategy("gather")):  # auto -> splash on a TPU mesh
        compiled = jax.jit(lambda q, k, v: attention(q, k, v)).lower(sds, sds, sds).compile()
    text = compiled.as_text()
    assert "splash_mha_fwd" in text
    # Per device: 2 x 4 heads, 256 query rows (1002 / 4 -> 251, lane-padded), 1024 keys.
    assert analyze_hlo(text).flops == pytest.approx(4 * 2 * 4 * 256 * 1024 * 128, rel=0.01)
