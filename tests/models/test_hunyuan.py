"""HunyuanVideo DiT behaviour beyond reference parity: stages, masks, hooks, errors, scan."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax.models.hunyuan import PRESETS, HunyuanVideoConfig, HunyuanVideoTransformer
from vidax.nn import attention, video_positions
from vidax.sharding import PARAM_AXES, make_mesh, use_mesh

CONFIG = dataclasses.replace(
    PRESETS["tiny"],
    num_heads=2,
    head_dim=16,
    rope_axes_dims=(4, 6, 6),
    text_dim=24,
    text_len=6,
    pooled_dim=12,
    freq_dim=32,
)
GRID = (3, 2, 3)  # token grid of the default latent (3, 4, 6)


@pytest.fixture(scope="module")
def model():
    return HunyuanVideoTransformer(CONFIG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def forward(model):
    """The jitted forward, always with explicit positions (one trace for every test)."""
    jitted = jax.jit(lambda *a, positions: model(*a, positions=positions))

    def call(*inputs, positions=None):
        return jitted(*inputs, positions=video_positions(*GRID) if positions is None else positions)

    return call


def _inputs(b=2, t=3, h=4, w=6, seed=1):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
    mask = jnp.arange(CONFIG.text_len)[None] < jnp.array([3, CONFIG.text_len][:b])[:, None]
    return (
        normal(b, t, h, w, CONFIG.in_channels),
        jnp.linspace(100.0, 900.0, b),
        normal(b, CONFIG.text_len, CONFIG.text_dim),
        mask,
        normal(b, CONFIG.pooled_dim),
        jnp.full((b,), 5000.0),
    )


def test_output_shape_and_dtype(forward):
    x, *cond = _inputs()
    y = forward(x, *cond)
    assert y.shape == (*x.shape[:4], CONFIG.out_channels) and y.dtype == jnp.float32
    assert np.isfinite(np.asarray(y)).all()


def test_stacked_layers_are_initialised_independently(model):
    dual = np.asarray(model.double_blocks.attn.to_q.kernel[...])
    single = np.asarray(model.single_blocks.to_q.kernel[...])
    assert dual.shape == (CONFIG.num_layers, CONFIG.dim, CONFIG.dim)
    assert not np.allclose(dual[0], dual[1]) and not np.allclose(single[0], single[1])
    assert not np.allclose(dual[0], single[0])


def test_stages_compose_to_the_forward(model, forward):
    """The stages with default (integer-grid) RoPE equal the forward with explicit positions."""
    x, t, text, mask, pooled, g = _inputs()

    @jax.jit
    def staged(x, t, text, mask, pooled, g):
        tokens, grid = model.embed(x)
        assert grid == GRID and tokens.shape == (2, 18, CONFIG.dim)
        cond = model.condition(t, text, mask, pooled, g)
        angles = model.rope(grid)
        tokens, context = model.run_double_blocks(tokens, cond, angles)
        assert context.shape == (2, CONFIG.text_len, CONFIG.dim)
        tokens, _ = model.run_single_blocks(tokens, context, cond, angles)
        return model.unembed(tokens, cond, grid)

    want = forward(x, t, text, mask, pooled, g)
    np.testing.assert_allclose(staged(x, t, text, mask, pooled, g), want, atol=1e-5)


def test_positions_matter_and_are_checked(model, forward):
    inputs = _inputs()
    base = forward(*inputs)
    scaled = forward(*inputs, positions=video_positions(*GRID, scale=(2.0, 2.0, 2.0)))
    assert np.abs(np.asarray(scaled - base)).max() > 1e-3
    with pytest.raises(ValueError, match="positions must be"):
        model.rope(GRID, video_positions(3, 2, 2))


def test_padded_text_tokens_do_not_reach_the_video(forward):
    x, t, text, mask, pooled, g = _inputs()
    base = forward(x, t, text, mask, pooled, g)
    garbage = jnp.where(mask[..., None], text, 1e3)
    np.testing.assert_array_equal(forward(x, t, garbage, mask, pooled, g), base)
    # Unmasking the padded tokens does change the prediction of that sample only.
    unmasked = forward(x, t, text, jnp.ones_like(mask), pooled, g)
    assert np.abs(np.asarray(unmasked[0] - base[0])).max() > 1e-3
    np.testing.assert_allclose(unmasked[1], base[1], atol=1e-5)


def test_joint_attention_hook(model):
    calls = []

    def reference(q, k, v, key_mask):
        calls.append((q.shape, key_mask.shape))
        return attention(q, k, v, mask=key_mask[:, None, None, :], impl="reference")

    @jax.jit
    def run(x, t, text, mask, pooled, g):
        tokens, grid = model.embed(x)
        cond = model.condition(t, text, mask, pooled, g)
        angles = model.rope(grid)
        return [
            model.run_blocks(tokens, cond, angles, attention_fn=fn)
            for fn in (None, reference, lambda q, k, v, key_mask: v)
        ]

    default, hooked, identity = run(*_inputs())
    joint = 18 + CONFIG.text_len
    # Traced once per scanned stack (dual, single), over [video; text] tokens.
    assert calls == [((2, joint, 2, 16), (2, joint))] * 2
    np.testing.assert_allclose(hooked, default, atol=1e-5)
    assert not np.allclose(identity, default, atol=1e-3)


@pytest.mark.parametrize(
    "field, shape, message",
    [
        ("x", (2, 3, 4, 6, 7), "expected 16 latent channels"),
        ("x", (2, 3, 5, 6, 16), "not divisible by patch size"),
        ("text", (2, 6, 32), "text must be"),
        ("text_mask", (2, 5), "text_mask must be"),
        ("pooled", (2, 8), "pooled must be"),
        ("timestep", (2, 18), "timestep must be"),
    ],
)
def test_bad_inputs(model, field, shape, message):
    names = ("x", "timestep", "text", "text_mask", "pooled", "guidance")
    inputs = dict(zip(names, _inputs(), strict=True))
    inputs[field] = jnp.zeros(shape, bool if field == "text_mask" else jnp.float32)
    with pytest.raises(ValueError, match=message):
        model(*inputs.values())


def test_guidance_is_required_exactly_when_embedded(model):
    x, t, text, mask, pooled, _ = _inputs()
    with pytest.raises(ValueError, match="guidance"):
        model(x, t, text, mask, pooled, None)
    no_guidance = dataclasses.replace(CONFIG, guidance_embeds=False)
    abstract = nnx.eval_shape(lambda: HunyuanVideoTransformer(no_guidance, rngs=nnx.Rngs(0)))
    assert abstract.guidance_embedder is None
    with pytest.raises(ValueError, match="no guidance embedding"):
        abstract.condition(t, text, mask, pooled, jnp.ones((2,)))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"num_layers": 0}, "must be positive"),
        ({"num_single_layers": 0}, "must be positive"),
        ({"rope_axes_dims": (4, 6, 8)}, "must sum to head_dim"),
        ({"rope_axes_dims": (3, 7, 6)}, "even"),
        ({"patch_size": (1, 2)}, "patch_size"),
        ({"mlp_ratio": 0.0}, "mlp_ratio"),
        ({"dtype": "float64"}, "dtype must be one of"),
    ],
)
def test_config_validation(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(CONFIG, **changes)


def test_scan_keeps_the_program_size_independent_of_depth():
    inputs = _inputs(b=1)

    def size(layers, single):
        cfg = dataclasses.replace(CONFIG, num_layers=layers, num_single_layers=single)
        model = nnx.eval_shape(lambda: HunyuanVideoTransformer(cfg, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(model)
        jaxpr = jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(*inputs))(state)
        return len(jaxpr.jaxpr.eqns)

    assert size(1, 1) == size(3, 5)


def test_bfloat16_compute_stays_close_to_float32(model, forward):
    """bf16 compute over the same (float32-stored) parameters."""
    cfg16 = dataclasses.replace(CONFIG, dtype="bfloat16")
    graphdef16, _ = nnx.split(
        nnx.eval_shape(lambda: HunyuanVideoTransformer(cfg16, rngs=nnx.Rngs(0)))
    )
    m16 = nnx.merge(graphdef16, nnx.state(model))
    inputs = _inputs()
    y32 = forward(*inputs)
    y16 = jax.jit(lambda *a: m16(*a, positions=video_positions(*GRID)))(*inputs)
    assert y16.dtype == jnp.float32
    rel = float(jnp.abs(y16 - y32).max() / jnp.abs(y32).max())
    assert 0 < rel < 0.05


@pytest.mark.slow
def test_remat_gradients_match():
    cfg = dataclasses.replace(CONFIG, num_single_layers=1, num_refiner_layers=1)
    inputs = _inputs(b=1, t=1)

    def grads(remat):
        model = HunyuanVideoTransformer(dataclasses.replace(cfg, remat=remat), rngs=nnx.Rngs(3))
        loss = lambda m: jnp.mean(jnp.square(m(*inputs)))
        return jax.jit(nnx.grad(loss))(model)

    plain, remat = grads(False), grads(True)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(remat), strict=True):
        assert np.isfinite(np.asarray(a)).all()
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert any(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(plain))


def test_sharded_forward_matches_single_device(model, forward):
    inputs = _inputs()
    want = forward(*inputs)
    with use_mesh(make_mesh((2, 4), ("fsdp", "seq")), "fsdp_sp"):
        got = jax.jit(lambda *a: model(*a))(*inputs)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_presets_have_the_published_sizes_and_known_axes():
    c = PRESETS["hunyuanvideo"]
    assert (c.dim, c.num_layers, c.num_single_layers, c.mlp_dim) == (3072, 20, 40, 12288)
    assert (c.patch_size, c.rope_axes_dims, c.rope_theta) == ((1, 2, 2), (16, 56, 56), 256.0)
    assert (c.text_dim, c.pooled_dim, c.in_channels, c.guidance_embeds) == (4096, 768, 16, True)
    assert isinstance(PRESETS["tiny"], HunyuanVideoConfig)
    model = nnx.eval_shape(lambda: HunyuanVideoTransformer(c, rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(
        nnx.state(model, nnx.Param), is_leaf=lambda v: isinstance(v, nnx.Variable)
    )
    for variable in leaves:
        axes = variable.get_metadata()["out_sharding"]
        assert len(axes) == variable.get_value().ndim
        assert set(axes) - {None} <= PARAM_AXES, axes
    # ~12.8B parameters (the exact count is checked against diffusers in tests/reference).
    assert 12.5e9 < sum(v.get_value().size for v in leaves) < 13.1e9
