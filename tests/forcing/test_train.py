"""Training: both losses decrease on a tiny problem; a stage resumes from its checkpoint."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tests.forcing.conftest import SMALL

from vidax.forcing import ForcingConfig, load
from vidax.forcing.train import (
    WEIGHTS_FILE,
    StageConfig,
    diffusion_forcing_loss,
    self_forcing_loss,
    train_stage,
)
from vidax.models.wan_vae import PRESETS, WanVAE
from vidax.train.loop import read_log
from vidax.train.optim import OptimConfig

HW, C = (4, 4), SMALL.in_channels
DENSE = ForcingConfig(
    chunk_frames=1, timesteps=(1000.0, 500.0), shift=3.0, sink_frames=1, window_frames=1,
    block_size=2,
)  # fmt: skip
SPARSE = dataclasses.replace(
    DENSE, attention="sparse", local_topk=1, memory_blocks=2, memory_topk=1, compressed_tokens=2
)


def _fit(loss, params, steps: int, lr: float):
    opt = optax.adam(lr)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state, key):
        value, grads = jax.value_and_grad(loss)(params, key)
        with jax.numpy_dtype_promotion("standard"):  # optax mixes float and int32 counts
            updates, opt_state = opt.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, value

    values = []
    for _ in range(steps):
        # The same key every step: a fixed tiny problem the model can fit.
        params, opt_state, value = step(params, opt_state, jax.random.key(0))
        values.append(float(value))
    return values


def test_diffusion_forcing_step_decreases_loss(zero_init_model, context):
    graphdef, params = nnx.split(zero_init_model)
    latents = jax.random.normal(jax.random.key(1), (1, 3, *HW, C))

    def loss(params, key):
        m = nnx.merge(graphdef, params)
        return diffusion_forcing_loss(m, latents, context, key, DENSE, clean_probability=0.3)[0]

    values = _fit(loss, params, 8, 3e-3)
    assert np.isfinite(values).all() and values[-1] < 0.7 * values[0], values


@pytest.mark.slow
def test_self_forcing_step_decreases_loss(small_model, context):
    """Sparse student, dense teacher (the student's own initial weights, perturbed)."""
    graphdef, params = nnx.split(small_model)
    teacher = jax.tree.map(lambda x: x * 1.1, params)
    lay, tlay = small_model.layout(SPARSE, HW), small_model.layout(DENSE, HW)

    def loss(params, key):
        value, _ = self_forcing_loss(
            graphdef, params, teacher, context, key, lay, tlay,
            num_chunks=4, teacher_steps=2, latent_hw=HW, channels=C,
        )  # fmt: skip
        return value

    values = _fit(loss, params, 6, 3e-3)
    assert np.isfinite(values).all() and values[-1] < 0.7 * values[0], values


def test_stage_resumes_from_checkpoint(small_model, tmp_path):
    """Interrupted after 2 steps and restarted = one uninterrupted run (weights and log)."""
    vae_config = dataclasses.replace(
        PRESETS["tiny"],
        z_dim=C,
        dim_mult=(1, 2, 2),
        temperal_downsample=(True, True),
        latents_mean=None,
        latents_std=None,
    )
    vae = WanVAE(vae_config, rngs=nnx.Rngs(0))  # 5 x 16 x 16 pixels -> 2 x 4 x 4 latents
    config = StageConfig(
        kind="diffusion_forcing",
        forcing=dataclasses.replace(DENSE, window_frames=2),
        steps=4,
        batch_size=1,
        num_frames=5,
        height=16,
        width=16,
        checkpoint_every=2,
        repeat=3,  # the interruption falls inside an encoded batch's repeats
        optim=OptimConfig(lr=1e-3, warmup=1, decay_steps=4, ema_decay=0.5),
    )
    straight = train_stage(tmp_path / "straight", config, small_model, vae=vae)
    # "Killed" after the checkpoint at step 2 (same schedule), then restarted.
    train_stage(tmp_path / "resumed", dataclasses.replace(config, steps=2), small_model, vae=vae)
    assert [r["step"] for r in read_log(tmp_path / "resumed")] == [1, 2]
    resumed = train_stage(tmp_path / "resumed", config, small_model, vae=vae)
    log = read_log(tmp_path / "resumed")
    assert [r["step"] for r in log] == [1, 2, 3, 4]
    assert [r["loss"] for r in log] == pytest.approx(
        [r["loss"] for r in read_log(tmp_path / "straight")], rel=1e-5
    )
    a, b = nnx.state(straight), nnx.state(resumed)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    # Training moved the weights, and the exported EMA weights load back.
    moved = max(
        float(jnp.abs(x - y).max())
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(nnx.state(small_model)), strict=True)
    )
    assert moved > 0
    loaded = load(tmp_path / "resumed" / WEIGHTS_FILE, small_model.config)
    for x, y in zip(jax.tree.leaves(nnx.state(loaded)), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_stage_conditions_on_the_given_embedder_and_exports_bfloat16(small_model, tmp_path):
    """The captions go through `embedder` (a trained text encoder's path), and a run that is
    not resumable exports its weights in the asked dtype, loadable, without checkpoints."""
    from safetensors import safe_open

    seen = []

    def embedder(captions):
        seen.append(list(captions))
        shape = (len(captions), SMALL.text_len, SMALL.text_dim)
        return np.full(shape, 0.5, np.float32), np.ones(shape[:2], bool)

    config = StageConfig(
        kind="self_forcing",
        forcing=DENSE,
        teacher_forcing=DENSE,
        steps=2,
        batch_size=1,
        rollout_chunks=1,
        teacher_steps=1,
        latent_hw=HW,
        channels=C,
        checkpoint_every=1,
        resumable=False,
        export_dtype="bfloat16",
        optim=OptimConfig(lr=1e-3, warmup=1, ema_decay=0.5),
    )
    out = train_stage(tmp_path, config, small_model, embedder=embedder)
    assert len(seen) == 2 and all(len(c) == 1 and isinstance(c[0], str) for c in seen)
    assert not (tmp_path / "checkpoints").exists()
    with safe_open(str(tmp_path / WEIGHTS_FILE), "np") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118
    loaded = load(tmp_path / WEIGHTS_FILE, SMALL)
    for x, y in zip(
        jax.tree.leaves(nnx.state(loaded)), jax.tree.leaves(nnx.state(out)), strict=True
    ):
        np.testing.assert_array_equal(x, np.asarray(y).astype(jnp.bfloat16).astype(np.float32))


def test_guided_teacher_solves_with_the_cfg_velocity(small_model, context):
    """teacher_guidance: v_u + g (v_c - v_u), the branches as rows of one guided cache, equal
    to each branch through its own unguided cache."""
    from vidax.forcing.model import forward_chunk
    from vidax.forcing.rollout import guided_context, write_clean
    from vidax.forcing.train import teacher_solve

    layout = small_model.layout(DENSE, HW)
    guided_layout = small_model.layout(dataclasses.replace(DENSE, guidance=3.0), HW)
    empty = jnp.zeros_like(context)
    past = jax.random.normal(jax.random.key(3), (1, 1, *HW, C))
    caches = [
        write_clean(small_model, past, ctx, small_model.init_cache(layout, 1), 0, layout)
        for ctx in (context, empty)
    ]
    both = guided_context(context, guided_layout)
    guided_cache = small_model.init_cache(guided_layout, 1)
    guided_cache = write_clean(small_model, past, both, guided_cache, 0, guided_layout)
    x = jax.random.normal(jax.random.key(4), (1, 1, *HW, C))
    t, one = jnp.asarray(800.0), jnp.asarray(1)
    guided = teacher_solve(
        small_model, x, t, both, guided_cache, one, guided_layout, steps=1, shift=3.0
    )
    plain = teacher_solve(small_model, x, t, context, caches[0], one, layout, steps=1, shift=3.0)
    from vidax.sampling import shift_sigmas

    s0 = shift_sigmas(jnp.asarray(0.8), 3.0)
    ts = jnp.full((1,), s0 * 1000.0)
    v_c, _ = forward_chunk(small_model, x, ts, context, caches[0], one, layout)
    v_u, _ = forward_chunk(small_model, x, ts, empty, caches[1], one, layout)
    np.testing.assert_allclose(guided, x - s0 * (v_u + 3.0 * (v_c - v_u)), atol=1e-5)
    np.testing.assert_allclose(plain, x - s0 * v_c, atol=1e-5)
    assert float(jnp.abs(guided - plain).max()) > 1e-3  # the branches differ
    with pytest.raises(ValueError, match="teacher_guidance must be >= 1"):
        StageConfig(kind="self_forcing", forcing=DENSE, teacher_forcing=DENSE, teacher_guidance=0.5)
    with pytest.raises(ValueError, match="cfg_dropout must be in"):
        StageConfig(kind="diffusion_forcing", forcing=DENSE, cfg_dropout=1.0)
    with pytest.raises(ValueError, match="guidance is inference-only"):
        StageConfig(kind="diffusion_forcing", forcing=dataclasses.replace(DENSE, guidance=3.0))


def test_guided_self_forcing_loss_runs_and_differs_from_unguided(small_model, context):
    graphdef, params = nnx.split(small_model)
    lay = small_model.layout(DENSE, HW)
    common = dict(num_chunks=2, teacher_steps=1, latent_hw=HW, channels=C)
    key = jax.random.key(5)
    guided_lay = small_model.layout(dataclasses.replace(DENSE, guidance=4.0), HW)
    plain, _ = self_forcing_loss(graphdef, params, params, context, key, lay, lay, **common)
    guided, _ = self_forcing_loss(graphdef, params, params, context, key, lay, guided_lay, **common)
    assert np.isfinite(float(guided)) and float(guided) != pytest.approx(float(plain))
    with pytest.raises(ValueError, match="student samples unguided"):
        self_forcing_loss(graphdef, params, params, context, key, guided_lay, lay, **common)
