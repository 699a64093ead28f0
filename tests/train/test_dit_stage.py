"""The DiT stage: latent cache, batches, attention layout, loss, a short run."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import vidax.train.dit as stage
from vidax.checkpoint import save_model
from vidax.models import wan_vae
from vidax.models.wan import PRESETS as WAN
from vidax.models.wan import WanTransformer, key_map, load
from vidax.nn import attention
from vidax.sharding import make_mesh
from vidax.text.hashed import HashedTextEmbedder
from vidax.train.dit import (
    DiTStageConfig,
    LatentBatches,
    build_cache,
    build_model,
    dit_loss,
    forward,
    latent_object_mask,
    load_trained_vae,
    self_attention,
    train_dit,
)
from vidax.train.loop import make_step, place_batch, replicate
from vidax.train.optim import OptimConfig, make_optimizer
from vidax.train.step import init_state

SMALL_MODEL = dataclasses.replace(WAN["tiny"], dim=32, num_heads=2, ffn_dim=64, num_layers=2)


def test_self_attention_equals_the_reference():
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 12, 3, 8)) for i in range(3))
    np.testing.assert_allclose(
        np.asarray(self_attention(q, k, v)),
        np.asarray(attention(q, k, v, impl="reference")),
        atol=1e-5,
    )


def test_forward_equals_the_model_call():
    model = WanTransformer(SMALL_MODEL, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 3, 4, 4, SMALL_MODEL.in_channels))
    t = jnp.asarray([100.0, 900.0])
    ctx = jax.random.normal(jax.random.key(1), (2, SMALL_MODEL.text_len, SMALL_MODEL.text_dim))
    np.testing.assert_allclose(
        np.asarray(forward(model, x, t, ctx)), np.asarray(model(x, t, ctx)), atol=1e-4
    )


def _vae_run(tmp_path):
    """A random "shapes" VAE exported like `train_vae` does."""
    config = dataclasses.replace(wan_vae.PRESETS["shapes"], latents_mean=None, latents_std=None)
    vae = wan_vae.WanVAE(config, rngs=nnx.Rngs(0))
    tmp_path.mkdir(parents=True, exist_ok=True)
    wan_vae.save(vae, tmp_path / "vae.safetensors")
    z = config.z_dim
    stats = {"mean": [0.1] * z, "std": [0.5] * z}
    (tmp_path / "latent_stats.json").write_text(json.dumps(stats))
    return tmp_path


def test_cache_batches_cover_every_clip_once_per_epoch(tmp_path):
    run = _vae_run(tmp_path / "vae")

    vae = load_trained_vae(run, "shapes")
    build_cache(tmp_path / "cache", vae, clips=6, frames=5, seed=3, vae_id="x")
    mtime = (tmp_path / "cache" / "chunk_0000.npz").stat().st_mtime
    build_cache(tmp_path / "cache", vae, clips=6, frames=5, seed=3, vae_id="x")  # no-op
    assert (tmp_path / "cache" / "chunk_0000.npz").stat().st_mtime == mtime
    with pytest.raises(ValueError, match="new run dir"):
        build_cache(tmp_path / "cache", vae, clips=6, frames=5, seed=4, vae_id="x")

    embedder = HashedTextEmbedder(dim=64, text_len=32)
    batches = LatentBatches(tmp_path / "cache", batch_size=3, seed=0, embedder=embedder)
    assert len(batches) == 6 and batches.latents.shape == (6, 2, 16, 16, 8)
    # Every clip has 1-3 objects: some latents, but far from all, are marked.
    assert batches.masks.shape == (6, 2, 16, 16, 1)
    assert all(0 < m.mean() < 0.5 for m in batches.masks)
    seen = [c for _ in range(2) for c in next(batches)["caption"]]
    assert sorted(seen) == sorted(batches.captions)  # one epoch = every clip once
    third = next(batches)
    other = LatentBatches(tmp_path / "cache", batch_size=3, seed=0, embedder=embedder)
    other.set_state({"seed": 0, "step": 2})
    np.testing.assert_array_equal(next(other)["latents"], third["latents"])
    with pytest.raises(ValueError):
        other.set_state({"seed": 1, "step": 0})
    # The caption embedding is the pipeline's (hashed embedder of the caption).
    np.testing.assert_array_equal(third["context"][0], embedder(third["caption"][0])[0][0])


def test_loss_drops_captions_at_the_dropout_rate():
    model = WanTransformer(SMALL_MODEL, rngs=nnx.Rngs(0))
    batch = {
        "latents": jnp.zeros((64, 1, 4, 4, SMALL_MODEL.in_channels)),
        "objects": jnp.zeros((64, 1, 4, 4, 1)),
        "context": jnp.ones((64, SMALL_MODEL.text_len, SMALL_MODEL.text_dim)),
    }
    seen = {}

    def spy(m, x, t, context, positions=None):
        seen["kept"] = np.asarray(context[:, 0, 0])
        return jnp.zeros_like(x)

    config = DiTStageConfig(cfg_dropout=0.5)
    real = stage.forward
    stage.forward = spy
    try:
        loss, metrics = dit_loss(model, batch, jax.random.key(0), config)
    finally:
        stage.forward = real
    assert set(np.unique(seen["kept"])) <= {0.0, 1.0}
    assert 0.25 < 1 - seen["kept"].mean() < 0.75
    assert np.isfinite(float(loss)) and set(metrics) == {
        "loss_high_noise",
        "loss_low_noise",
        "loss_objects",
    }


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(model="wan2.1-1.3b"),
        dict(frames=32),
        dict(short_frames=37),
        dict(cfg_dropout=1.0),
        dict(object_weight=-1.0),
        dict(object_weight_sigma=1.5),
        dict(image_fraction=1.0),
        dict(image_fraction=-0.1),
    ],
)
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        DiTStageConfig(**kwargs)


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 0.3])
def test_image_steps_are_interleaved_at_the_given_share(fraction):
    config = DiTStageConfig(steps=200, short_fraction=0.5, image_fraction=fraction)
    frames = [config.latent_frames_at(step, short_t=5) for step in range(200)]
    images = [step for step, t in enumerate(frames) if t == 1]
    assert len(images) == round(200 * fraction)
    if len(images) > 1:  # spread evenly: no two image steps closer than 1 / fraction - 1
        assert min(np.diff(images)) >= int(1 / fraction)
    # the other steps follow the short-then-whole curriculum
    assert all(t == 5 for step, t in enumerate(frames[:100]) if step not in images)
    assert all(t is None for step, t in enumerate(frames[100:], 100) if step not in images)


def test_config_rejects_missing_init_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match="init weights"):
        DiTStageConfig(init=str(tmp_path / "missing.safetensors"))


def test_latent_object_mask_follows_the_causal_vae_footprint():
    video = -np.ones((1, 9, 8, 8, 3), np.float32)
    video[0, 0, 0, 0] = 0.9  # frame 0 -> latent frame 0, block (0, 0)
    video[0, 6, 7, 4, 1] = 0.9  # frames 5..8 -> latent frame 2, block (1, 1)
    video[0, 3, 2, 2] = 0.1  # dim (background-bright) pixel: not an object
    mask = latent_object_mask(video, temporal=4, spatial=4)
    assert mask.shape == (1, 3, 2, 2, 1) and mask.dtype == np.uint8
    expected = np.zeros((3, 2, 2), np.uint8)
    expected[0, 0, 0] = expected[2, 1, 1] = 1
    np.testing.assert_array_equal(mask[0, ..., 0], expected)
    with pytest.raises(ValueError, match="does not fit"):
        latent_object_mask(video[:, :8], temporal=4, spatial=4)


def test_object_weight_raises_the_share_of_object_errors():
    """Error only on object latents: the weighted loss grows with the weight, as computed."""
    model = WanTransformer(SMALL_MODEL, rngs=nnx.Rngs(0))
    shape = (4, 1, 4, 4, SMALL_MODEL.in_channels)
    objects = np.zeros((4, 1, 4, 4, 1), np.float32)
    objects[:, :, :2, :2] = 1.0  # a quarter of the latents
    batch = {
        "latents": jnp.zeros(shape),
        "objects": jnp.asarray(objects),
        "context": jnp.zeros((4, SMALL_MODEL.text_len, SMALL_MODEL.text_dim)),
    }

    def exact_but_objects(m, x, t, context, positions=None):
        # x = sigma * noise with x0 = 0: the true velocity is x / sigma; miss it by 1 on objects.
        sigma = (t / 1000.0)[:, None, None, None, None]
        return x / sigma + jnp.asarray(objects)

    real = stage.forward
    stage.forward = exact_but_objects
    try:
        losses = {
            (w, top): dit_loss(
                model,
                batch,
                jax.random.key(0),
                DiTStageConfig(object_weight=w, object_weight_sigma=top),
            )
            for w, top in [(0.0, 1.0), (4.0, 1.0), (4.0, 0.0)]
        }
    finally:
        stage.forward = real
    # Unweighted: error 1 on a quarter of the elements. Weighted x5: 5 / (5 + 3) of the mass.
    np.testing.assert_allclose(float(losses[0.0, 1.0][0]), 0.25, rtol=1e-4)
    np.testing.assert_allclose(float(losses[4.0, 1.0][0]), 5 / 8, rtol=1e-4)
    np.testing.assert_allclose(float(losses[4.0, 1.0][1]["loss_objects"]), 1.0, rtol=1e-4)
    # Above `object_weight_sigma` (here: every noise level) the weight is off.
    np.testing.assert_allclose(float(losses[4.0, 0.0][0]), 0.25, rtol=1e-4)


def test_init_starts_from_given_weights(tmp_path):
    source = DiTStageConfig().spec.build(seed=7)
    save_model(source, tmp_path / "init.safetensors", key_map(WAN["tiny"]))
    model = build_model(DiTStageConfig(init=str(tmp_path / "init.safetensors")))
    a = jax.tree.leaves(nnx.state(model, nnx.Param))
    b = jax.tree.leaves(nnx.state(source, nnx.Param))
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))
    fresh = build_model(DiTStageConfig())
    assert not np.any(np.asarray(fresh.proj_out.kernel[...]))  # adaLN-Zero start


def test_short_run_exports_loadable_weights(tmp_path):
    run = _vae_run(tmp_path / "vae")
    config = DiTStageConfig(
        steps=2,
        batch_size=2,
        cache_clips=2,
        frames=9,
        short_frames=5,
        short_fraction=0.5,
        image_fraction=0.5,
    )
    ema = train_dit(tmp_path / "dit", run, config)
    log = [json.loads(line) for line in (tmp_path / "dit" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and all(np.isfinite(r["loss"]) for r in log)
    loaded = load(tmp_path / "dit" / "transformer.safetensors", WAN["tiny"])
    a = jax.tree.leaves(nnx.state(loaded, nnx.Param))
    b = jax.tree.leaves(nnx.state(ema, nnx.Param))
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))


def test_data_parallel_dit_step_matches_single_device():
    config = DiTStageConfig(batch_size=8)
    model = WanTransformer(SMALL_MODEL, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer = make_optimizer(OptimConfig(lr=1e-3, warmup=1))

    def loss_fn(p, batch, key):
        return dit_loss(nnx.merge(graphdef, p, rest), batch, key, config)

    rng = np.random.default_rng(0)
    batch = {
        "latents": rng.normal(size=(8, 2, 4, 4, SMALL_MODEL.in_channels)).astype(np.float32),
        "objects": (rng.uniform(size=(8, 2, 4, 4, 1)) < 0.2).astype(np.float32),
        "context": rng.normal(size=(8, 8, SMALL_MODEL.text_dim)).astype(np.float32),
    }
    results = []
    for mesh in (None, make_mesh((8,), ("data",))):
        step = make_step(loss_fn, optimizer, ema_decay=0.9, seed=0)
        state = replicate(init_state(jax.tree.map(jnp.copy, params), optimizer), mesh)
        placed = place_batch(batch, mesh)
        losses = []
        for _ in range(2):
            state, metrics = step(state, placed)
            losses.append(float(metrics["loss"]))
        results.append((losses, jax.device_get(state["params"])))
    (single, p1), (sharded, p8) = results
    np.testing.assert_allclose(sharded, single, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p8), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
