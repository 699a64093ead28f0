"""HunyuanVideo-1.5 DiT behaviour beyond reference parity: optional conditioning, errors, scan."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from vidax.models.hunyuan15 import PRESETS, HunyuanVideo15Config, HunyuanVideo15Transformer
from vidax.nn import video_positions
from vidax.sharding import PARAM_AXES

CONFIG = dataclasses.replace(
    PRESETS["tiny"],
    num_heads=2,
    head_dim=16,
    rope_axes_dims=(4, 6, 6),
    in_channels=9,
    out_channels=4,
    text_dim=24,
    text_len=6,
    byt5_dim=12,
    byt5_len=4,
    byt5_hidden=16,
    image_dim=10,
    image_len=3,
    freq_dim=32,
    use_meanflow=True,
)


@pytest.fixture(scope="module")
def model():
    """Random parameters filled in from numpy: the initialisers (shared with HunyuanVideo,
    whose tests run them) cost ~10x more on CPU than everything else in this file."""
    graphdef, state = nnx.split(
        nnx.eval_shape(lambda: HunyuanVideo15Transformer(CONFIG, rngs=nnx.Rngs(0)))
    )
    rng = np.random.default_rng(0)

    def fill(path, value):
        scale = 1 / np.sqrt(value.shape[-2]) if value.ndim >= 2 else 0.2
        is_norm_scale = "scale" in [getattr(k, "key", None) for k in path]
        offset = 1.0 if is_norm_scale else 0.0
        return jnp.asarray(offset + scale * rng.standard_normal(value.shape), value.dtype)

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(fill, state))


def _inputs(b=2, t=2, h=3, w=4, seed=1):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
    lengths = lambda n, full: jnp.arange(full)[None] < jnp.array(n)[:, None]
    return dict(
        x=normal(b, t, h, w, CONFIG.in_channels),
        timestep=jnp.linspace(100.0, 900.0, b),
        text=normal(b, CONFIG.text_len, CONFIG.text_dim),
        text_mask=lengths([3, CONFIG.text_len][:b], CONFIG.text_len),
        byt5=normal(b, CONFIG.byt5_len, CONFIG.byt5_dim),
        byt5_mask=lengths([2, 0][:b], CONFIG.byt5_len),
        image_embeds=normal(b, CONFIG.image_len, CONFIG.image_dim),
        timestep_r=jnp.linspace(50.0, 20.0, b),
    )


def _call(model, inputs, **changes):
    inputs = {**inputs, **changes}
    return model(inputs.pop("x"), inputs.pop("timestep"), inputs.pop("text"), **inputs)


def test_optional_conditioning(model):
    """Absent inputs equal their masked-out forms; present ones change the prediction."""
    inputs = _inputs()
    zero_image = jnp.zeros_like(inputs["image_embeds"])
    # Sample 0 conditions on an image, sample 1 is text-to-video (all-zero embeddings).
    mixed_image = inputs["image_embeds"].at[1].set(0.0)
    no_glyphs = jnp.zeros_like(inputs["byt5_mask"])
    variants = {
        "full": {},
        "no_image": {"image_embeds": None},
        "zero_image": {"image_embeds": zero_image},
        "mixed_image": {"image_embeds": mixed_image},
        "no_byt5": {"byt5": None, "byt5_mask": None},
        "masked_byt5": {"byt5_mask": no_glyphs},
        "no_r": {"timestep_r": None},
        "no_image_no_byt5": {"image_embeds": None, "byt5": None, "byt5_mask": None},
    }
    out = jax.jit(lambda inputs: {k: _call(model, inputs, **v) for k, v in variants.items()})(
        inputs
    )
    x = inputs["x"]
    assert out["full"].shape == (*x.shape[:4], CONFIG.out_channels)
    assert out["full"].dtype == jnp.float32 and np.isfinite(np.asarray(out["full"])).all()
    close = lambda a, b: np.testing.assert_allclose(out[a], out[b], atol=1e-5)
    differ = lambda a, b: np.abs(np.asarray(out[a] - out[b])).max() > 1e-3
    close("zero_image", "no_image")
    close("masked_byt5", "no_byt5")
    # Per-sample text-to-video detection.
    np.testing.assert_allclose(out["mixed_image"][0], out["full"][0], atol=1e-5)
    np.testing.assert_allclose(out["mixed_image"][1], out["no_image"][1], atol=1e-5)
    # Sample 1 has no glyph tokens (all-False mask), so only sample 0 sees them.
    np.testing.assert_allclose(out["no_byt5"][1], out["full"][1], atol=1e-5)
    assert np.abs(np.asarray(out["no_byt5"][0] - out["full"][0])).max() > 1e-3
    assert differ("no_image", "full") and differ("no_r", "full")
    assert differ("no_image_no_byt5", "no_image")


def test_stages_compose_to_the_forward(model):
    inputs = _inputs()

    @jax.jit
    def both(inputs):
        tokens, grid = model.embed(inputs["x"])
        assert grid == (2, 3, 4) and tokens.shape == (2, 24, CONFIG.dim)
        cond = model.condition(
            inputs["timestep"],
            inputs["text"],
            inputs["text_mask"],
            byt5=inputs["byt5"],
            byt5_mask=inputs["byt5_mask"],
            image_embeds=inputs["image_embeds"],
            timestep_r=inputs["timestep_r"],
        )
        s = CONFIG.image_len + CONFIG.byt5_len + CONFIG.text_len
        assert cond.text.shape == (2, s, CONFIG.dim) and cond.text_mask.shape == (2, s)
        staged = model.unembed(model.run_blocks(tokens, cond, model.rope(grid)), cond, grid)
        scaled = video_positions(*grid, scale=(1.0, 2.0, 2.0))
        return staged, _call(model, inputs), _call(model, inputs, positions=scaled)

    staged, full, scaled = both(inputs)
    np.testing.assert_allclose(staged, full, atol=1e-5)
    assert np.abs(np.asarray(scaled - full)).max() > 1e-3


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("x", jnp.zeros((2, 2, 3, 4, 5)), "expected a latent of 4 channels"),
        ("text", jnp.zeros((2, 6, 8)), "text must be"),
        ("text_mask", jnp.ones((2, 5), bool), "text_mask must be"),
        ("byt5", jnp.zeros((2, 4, 24)), "byt5 must be"),
        ("byt5_mask", jnp.ones((2, 3), bool), "byt5_mask must be"),
        ("image_embeds", jnp.zeros((2, 3, 12)), "image_embeds must be"),
        ("timestep_r", jnp.zeros((3,)), "timestep_r must be"),
    ],
)
def test_bad_inputs(model, field, value, message):
    with pytest.raises(ValueError, match=message):
        _call(model, _inputs(), **{field: value})


def test_inputs_the_config_does_not_support_raise():
    """Checked before any compute, so an abstract model suffices."""
    patched = dataclasses.replace(CONFIG, patch_size=(1, 2, 2), use_meanflow=False)
    model = nnx.eval_shape(lambda: HunyuanVideo15Transformer(patched, rngs=nnx.Rngs(0)))
    assert model.time_embedder_r is None
    inputs = _inputs()
    with pytest.raises(ValueError, match="not divisible by patch size"):
        _call(model, inputs)
    with pytest.raises(ValueError, match="use_meanflow"):
        model.condition(
            inputs["timestep"], inputs["text"], inputs["text_mask"], timestep_r=inputs["timestep_r"]
        )
    with pytest.raises(ValueError, match="byt5_mask given without byt5"):
        model.condition(
            inputs["timestep"], inputs["text"], inputs["text_mask"], byt5_mask=inputs["byt5_mask"]
        )


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"num_layers": 0}, "must be positive"),
        ({"byt5_hidden": 0}, "must be positive"),
        ({"rope_axes_dims": (4, 6, 4)}, "must sum to head_dim"),
        ({"param_dtype": "int8"}, "param_dtype must be one of"),
    ],
)
def test_config_validation(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(CONFIG, **changes)


def test_scan_keeps_the_program_size_independent_of_depth():
    inputs = _inputs(b=1)

    def size(layers):
        cfg = dataclasses.replace(CONFIG, num_layers=layers, num_refiner_layers=layers)
        model = nnx.eval_shape(lambda: HunyuanVideo15Transformer(cfg, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(model)
        jaxpr = jax.make_jaxpr(lambda s: _call(nnx.merge(graphdef, s), inputs))(state)
        return len(jaxpr.jaxpr.eqns)

    assert size(1) == size(4)


def test_presets_have_the_published_sizes_and_known_axes():
    c = PRESETS["hunyuanvideo1.5"]
    assert (c.dim, c.num_heads, c.num_layers, c.patch_size) == (2048, 16, 54, (1, 1, 1))
    assert (c.in_channels, c.out_channels, c.latent_channels) == (65, 32, 32)
    assert (c.text_dim, c.byt5_dim, c.image_dim) == (3584, 1472, 1152)
    assert isinstance(PRESETS["tiny"], HunyuanVideo15Config)
    assert PRESETS["tiny"].in_channels == 2 * PRESETS["tiny"].out_channels + 1
    model = nnx.eval_shape(lambda: HunyuanVideo15Transformer(c, rngs=nnx.Rngs(0)))
    leaves = jax.tree.leaves(
        nnx.state(model, nnx.Param), is_leaf=lambda v: isinstance(v, nnx.Variable)
    )
    for variable in leaves:
        axes = variable.get_metadata()["out_sharding"]
        assert len(axes) == variable.get_value().ndim
        assert set(axes) - {None} <= PARAM_AXES, axes
    # 8.3B parameters (the exact count is checked against diffusers in tests/reference).
    assert 8.0e9 < sum(v.get_value().size for v in leaves) < 8.6e9
