"""The VAE stage: fast CPU forward equals the model's, crops, loss pieces, a short run."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import vidax.train.vae as stage
from vidax.data import EVAL_PROMPTS, render
from vidax.models.wan_vae import PRESETS, WanVAE, load
from vidax.models.wan_vae.model import CausalConv3d
from vidax.train.vae import (
    CroppedClips,
    VAEStageConfig,
    decode_raw,
    moments,
    object_mask,
    resolve_conv_impl,
    train_vae,
    with_conv_impl,
)

SMALL = VAEStageConfig(
    vae="tiny",
    frames=9,
    short_frames=5,
    short_fraction=0.5,
    crop=16,
    batch_size=2,
    steps=2,
    checkpoint_every=1,
)


@pytest.fixture(scope="module")
def vae():
    return WanVAE(
        dataclasses.replace(PRESETS["tiny"], latents_mean=None, latents_std=None), rngs=nnx.Rngs(0)
    )


def test_fast_forward_matches_the_model(vae):
    x = jax.random.uniform(jax.random.key(0), (1, 9, 16, 16, 3), minval=-1.0, maxval=1.0)
    mu_ref, logvar_ref = vae.moments(x)
    z = jax.random.normal(jax.random.key(1), mu_ref.shape)
    y_ref = vae.decode_raw(z)
    fast = with_conv_impl(vae, "2d-sum")
    mu, logvar = nnx.jit(moments)(fast, x)
    y = nnx.jit(decode_raw)(fast, z)
    # Only the copy computes its convolutions as 2D sums; the model it came from is unchanged.
    convs = lambda m: [n for _, n in nnx.iter_graph(m) if isinstance(n, CausalConv3d)]
    assert {c.conv_impl for c in convs(fast)} == {"2d-sum"}
    assert {c.conv_impl for c in convs(vae)} == {"native"}
    np.testing.assert_allclose(np.asarray(mu), np.asarray(mu_ref), atol=2e-5)
    np.testing.assert_allclose(np.asarray(logvar), np.asarray(logvar_ref), atol=2e-5)
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), atol=2e-5)
    assert not np.array_equal(np.asarray(y), np.asarray(y_ref))  # really another computation


def test_conv_impl_auto_sums_2d_convolutions_on_a_cpu():
    assert jax.default_backend() == "cpu"  # the test suite's backend
    assert resolve_conv_impl() == "2d-sum" and resolve_conv_impl("native") == "native"
    assert SMALL.model_config.conv_impl == "2d-sum"
    native = dataclasses.replace(SMALL, conv_impl="native")
    assert native.model_config.conv_impl == "native"
    with pytest.raises(ValueError, match="conv_impl"):
        dataclasses.replace(SMALL, conv_impl="fast")


def test_crops_are_deterministic_and_resumable():
    a = CroppedClips(SMALL)
    first, second = next(a), next(a)
    # Step 0 is in the short part of the curriculum: the first 5 frames of step 0's clips.
    assert first["video"].shape == (2, 5, 16, 16, 3)
    assert second["video"].shape == (2, 9, 16, 16, 3)
    full = next(CroppedClips(dataclasses.replace(SMALL, short_fraction=0.0)))["video"]
    np.testing.assert_array_equal(first["video"], full[:, :5])
    b = CroppedClips(SMALL)
    b.set_state({"seed": 0, "step": 1})
    np.testing.assert_array_equal(next(b)["video"], second["video"])
    assert a.get_state() == {"seed": 0, "step": 2}
    # Object-centred crops hold palette pixels far more often than chance.
    many = CroppedClips(dataclasses.replace(SMALL, batch_size=16, object_crop=1.0))
    video = next(many)["video"]
    assert np.mean([object_mask(jnp.asarray(v[0])).max() for v in video]) > 0.8


def test_object_mask_separates_palette_from_background():
    frames, _ = render(EVAL_PROMPTS[0].spec, 1)
    mask = np.asarray(object_mask(jnp.asarray(frames[0])))[..., 0]
    r = 0.11 * 64  # the prompt's red circle of radius 0.11 at the centre
    yy, xx = np.mgrid[:64, :64] + 0.5
    inside = (xx - 32) ** 2 + (yy - 32) ** 2 < (r - 1) ** 2
    outside = (xx - 32) ** 2 + (yy - 32) ** 2 > (r + 1) ** 2
    assert mask[inside].all() and not mask[outside].any()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(vae="nope"),
        dict(frames=8),
        dict(short_frames=6),
        dict(frames=9, short_frames=13),
        dict(short_fraction=1.0),
        dict(crop=12),
        dict(kl_weight=-1.0),
        dict(object_crop=2.0),
    ],
)
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        VAEStageConfig(**{"vae": "tiny", **kwargs})


def test_short_run_exports_loadable_weights_and_stats(tmp_path, monkeypatch):
    monkeypatch.setattr(stage, "latent_stats", _quick_stats(stage.latent_stats))
    ema = train_vae(tmp_path, SMALL)
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and all(np.isfinite(r["loss"]) for r in log)
    stats = json.loads((tmp_path / "latent_stats.json").read_text())
    assert len(stats["mean"]) == len(stats["std"]) == PRESETS["tiny"].z_dim
    assert all(s > 0 for s in stats["std"])
    loaded = load(tmp_path / "vae.safetensors", SMALL.model_config)
    a = jax.tree.leaves(nnx.state(loaded, nnx.Param))
    b = jax.tree.leaves(nnx.state(ema, nnx.Param))
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))


def _quick_stats(fn):
    return lambda vae, **kw: fn(vae, clips=2, frames=5, batch=2)
