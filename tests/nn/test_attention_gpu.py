"""cuDNN flash attention on a GPU against the float32 reference (skipped elsewhere).

Run on a CUDA machine with the GPU visible to jax (the conftest defaults to CPU):

    JAX_PLATFORMS=cuda python -m pytest tests/nn/test_attention_gpu.py -q

Tolerances are bf16's: inputs are rounded to bf16 once, then both sides compute from the same
bf16 values; the reference upcasts them to float32 and never rounds again.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax.models.wan import PRESETS, WanTransformer
from vidax.nn.attention import attention, attention_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]

BF16, F32 = jnp.bfloat16, jnp.float32
CUDNN_CALL = "__cudnn$fmha"


def _qkv(b, length, keys, n, k, dtype=BF16, seed=0):
    """Standard-normal q (b, l, n, k) and k, v (b, s, n, k), drawn on the device."""
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(kq, (b, length, n, k), F32).astype(dtype)
    return q, *(jax.random.normal(key, (b, keys, n, k), F32).astype(dtype) for key in (kk, kv))


def _f32(*xs):
    return [x.astype(F32) for x in xs]


@pytest.mark.parametrize(
    "length, keys",
    [
        (128, 128),
        (1000, 1000),
        (4097, 4097),  # not a multiple of 128 (nor of cuDNN's tiles)
        (1000, 512),  # cross-attention to Wan's 512 text tokens
        (4097, 77),  # cross-attention to a short, odd text
    ],
)
@pytest.mark.parametrize("dtype", [BF16, jnp.float16])
def test_auto_runs_cudnn_within_bf16_tolerance(length, keys, dtype):
    q, k, v = _qkv(2, length, keys, 12, 128, dtype)
    run = jax.jit(lambda q, k, v: attention(q, k, v))
    assert CUDNN_CALL in run.lower(q, k, v).compile().as_text()
    out = run(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype
    want = attention_reference(*_f32(q, k, v), scale=128**-0.5)
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=1e-2, rtol=1e-2)


def test_wan_sized_self_attention_never_holds_the_logits():
    """Wan 2.1 1.3B at 480p with CFG: (2, 32760, 12, 128); checked on 512 query rows."""
    q, k, v = _qkv(2, 32_760, 32_760, 12, 128)
    run = jax.jit(lambda q, k, v: attention(q, k, v))
    compiled = run.lower(q, k, v).compile()
    assert CUDNN_CALL in compiled.as_text()
    logits_bytes = 2 * 12 * 32_760 * 32_760 * 2
    assert compiled.memory_analysis().temp_size_in_bytes < logits_bytes // 100
    rows = slice(10_000, 10_512)
    out = np.asarray(run(q, k, v)[:, rows], np.float32)
    want = attention_reference(*_f32(q[:, rows], k, v), scale=128**-0.5)
    np.testing.assert_allclose(out, want, atol=1e-2, rtol=1e-2)


def test_cudnn_gradients_match_the_reference():
    """Training differentiates through the same kernel (cuDNN's backward)."""
    q, k, v = _qkv(2, 300, 300, 4, 64, seed=1)
    w = jnp.asarray(np.random.default_rng(2).standard_normal(q.shape), F32)

    def loss(impl, q, k, v):
        if impl == "reference":
            return (attention_reference(q, k, v, scale=0.125) * w).sum()
        return (attention(q, k, v, impl=impl).astype(F32) * w).sum()

    got = jax.jit(jax.grad(lambda *a: loss("cudnn", *a), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(lambda *a: loss("reference", *a), argnums=(0, 1, 2))(*_f32(q, k, v))
    for g, r in zip(got, want, strict=True):
        g, r = np.asarray(g, np.float32), np.asarray(r)
        assert np.abs(g - r).max() <= 2e-2 * np.abs(r).max()


def test_float32_falls_back_without_cudnn():
    q, k, v = _qkv(1, 256, 256, 2, 64, F32)
    run = jax.jit(lambda q, k, v: attention(q, k, v))
    assert CUDNN_CALL not in run.lower(q, k, v).compile().as_text()
    # XLA may run float32 matmuls as TF32 on tensor cores.
    np.testing.assert_allclose(
        run(q, k, v), attention_reference(q, k, v, scale=0.125), atol=2e-3, rtol=2e-3
    )


def test_bf16_wan_forward_uses_cudnn_and_tracks_float32():
    """The tiny Wan DiT in bf16 (head dim 32) runs both attentions on cuDNN; the tolerance is
    the CPU test's (tests/models/test_bf16.py)."""
    cfg = dataclasses.replace(PRESETS["tiny"], num_layers=2)
    m32 = WanTransformer(cfg, rngs=nnx.Rngs(0))
    cfg16 = dataclasses.replace(cfg, dtype="bfloat16", param_dtype="bfloat16")
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: WanTransformer(cfg16, rngs=nnx.Rngs(0))))
    state16 = jax.tree.map(lambda a: a.astype(BF16), nnx.state(m32))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 3, 8, 8, cfg.in_channels)), F32)
    ctx = jnp.asarray(rng.standard_normal((2, cfg.text_len, cfg.text_dim)), F32)
    t = jnp.array([100.0, 900.0])
    run16 = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a))
    assert run16.lower(state16, x, t, ctx).compile().as_text().count(CUDNN_CALL) >= 2
    y16 = run16(state16, x, t, ctx)
    y32 = jax.jit(lambda *a: m32(*a))(x, t, ctx)
    assert float(jnp.abs(y16 - y32).max() / jnp.abs(y32).max()) < 2e-2
