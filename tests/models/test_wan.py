"""Wan DiT behaviour beyond reference parity: shapes, errors, stages, scan, dtypes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax.models.wan import PRESETS, WanConfig, WanTransformer
from vidax.nn import video_positions

CONFIG = dataclasses.replace(PRESETS["tiny"], num_layers=2, dim=64, ffn_dim=96, text_len=5)


@pytest.fixture(scope="module")
def model():
    return WanTransformer(CONFIG, rngs=nnx.Rngs(0))


def _inputs(b=2, t=3, h=4, w=6):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((b, t, h, w, CONFIG.in_channels)), jnp.float32)
    ctx = jnp.asarray(rng.standard_normal((b, CONFIG.text_len, CONFIG.text_dim)), jnp.float32)
    return x, jnp.linspace(100.0, 900.0, b), ctx


def test_output_shape_and_dtype(model):
    x, t, ctx = _inputs()
    y = model(x, t, ctx)
    assert y.shape == (*x.shape[:4], CONFIG.out_channels) and y.dtype == jnp.float32
    assert np.isfinite(np.asarray(y)).all()


def test_stages_compose_to_the_forward(model):
    x, t, ctx = _inputs()
    tokens, grid = model.embed(x)
    assert grid == (3, 2, 3) and tokens.shape == (2, 18, CONFIG.dim)
    cond = model.condition(t, ctx)
    out = model.unembed(model.run_blocks(tokens, cond, model.rope(grid)), cond, grid)
    np.testing.assert_allclose(out, model(x, t, ctx), atol=1e-6)


def test_explicit_positions_equal_the_default_grid_and_matter(model):
    x, t, ctx = _inputs()
    base = model(x, t, ctx)
    np.testing.assert_allclose(
        model(x, t, ctx, positions=video_positions(3, 2, 3)), base, atol=1e-6
    )
    scaled = model(x, t, ctx, positions=video_positions(3, 2, 3, scale=(2.0, 2.0, 2.0)))
    assert np.abs(np.asarray(scaled - base)).max() > 1e-3


def test_per_token_timesteps_broadcast_like_per_sample(model):
    x, t, ctx = _inputs()
    per_token = jnp.repeat(t[:, None], 18, axis=1)
    np.testing.assert_allclose(model(x, per_token, ctx), model(x, t, ctx), atol=1e-5)


def test_custom_self_attention_hook(model):
    """A hook that attends over nothing but each token itself changes the output."""
    x, t, ctx = _inputs()
    tokens, grid = model.embed(x)
    cond = model.condition(t, ctx)
    calls = []

    def attend(q, k, v):
        calls.append(q.shape)
        return v

    out = model.run_blocks(tokens, cond, model.rope(grid), self_attention=attend)
    assert calls == [(2, 18, CONFIG.num_heads, CONFIG.head_dim)]  # traced once inside the scan
    assert not np.allclose(out, model.run_blocks(tokens, cond, model.rope(grid)))


C = CONFIG.in_channels


@pytest.mark.parametrize(
    "shape, ctx_shape, message",
    [
        ((1, 3, 4, 6, C + 3), (1, 5, CONFIG.text_dim), f"expected {C} latent channels"),
        ((1, 3, 5, 6, C), (1, 5, CONFIG.text_dim), "not divisible by patch size"),
        ((1, 3, 4, 6, C), (1, 5, CONFIG.text_dim + 1), "context must be"),
    ],
)
def test_bad_inputs(model, shape, ctx_shape, message):
    with pytest.raises(ValueError, match=message):
        model(jnp.zeros(shape), jnp.zeros((shape[0],)), jnp.zeros(ctx_shape))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"dim": 130}, "not divisible by num_heads"),
        ({"num_layers": 0}, "must be positive"),
        ({"dtype": "float64"}, "dtype must be one of"),
        ({"patch_size": (1, 2)}, "patch_size"),
        ({"dim": 36, "num_heads": 4}, "RoPE"),
    ],
)
def test_config_validation(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(CONFIG, **changes)


def test_scan_keeps_the_program_size_independent_of_depth():
    x, t, ctx = _inputs(b=1)

    def size(layers):
        cfg = dataclasses.replace(CONFIG, num_layers=layers)
        model = nnx.eval_shape(lambda: WanTransformer(cfg, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(model)
        jaxpr = jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(x, t, ctx))(state)
        return len(jaxpr.jaxpr.eqns)

    assert size(2) == size(8)


def test_bfloat16_compute_stays_close_to_float32():
    cfg32 = CONFIG
    cfg16 = dataclasses.replace(CONFIG, dtype="bfloat16")
    m32 = WanTransformer(cfg32, rngs=nnx.Rngs(0))
    m16 = WanTransformer(cfg16, rngs=nnx.Rngs(0))
    x, t, ctx = _inputs()
    y32, y16 = m32(x, t, ctx), m16(x, t, ctx)
    assert y16.dtype == jnp.float32
    rel = float(jnp.abs(y16 - y32).max() / jnp.abs(y32).max())
    assert 0 < rel < 0.05


def test_presets_have_the_published_sizes():
    assert (PRESETS["wan2.1-1.3b"].dim, PRESETS["wan2.1-1.3b"].num_layers) == (1536, 30)
    assert (PRESETS["wan2.1-14b"].num_heads, PRESETS["wan2.1-14b"].ffn_dim) == (40, 13824)
    assert isinstance(PRESETS["tiny"], WanConfig)


I2V = dataclasses.replace(
    CONFIG, in_channels=2 * CONFIG.out_channels + 4, image_dim=12, added_kv_proj_dim=CONFIG.dim
)


def test_image_to_video_inputs_are_checked():
    model = WanTransformer(I2V, rngs=nnx.Rngs(0))
    x, t, ctx = _inputs()
    image = jnp.ones((2, 3, 12), jnp.float32)
    cond = jnp.zeros((*x.shape[:4], I2V.condition_channels), jnp.float32)
    assert I2V.condition_channels == CONFIG.out_channels + 4
    out = model(x, t, ctx, image=image, condition=cond)
    assert out.shape == x.shape
    # condition None is zeros; the whole input may also come pre-concatenated
    np.testing.assert_allclose(model(x, t, ctx, image=image), out, atol=1e-6)
    whole = jnp.concatenate([x, cond], -1)
    np.testing.assert_allclose(model(whole, t, ctx, image=image), out, atol=1e-6)
    with pytest.raises(ValueError, match="reads CLIP image tokens"):
        model(x, t, ctx, condition=cond)
    with pytest.raises(ValueError, match=r"image must be \(b, s, 12\)"):
        model(x, t, ctx, image=jnp.ones((2, 3, 5)), condition=cond)
    with pytest.raises(ValueError, match="condition must be"):
        model(x, t, ctx, image=image, condition=cond[:, :2])
    text_only = WanTransformer(CONFIG, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="no image embedder"):
        text_only(x, t, ctx, image=image)
    with pytest.raises(ValueError, match="without condition channels"):
        text_only(x, t, ctx, condition=cond)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(image_dim=8), "go together"),
        (dict(image_dim=8, added_kv_proj_dim=32), "must equal dim"),
        (dict(pos_embed_seq_len=4), "needs image_dim"),
        (dict(in_channels=4), "in_channels 4 < out_channels"),
    ],
)
def test_image_config_is_validated(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(CONFIG, **change)
