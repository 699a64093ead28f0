"""Image-to-video and two-expert models through the shared samplers (issue 21, item 5): the
base loop, DVG's stages (whose image condition is restricted to each reduced grid) and the
step cache, on the tiny random-weight presets."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vidax import dvg, pipeline, sampling
from vidax.models import get
from vidax.models.experts import TwoExperts
from vidax.models.weights import RandomWeightsWarning, load_image_encoder
from vidax.text import embed_prompts
from vidax.video import image_pixels

FRAMES = 17  # 5 latent frames: room for temporal stages
IMAGE = np.random.default_rng(0).uniform(size=(40, 56, 3)).astype(np.float32)
PRESETS = {  # preset -> (height/width, image given)
    "wan2.1-i2v-tiny": (64, True),
    "wan2.2-a14b-tiny": (64, False),
    "wan2.2-ti2v-tiny": (128, True),
}


def _parts(name):
    """(model, cond, negative, noise, guidance) as `pipeline.generate` builds them."""
    spec = get(name)
    size, with_image = PRESETS[name]
    model = spec.build(seed=0)
    if spec.boundary_ratio is not None:
        model = TwoExperts(model, spec.build(seed=1), spec.boundary_ratio)
    adapter = pipeline.Adapter.of(spec)
    d = spec.defaults
    cond = adapter.conditioning(embed_prompts(spec, ["a red circle"]), d.guidance)
    negative = adapter.conditioning(embed_prompts(spec, [""]), d.guidance)
    guidance = d.guidance
    if spec.boundary_ratio is not None:
        guidance = sampling.ExpertGuidance(d.guidance, d.guidance_2, spec.boundary_ratio * 1000)
    if with_image:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RandomWeightsWarning)
            encoder = load_image_encoder(spec, None, random_weights=True)
        extra = pipeline.image_conditioning(
            spec, IMAGE, spec.vae_spec.build(seed=0), encoder, FRAMES, size, size, 1
        )
        cond, negative = {**cond, **extra}, {**negative, **extra}
    shape = spec.geometry().latent_shape(FRAMES, size, size)
    noise = jax.random.normal(jax.random.key(0), (1, *shape), jnp.float32)
    return model, cond, negative, noise, guidance


@pytest.mark.parametrize("name", list(PRESETS))
def test_dvg_none_is_the_base_sampler_and_dvg_runs(name):
    model, cond, negative, noise, guidance = _parts(name)
    solver = get(name).defaults.solver(steps=6)
    base = pipeline.denoise(model, noise, cond, negative, solver=solver, guidance=guidance)
    none, _ = dvg.accelerate(
        model, noise, cond, negative, solver=solver, guidance=guidance, accel="none"
    )
    np.testing.assert_array_equal(none, base)
    for accel in ("temporal", "spatial", "joint"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # budgets below a family's cheapest schedule
            out, choices = dvg.accelerate(
                model,
                noise,
                cond,
                negative,
                solver=solver,
                guidance=guidance,
                accel=accel,
                budget=0.5,
            )
        assert out.shape == base.shape and bool(jnp.isfinite(out).all())
        assert choices[0].cost < 1.0
        # The reduced stages change the path, not the destination's neighbourhood.
        assert 0 < float(jnp.abs(out - base).max()) < 10 * float(jnp.abs(base).max())


def test_the_image_condition_is_restricted_to_each_stage_grid():
    _, cond, _, noise, _ = _parts("wan2.1-i2v-tiny")
    condition = cond["condition"]  # (b, t, h, w, 4 mask + 4 latents)
    for factors in [(2, 1), (1, 2), (2, 2)]:
        grid = dvg.StageGrid(factors, (0, 0, 0), None, "linear", "dct")
        small = grid.restrict(condition)
        t, h, w = dvg.reduced_shape(noise.shape[1:4], factors)
        assert small.shape == (1, t, h, w, condition.shape[-1])
        # The first-frame mask is rebuilt on the grid: one on frame 0, zero elsewhere.
        np.testing.assert_allclose(small[:, 0, ..., :4], 1.0, atol=1e-5)
        np.testing.assert_allclose(small[:, 1:, ..., :4], 0.0, atol=1e-5)
        # Frame 0's image latents, low-passed in space (nested in time).
        want = dvg.downsample(condition[:, :1, ..., 4:], (1, factors[1]))
        np.testing.assert_allclose(small[:, :1, ..., 4:], want, atol=1e-5)


@pytest.mark.parametrize("accel", ["none", "dvg+cache", "cache"])
def test_generate_image_to_video_end_to_end(accel, tmp_path, monkeypatch):
    monkeypatch.setenv("VIDAX_STEP_CACHE_DIR", str(tmp_path))
    kw = dict(num_frames=FRAMES, height=128, width=128, steps=6, random_weights=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        video = pipeline.generate(
            "wan2.2-ti2v-tiny", "a red circle", image=IMAGE, accel=accel, **kw
        )
        text_only = pipeline.generate("wan2.2-ti2v-tiny", "a red circle", **kw)
    assert video.frames.shape == (FRAMES, 128, 128, 3) and np.isfinite(video.latents).all()
    # TI2V: the first latent frame is the image's own, whatever the sampler did.
    spec = get("wan2.2-ti2v-tiny")
    vae = spec.vae_spec.build(seed=0)
    first = vae.encode(jnp.asarray(image_pixels(IMAGE, 128, 128))[:, None])
    np.testing.assert_allclose(video.latents[:, :1], first, atol=1e-5)
    assert np.abs(text_only.latents[:, 0] - video.latents[:, 0]).max() > 1e-3


def test_images_are_checked_against_the_task():
    kw = dict(steps=2, random_weights=True, decode_frames=False)
    with pytest.raises(ValueError, match="is text-to-video: it takes no image"):
        pipeline.generate("wan2.2-a14b-tiny", "x", image=IMAGE, **kw)
    with pytest.raises(ValueError, match="is image-to-video: pass an image"):
        pipeline.generate("wan2.1-i2v-tiny", "x", **kw)
    with pytest.raises(ValueError, match="model 'tiny' has one transformer"):
        pipeline.generate("tiny", "x", guidance_2=2.0, **kw)
    with pytest.raises(ValueError, match="2 images for 1 prompts"):
        pipeline.generate("wan2.1-i2v-tiny", "x", image=np.stack([IMAGE, IMAGE]), **kw)
